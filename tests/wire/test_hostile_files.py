"""Rollout files a dishonest worker can upload, against the reader every role uses: each bomb
is refused with a `RolloutFileError` naming the limit, before its data is decompressed, within
a stated bound of time and memory; nothing crashes the process that reads it.

The memory of each read is measured in a fresh process (`_read_in_child`: Arrow's own pool peak
and the process's peak RSS, about 120 MB of which is the interpreter with pyarrow and pydantic
loaded), so one bomb's allocations cannot hide behind another's.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meshrl.pool import PoolRules, file_limits
from meshrl.toploc.proofs import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK
from meshrl.wire import RolloutFileError
from meshrl.wire.isolated import (
    IsolationLimits,
    iter_rollout_files_isolated,
    read_rollout_file_isolated,
    read_rollout_files_isolated,
)
from meshrl.wire.rollout_file import (
    COLUMNS,
    METADATA_KEY,
    PROOF_CHUNK_SIZE,
    PROOF_TOPK,
    FileLimits,
    RolloutFile,
    read_rollout_file,
    rollout_file_bytes,
)

from .helpers import sample_rollout
from .hostile import (
    columns,
    deep_header,
    footer_understates,
    header_bytes,
    invalid_utf8,
    million_rows,
    nested_header,
    proof_bomb,
    string_bomb,
    write_parquet,
)

# every bomb below is refused in under this much time and Arrow memory (measured: well under)
MAX_SECONDS = 2.0
MAX_ARROW_BYTES = 16 << 20


def _read_in_child(path: Path, recursion_limit: int = 0, limits: FileLimits | None = None,
                   ) -> dict:
    """Read `path` in a fresh interpreter (by `limits`, default `FileLimits()`); its outcome,
    seconds and peak memory as a dict."""
    code = textwrap.dedent(f"""
        import json, sys, time
        if {recursion_limit}:
            sys.setrecursionlimit({recursion_limit})  # as py-evm does on import
        import pyarrow as pa
        from meshrl.wire import RolloutFileError, read_rollout_file
        from meshrl.wire.rollout_file import FileLimits
        t0 = time.perf_counter()
        try:
            read_rollout_file({str(path)!r}, {limits or FileLimits()!r})
            out = {{"error": None}}
        except RolloutFileError as e:
            out = {{"error": str(e)}}
        out["seconds"] = time.perf_counter() - t0
        out["arrow_peak"] = pa.default_memory_pool().max_memory()
        # VmHWM: this process's peak RSS (ru_maxrss would carry the parent's across exec)
        status = open("/proc/self/status").read().split("VmHWM:")[1]
        out["rss_kb"] = int(status.split()[0])
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _refused(tmp_path: Path, data: bytes, match: str, **child: Any) -> dict:
    path = tmp_path / "bomb.parquet"
    path.write_bytes(data)
    out = _read_in_child(path, **child)
    assert out["error"] is not None and match in out["error"], out
    assert out["seconds"] < MAX_SECONDS, out
    assert out["arrow_peak"] < MAX_ARROW_BYTES, out
    return out


def test_an_honest_file_still_reads_back():
    rf = sample_rollout()
    data = rollout_file_bytes(rf)
    back = read_rollout_file(data)
    assert back.header == rf.header and rollout_file_bytes(back) == data


@pytest.mark.slow  # builds a bomb of many MB: not in test-fast
def test_a_deeply_nested_header_never_reaches_the_json_parser(tmp_path):
    """100,000 nested lists (0.2 MB) used to overflow the C stack of a process that had raised
    the recursion limit (SIGSEGV, the same crash at every restart)."""
    rf = sample_rollout()
    # the footer holding it is over the reader's size limit: refused while it is parsed
    out = _refused(tmp_path, deep_header(rf), "Exceeded size limit", recursion_limit=1_000_000)
    assert out["rss_kb"] < 250_000
    # within the size limit, the depth limit refuses it without recursing
    _refused(tmp_path, nested_header(rf), "nests deeper than 16 levels",
             recursion_limit=1_000_000)


def test_invalid_utf8_in_a_string_column_is_a_file_error():
    with pytest.raises(RolloutFileError, match="UTF8"):
        read_rollout_file(invalid_utf8(sample_rollout()))


