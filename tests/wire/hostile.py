"""Builders of the rollout files a dishonest worker can upload, shared by the reader's tests
(tests/wire/test_hostile_files.py) and the real-process suite against a validator and the
trainer's reader (tests/validator/test_hostile_process.py).

Each builder starts from a real file (`RolloutFile`, usually an honest one, so its header names
the uploading node) and returns Parquet bytes written without the writer's validation, as a
hostile worker would write them.
"""

from __future__ import annotations

import json
import random
import struct

import pyarrow as pa
import pyarrow.parquet as pq

from meshrl.wire.rollout_file import COLUMNS, METADATA_KEY, RolloutFile

__all__ = ["columns", "deep_header", "footer_understates", "header_bytes", "invalid_utf8",
           "million_rows", "nested_header", "proof_bomb", "random_framed", "string_bomb",
           "write_parquet"]


def columns(rf: RolloutFile) -> dict[str, list]:
    """The file's rows, column by column (lists a builder may change at will), each row's
    segments stored as the writer stores them (a single-turn row: one model segment)."""
    one = {"segment_kinds": lambda c: [0], "segment_lengths": lambda c: [len(c.completion_tokens)],
           "segment_tools": lambda c: [""], "segment_exits": lambda c: [0]}
    return {n: [getattr(c, n) if n not in one or c.segment_kinds else one[n](c)
                for c in rf.completions] for n in COLUMNS.names}


def header_bytes(rf: RolloutFile) -> bytes:
    return rf.header.model_dump_json().encode()


def write_parquet(cols: dict[str, list], header: bytes, row_group_size: int | None = None,
                  table: pa.Table | None = None) -> bytes:
    """Parquet bytes of `cols` (or of `table`) under the meshrl header `header`, unvalidated."""
    if table is None:
        table = pa.Table.from_pydict(cols, schema=COLUMNS.with_metadata({METADATA_KEY: header}))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_size)
    return sink.getvalue().to_pybytes()


def _with_task(rf: RolloutFile, value: bytes) -> bytes:
    body = json.dumps(json.loads(header_bytes(rf))).encode()
    return body[:-1] + b', "task": ' + value + b"}"


def deep_header(rf: RolloutFile, depth: int = 100_000) -> bytes:
    """A header holding a JSON value nested `depth` levels (100,000 lists: 0.2 MB), which used
    to overflow the C stack of a process that had raised its recursion limit (SIGSEGV)."""
    return write_parquet(columns(rf), _with_task(rf, b"[" * depth + b"]" * depth))


def nested_header(rf: RolloutFile, depth: int = 200) -> bytes:
    """The same shape small enough for the footer's size limit: the depth limit refuses it."""
    return write_parquet(columns(rf), _with_task(rf, b"[" * depth + b"]" * depth))


def invalid_utf8(rf: RolloutFile) -> bytes:
    """Row 0's `prompt_id` holds the bytes ff fe (not UTF-8) in a string column."""
    cols = columns(rf)
    bad = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(
        (0).to_bytes(4, "little") + (2).to_bytes(4, "little")), pa.py_buffer(b"\xff\xfe")])
    table = pa.Table.from_pydict(cols, schema=COLUMNS.with_metadata({METADATA_KEY:
                                                                     header_bytes(rf)}))
    ids = pa.concat_arrays([bad, pa.array(cols["prompt_id"][1:], pa.string())])
    table = table.set_column(0, COLUMNS.field("prompt_id"), ids)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def string_bomb(rf: RolloutFile, total: int = 256 << 20) -> bytes:
    """A small file whose `finish_reason` column decompresses to `total` bytes: every row's
    value is one padded string (dictionary-encoded and compressed to a few tens of kB)."""
    cols = columns(rf)
    n = len(cols["finish_reason"])
    cols["finish_reason"] = ["length" + " " * (total // n)] * n
    return write_parquet(cols, header_bytes(rf))


def proof_bomb(rf: RolloutFile, value: int = 32 << 20) -> bytes:
    """Every proof a run of `value` zero bytes (compressed to almost nothing)."""
    cols = columns(rf)
    cols["toploc_proofs"] = [[b"\x00" * value] * len(p) for p in cols["toploc_proofs"]]
    return write_parquet(cols, header_bytes(rf))


def million_rows(rf: RolloutFile, rows: int = 1_000_000) -> bytes:
    """`rows` copies of the file's first row (a 2 MiB file), distinct sample indices."""
    one = {k: v[:1] for k, v in columns(rf).items()}
    cols = {k: v * rows for k, v in one.items()}
    cols["sample_index"] = list(range(rows))
    return write_parquet(cols, header_bytes(rf), row_group_size=1 << 20)


def random_framed(size: int = 64 << 10, seed: int = 0) -> bytes:
    """Random bytes framed as Parquet (PAR1 first and last, a footer length that fits): what
    the orchestrator's cheap framing check lets through to the validator's reader."""
    body = random.Random(seed).randbytes(size - 12)
    return b"PAR1" + body + struct.pack("<I", size // 4) + b"PAR1"


def _varint(n: int, length: int = 0) -> bytes:
    """`n` as a Thrift varint, padded to `length` bytes with empty continuation bytes (a
    non-canonical encoding every compact-protocol reader accepts)."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            break
    while len(out) < length:
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def footer_understates(data: bytes, column: int, claim: int = 1000) -> bytes:
    """`data` with the footer's `total_uncompressed_size` of column `column` (row group 0)
    rewritten to `claim`, in place (same length), its pages unchanged: a footer that lies."""
    real = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0).column(column)
    old = _varint(real.total_uncompressed_size << 1)  # zigzag of a positive i64
    start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.index(old, start)
    assert data.count(old, start) == 1, "the declared size is not unique in the footer"
    return data[:at] + _varint(claim << 1, len(old)) + data[at + len(old):]