@pytest.mark.slow  # builds a bomb of many MB: not in test-fast
def test_a_small_file_of_one_huge_repeated_string_is_refused_unexpanded(tmp_path):
    """A 45 kB file that decompresses to 256 MiB (one padded string column) used to cost 356 MB
    to read: its dictionary value's length is checked before anything is expanded."""
    data = string_bomb(sample_rollout(n_prompts=2, group=2))
    assert len(data) < 64 << 10
    out = _refused(tmp_path, data, "finish_reason")
    assert out["rss_kb"] < 250_000


@pytest.mark.slow  # builds a bomb of many MB: not in test-fast
def test_a_million_rows_are_refused_from_the_footer(tmp_path):
    data = million_rows(sample_rollout(n_prompts=1, group=1))
    assert len(data) < 8 << 20
    limits = FileLimits(max_rows=1024)
    path = tmp_path / "rows.parquet"
    path.write_bytes(data)
    with pytest.raises(RolloutFileError, match="1000000 rows > limit 1024"):
        read_rollout_file(path, limits)
    _refused(tmp_path, data, "rows > limit")  # the default limit: 65,536 rows


def test_declared_sizes_and_row_lengths_are_bounded():
    rf = sample_rollout(tokens=9)
    data = rollout_file_bytes(rf)
    with pytest.raises(RolloutFileError, match="> limit 100"):
        read_rollout_file(data, FileLimits(max_bytes=100))
    with pytest.raises(RolloutFileError, match="'completion_tokens' declares 54 values > "
                       "limit 48"):
        read_rollout_file(data, FileLimits(max_completion_tokens=8))
    with pytest.raises(RolloutFileError, match="'prompt_tokens' declares 30 values > limit 24"):
        read_rollout_file(data, FileLimits(max_prompt_tokens=4))
    # a single row past the per-row limit, with the file's total inside it
    long = sample_rollout(n_prompts=1, group=2, tokens=8)
    long.completions[0].completion_tokens = long.completions[0].completion_tokens[:4]
    long.completions[0].logprobs = long.completions[0].logprobs[:4]
    long.completions[1].completion_tokens += [1] * 4
    long.completions[1].logprobs += [-1.0] * 4
    with pytest.raises(RolloutFileError, match="a row of 'completion_tokens' has 12 tokens > "
                       "limit 8"):
        read_rollout_file(rollout_file_bytes(long), FileLimits(max_completion_tokens=8))


def test_a_proof_column_of_oversized_values_is_refused_before_expansion(tmp_path):
    data = proof_bomb(sample_rollout(topk=4))
    assert len(data) < 64 << 10
    _refused(tmp_path, data, "toploc_proofs")


def test_a_column_of_the_wrong_type_is_refused():
    rf = sample_rollout()
    cols = columns(rf)
    schema = COLUMNS.set(COLUMNS.get_field_index("finish_reason"),
                         pa.field("finish_reason", pa.int64(), nullable=False))
    table = pa.Table.from_pydict({**cols, "finish_reason": [1] * len(cols["finish_reason"])},
                                 schema=schema.with_metadata({METADATA_KEY: header_bytes(rf)}))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    with pytest.raises(RolloutFileError, match="wrong columns or types"):
        read_rollout_file(sink.getvalue().to_pybytes())


@pytest.mark.parametrize(("column", "typ"), [
    ("prompt_id", pa.binary()), ("prompt_id", pa.large_binary()), ("prompt_id", pa.int64()),
    ("finish_reason", pa.binary()), ("toploc_proofs", pa.list_(pa.string()))])
def test_a_string_column_of_another_stored_type_is_not_coerced(column, typ):
    """Issue #41: a prompt_id stored as binary (no UTF-8 annotation) was silently cast to a
    string. (large_string is the same Parquet type as string, read back as one: not a cast.)"""
    rf = sample_rollout()
    cols = columns(rf)
    if column == "toploc_proofs" and pa.types.is_string(typ.value_type):
        cols[column] = [[p.hex() for p in row] for row in cols[column]]
    elif column != "toploc_proofs" and (pa.types.is_binary(typ)
                                        or pa.types.is_large_binary(typ)):
        cols[column] = [v.encode() for v in cols[column]]
    elif pa.types.is_integer(typ):  # a prompt_id a cast would turn into "0", "1", ...
        cols[column] = list(range(len(cols[column])))
    schema = COLUMNS.set(COLUMNS.get_field_index(column), pa.field(column, typ, nullable=False))
    table = pa.Table.from_pydict(cols, schema=schema.with_metadata({METADATA_KEY:
                                                                    header_bytes(rf)}))
    with pytest.raises(RolloutFileError, match="wrong columns or types"):
        read_rollout_file(write_parquet(cols, b"", table=table))


def test_flipped_footer_bytes_never_escape_the_isolated_reader():
    """Single-byte corruptions of an honest file's footer, read as a validator reads uploads
    (`read_rollout_file_isolated`): each either still reads as a valid file or is a
    `RolloutFileError`. In process, some of them abort the interpreter inside pyarrow's
    metadata accessors (byte 2162 of this file, flipped by 0x01, raised an uncaught C++
    ParquetException, SIGABRT); isolated, that is a refusal like any other."""
    data = rollout_file_bytes(sample_rollout())
    footer = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer
    positions = sorted({2162, *random.Random(0).sample(range(start, len(data) - 8), 60)})
    outcomes = {"valid": 0, "refused": 0, "died": 0}
    for pos in positions:
        for mask in (0x01, 0xFF):
            bad = bytearray(data)
            bad[pos] ^= mask
            try:
                read_rollout_file_isolated(bytes(bad))
                outcomes["valid"] += 1
            except RolloutFileError as e:
                outcomes["died" if "reader died" in str(e) else "refused"] += 1
    assert sum(outcomes.values()) == 2 * len(positions)
    assert outcomes["refused"] + outcomes["died"] > len(positions)  # most are caught


def test_the_isolated_reader_reads_honest_files_and_bounds_time_and_memory():
    rf = sample_rollout()
    data = rollout_file_bytes(rf)
    assert read_rollout_file_isolated(data).header == rf.header
    # a child that cannot get the memory a read needs is a refusal, not the caller's death
    with pytest.raises(RolloutFileError):
        read_rollout_file_isolated(data, isolation=IsolationLimits(memory_bytes=1 << 16))
    with pytest.raises(RolloutFileError, match="took longer than 0 s"):
        read_rollout_file_isolated(data, isolation=IsolationLimits(seconds=0.0))
    with pytest.raises(RolloutFileError, match="> limit 100"):
        read_rollout_file_isolated(data, FileLimits(max_bytes=100))


def test_files_read_together_cost_only_themselves():
    """Several files in one child (`read_rollout_files_isolated`, the trainer's step): honest
    files read, a malformed one is its refusal, and one that kills the shared child (byte
    2162 of the footer flipped, a SIGABRT in pyarrow) sends every file to a child of its own,
    so the honest ones beside it still read and only it is refused."""
    rf = sample_rollout()
    data = rollout_file_bytes(rf)
    killer = bytearray(data)
    killer[2162] ^= 0x01
    with pytest.raises(RolloutFileError, match="reader died"):
        read_rollout_file_isolated(bytes(killer))
    got = read_rollout_files_isolated([data, data[:-40], data])
    assert [type(g).__name__ for g in got] == ["RolloutFile", "RolloutFileError", "RolloutFile"]
    assert got[0].header == rf.header and got[2].header == rf.header
    got = read_rollout_files_isolated([data, bytes(killer), data[:-40], data])
    assert isinstance(got[0], RolloutFile) and isinstance(got[3], RolloutFile)
    assert isinstance(got[1], RolloutFileError) and "reader died" in str(got[1])
    assert isinstance(got[2], RolloutFileError) and "reader died" not in str(got[2])
    assert read_rollout_files_isolated([]) == []
    (alone,) = read_rollout_files_isolated([data], FileLimits(max_bytes=100))
    assert isinstance(alone, RolloutFileError) and "> limit 100" in str(alone)


def test_the_callers_main_module_is_imported_once_not_once_a_child(tmp_path):
    """Each isolated child runs the caller's `-m` main module again (`multiprocessing`'s
    spawn preparation). Its imports are preloaded in the fork server, so a module it imports
    (here one that leaves a mark when imported) is imported once there, not once per read, and
    reads still return the file."""
    rf = sample_rollout()
    (tmp_path / "f.parquet").write_bytes(rollout_file_bytes(rf))
    marks = tmp_path / "marks"
    (tmp_path / "heavy_dep.py").write_text(
        f"import os\nwith open({str(marks)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n")
    (tmp_path / "mainmod.py").write_text(textwrap.dedent(f"""
        import heavy_dep  # noqa: F401
        from meshrl.wire.isolated import _main_module, read_rollout_files_isolated

        if __name__ == "__main__":
            assert _main_module() == ["mainmod"], _main_module()
            data = open({str(tmp_path / "f.parquet")!r}, "rb").read()
            for _ in range(3):
                got = read_rollout_files_isolated([data, data])
                assert all(g.header.node == {rf.header.node!r} for g in got), got
            print("ok")
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "mainmod"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    pids = marks.read_text().split()
    # the caller's own import and the fork server's preload: never one per child
    assert len(pids) == 2 and len(set(pids)) == 2, pids


def _pool_limits() -> FileLimits:
    """The limits a validator of a 16 x 8-row pool of 8-token completions reads files by."""
    return file_limits(PoolRules(pool_id=1, prompts_per_file=16, group_size=8,
                                 sampling={"max_new_tokens": 8}))


def _pool_file() -> RolloutFile:
    """An honest-shaped file of that pool: one 258-byte proof a row (chunk 32, top-k 128)."""
    rf = sample_rollout(n_prompts=16, group=8, tokens=8, topk=PROOF_TOPK)
    rf.header = rf.header.model_copy(update={"toploc_chunk_size": PROOF_CHUNK_SIZE})
    for c in rf.completions:
        c.toploc_proofs = c.toploc_proofs[:1]
    return rf


def test_a_header_top_k_proof_bomb_is_refused_from_the_header(tmp_path):
    """Issue #41: a header naming top-k 131,072 and chunks of one token made the proof column's
    bounds 256 KiB a proof, 8 a row: a 12 kB file of compressible proofs cost the reader +520
    MB (630 MB peak RSS) and was read. The pool's limits name the proofs' chunk size and top-k
    (those a validator verifies with): any other header is refused before a column is read."""
    limits = _pool_limits()
    assert (limits.toploc_chunk_size, limits.toploc_topk) == (DEFAULT_CHUNK_SIZE, DEFAULT_TOPK)
    rf = _pool_file()
    assert read_rollout_file(rollout_file_bytes(rf), limits).header == rf.header
    h = rf.header.model_copy(update={"toploc_topk": 1 << 17, "toploc_chunk_size": 1})
    cols = columns(rf)
    cols["toploc_proofs"] = [[bytes([i]) + b"\0" * (h.proof_bytes - 1) for i in range(8)]
                             for _ in cols["toploc_proofs"]]
    data = write_parquet(cols, h.model_dump_json().encode())
    assert len(data) < 64 << 10
    out = _refused(tmp_path, data, "header's toploc_chunk_size 1: this pool's proofs use 32",
                   limits=limits)
    assert out["rss_kb"] < 250_000, out
    # the same top-k with the pool's chunk size; and any reader bounds the top-k
    h = h.model_copy(update={"toploc_chunk_size": PROOF_CHUNK_SIZE})
    bomb = write_parquet(cols, h.model_dump_json().encode())
    _refused(tmp_path, bomb, "header's toploc_topk 131072: this pool's proofs use 128",
             limits=limits)
    _refused(tmp_path, bomb, "header's toploc_topk 131072 > limit 1024")


_BATCH_CHILD = """
import json, os, resource, sys
from multiprocessing import Pipe
from meshrl.wire.isolated import _child_many
from meshrl.wire.rollout_file import FileLimits
data = open(sys.argv[1], "rb").read()
n = int(sys.argv[2])
parent, child = Pipe(duplex=False)
pid = os.fork()
if pid == 0:
    parent.close()
    _child_many(child, [data] * n, FileLimits(), 4 << 30)
    os._exit(0)
child.close()
got = 0
while True:  # whatever the child sends, as it sends it (one message, or one a file)
    try:
        msg = parent.recv()
    except EOFError:
        break
    got += len(msg) if isinstance(msg, list) else 1
os.waitpid(pid, 0)
print(json.dumps({"files": got,
                  "child_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _batch_child_rss(path: Path, n: int) -> int:
    done = subprocess.run([sys.executable, "-c", _BATCH_CHILD, str(path), str(n)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["files"] == n, out
    return int(out["child_rss_kb"])


def test_a_batch_read_in_one_child_costs_one_files_memory_not_the_batchs(tmp_path):
    """Issue #41: the shared child of `read_rollout_files_isolated` held every parsed file of
    a batch and sent them at once (8 files: 8x one file's memory under one cap). It sends each
    file as it is read and keeps none, so its peak (ru_maxrss of the reading child, measured
    +66 MB for one file of 128 rows of 16,000-token prompts, about that for 8) grows by less
    than two files' worth for a batch of 8; the caller gets them one at a time
    (`iter_rollout_files_isolated`)."""
    rf = _pool_file()
    for c in rf.completions:
        c.prompt_tokens = [5] * 16_000
    path = tmp_path / "big.parquet"
    path.write_bytes(rollout_file_bytes(rf))
    base, one, eight = (_batch_child_rss(path, n) for n in (0, 1, 8))
    per_file = one - base
    assert per_file > 30_000, (base, one, eight)  # the file does cost memory to hold
    assert eight - one < per_file, (base, one, eight)
    it = iter_rollout_files_isolated([path.read_bytes(), b"PAR1", path.read_bytes()])
    first = next(it)
    assert isinstance(first, RolloutFile) and len(first.completions) == 128
    assert [type(x).__name__ for x in it] == ["RolloutFileError", "RolloutFile"]


@pytest.mark.parametrize("row_group_size", [1, 3, 64])
def test_any_row_group_layout_of_an_honest_file_reads(row_group_size):
    """Issue #41 (low): an honest file written one row group per row (128 > 64 row groups) was
    refused, and a refused file is slashed; a file of several row groups (43) could not be
    read at all (Arrow reads no dictionary list column of several row groups in one call). Any
    layout of the pool's rows is a legal file: it reads back as the same file."""
    rf = _pool_file()
    data = write_parquet(columns(rf), header_bytes(rf), row_group_size=row_group_size)
    back = read_rollout_file(data, _pool_limits())
    assert rollout_file_bytes(back) == rollout_file_bytes(rf)
    # the count is still bounded (the pool's limits: one row group a row at most)
    assert _pool_limits().max_row_groups == 128
    with pytest.raises(RolloutFileError, match="row groups > limit 1"):
        read_rollout_file(data, FileLimits(max_rows=128, max_row_groups=1))


def test_a_footer_that_understates_a_column_is_refused_before_its_pages_are_read(tmp_path):
    """Issue #41: the footer's sizes were checked, but Arrow allocates what the page headers
    say. A footer declaring 1,000 bytes for a finish_reason column whose dictionary page holds
    one 64 MiB value cost 374 MB peak RSS before the value's length was refused; every page
    header is now read against the footer first. (Honest files of any layout still read:
    `test_any_row_group_layout_of_an_honest_file_reads`.)"""
    data = string_bomb(sample_rollout(n_prompts=2, group=2))  # one value of 64 MiB
    lie = footer_understates(data, COLUMNS.get_field_index("finish_reason"))
    declared = pq.ParquetFile(pa.BufferReader(lie)).metadata.row_group(0).column(8)
    assert declared.total_uncompressed_size == 1000 and len(lie) < 16 << 10
    out = _refused(tmp_path, lie, "column 'finish_reason' of row group 0: its pages "
                   "decompress to 67108")
    assert out["rss_kb"] < 150_000, out
    # a footer understating the values its pages hold
    rf = sample_rollout()
    honest = rollout_file_bytes(rf)
    j = COLUMNS.get_field_index("prompt_tokens")
    assert read_rollout_file(honest).header == rf.header
    with pytest.raises(RolloutFileError, match="'prompt_tokens' of row group 0: its pages"):
        read_rollout_file(footer_understates(honest, j, claim=10))
