# over 400 lines: the rollout file format: schema, writer and the bounded, validating reader, which
#  must agree byte for byte
"""The rollout file: one Parquet file per batch a node generated with one policy version.

File-level fields live in the Parquet key-value metadata under `meshrl.rollout` as JSON
(`RolloutHeader`: schema version, node, provider, pool, policy version, the digest of
the pool rules it was generated under, the sampling seed, TOPLOC parameters, declared work
units). One row per episode (`COLUMNS`): its completion is a sequence of segments, each a
model segment (sampled tokens with their log-probs and TOPLOC proofs) or an environment
segment (a tool's output as token ids, the tool's name and exit status, log-probs 0 and no
proofs); the loss mask is the model segments' tokens. A single-turn row is the one model
segment case (`segments`), read by the same code. `read_rollout_file` is strict: wrong schema
version, missing or extra columns, wrong types, nulls, inconsistent lengths, proofs of the
wrong size or a corrupt or truncated file raise `RolloutFileError` naming the problem;
nothing is silently coerced.

A file comes from a worker who may want to crash or stall its reader, so `FileLimits` are
checked before anything is decompressed: the file's size, the footer's declared row count,
row groups, leaf values and uncompressed bytes per column, the header's size and JSON nesting
depth (Python's parser recurses, and a process that raised the recursion limit overflows the
C stack on deeply nested input). String and proof columns are read dictionary-encoded, and
their distinct values' lengths are checked before they are expanded, so a small file of
repeated huge values is refused without allocating them; strings must be valid UTF-8.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshrl.durable import atomic_write
from meshrl.wire.errors import RolloutFileError

__all__ = [
    "COLUMNS",
    "FINISH_REASONS",
    "METADATA_KEY",
    "PROOF_CHUNK_SIZE",
    "PROOF_TOPK",
    "SCHEMA_VERSION",
    "SEGMENT_ENV",
    "SEGMENT_MODEL",
    "Completion",
    "FileLimits",
    "RolloutFile",
    "RolloutHeader",
    "Segment",
    "loss_mask",
    "read_rollout_file",
    "rollout_file_bytes",
    "segments",
    "write_rollout_file",
]

# 2: the header names its rules by digest, not as free-form dicts; 3: rows are episodes of
# model and environment segments (issue #45); 4: no `step` beside `policy_version` (a file's
# step was always its version, issue #44)
SCHEMA_VERSION = 4
METADATA_KEY = b"meshrl.rollout"
# the TOPLOC parameters every worker writes and every validator verifies with
# (`meshrl.toploc.proofs.DEFAULT_CHUNK_SIZE` / `DEFAULT_TOPK`)
PROOF_CHUNK_SIZE = 32
PROOF_TOPK = 128
FINISH_REASONS = ("eos", "stop", "length")
SEGMENT_MODEL, SEGMENT_ENV = 0, 1  # segment kinds

COLUMNS = pa.schema([
    pa.field("prompt_id", pa.string(), nullable=False),
    pa.field("counter", pa.int64(), nullable=False),  # the problem counter prompts derive from
    pa.field("sample_index", pa.int32(), nullable=False),  # position in the prompt's group
    pa.field("seq_id", pa.int64(), nullable=False),  # the sampler's sequence id (noise key)
    pa.field("prompt_tokens", pa.list_(pa.int32()), nullable=False),
    pa.field("completion_tokens", pa.list_(pa.int32()), nullable=False),
    pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("finish_reason", pa.string(), nullable=False),
    pa.field("toploc_proofs", pa.list_(pa.binary()), nullable=False),
    # the episode's segments, in order, tiling completion_tokens (one entry per segment)
    pa.field("segment_kinds", pa.list_(pa.int8()), nullable=False),  # SEGMENT_MODEL / _ENV
    pa.field("segment_lengths", pa.list_(pa.int32()), nullable=False),  # tokens
    pa.field("segment_tools", pa.list_(pa.string()), nullable=False),  # "" on model segments
    pa.field("segment_exits", pa.list_(pa.int32()), nullable=False),  # 0 on model segments
])


class RolloutHeader(BaseModel):
    """File-level fields (JSON in the Parquet metadata)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    node: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$")
    provider: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$")
    pool_id: int = Field(ge=0)
    policy_version: int = Field(ge=0, description="the version of the weights that generated "
                                "the file: its counters are that version's (`meshrl.pool."
                                "assignment`)")
    rules_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the pool's "
                              "published rules the file was generated under "
                              "(`meshrl.pool.PoolRules.digest`)")
    sampling_seed: int = Field(ge=0, lt=2**64)
    toploc_chunk_size: int = Field(PROOF_CHUNK_SIZE, ge=1)
    toploc_topk: int = Field(PROOF_TOPK, ge=1)
    work_units: int = Field(ge=1)

    @property
    def proof_bytes(self) -> int:
        return 2 + 2 * self.toploc_topk


@dataclass
class Completion:
    prompt_id: str
    counter: int
    sample_index: int
    seq_id: int
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    reward: float
    finish_reason: str
    toploc_proofs: list[bytes] = field(default_factory=list)
    # empty: one model segment of every completion token (the single-turn row); the writer
    # stores it explicitly
    segment_kinds: list[int] = field(default_factory=list)
    segment_lengths: list[int] = field(default_factory=list)
    segment_tools: list[str] = field(default_factory=list)
    segment_exits: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Segment:
    """One segment of a row: completion tokens [start, end), of a model turn or a tool's
    output (`tool`, `exit`)."""

    kind: int
    start: int
    end: int
    tool: str = ""
    exit: int = 0

    @property
    def model(self) -> bool:
        return self.kind == SEGMENT_MODEL


def segments(c: Completion) -> list[Segment]:
    """The segments of row `c` (one model segment when the row names none)."""
    if not c.segment_kinds:
        return [Segment(SEGMENT_MODEL, 0, len(c.completion_tokens))]
    out, at = [], 0
    for kind, n, tool, code in zip(c.segment_kinds, c.segment_lengths, c.segment_tools,
                                   c.segment_exits, strict=True):
        out.append(Segment(kind, at, at + n, tool, code))
        at += n
    return out


def loss_mask(c: Completion) -> list[bool]:
    """Per completion token: whether the policy sampled it (losses and ratios use only these)."""
    mask = [False] * len(c.completion_tokens)
    for s in segments(c):
        if s.model:
            mask[s.start:s.end] = [True] * (s.end - s.start)
    return mask


def _explicit(c: Completion) -> Completion:
    if c.segment_kinds:
        return c
    return Completion(**{**c.__dict__, "segment_kinds": [SEGMENT_MODEL],
                         "segment_lengths": [len(c.completion_tokens)],
                         "segment_tools": [""], "segment_exits": [0]})


@dataclass
class RolloutFile:
    header: RolloutHeader
    completions: list[Completion]


def _table(rf: RolloutFile) -> pa.Table:
    _check(rf)
    rows = [_explicit(c) for c in rf.completions]
    cols = {name: [getattr(c, name) for c in rows] for name in COLUMNS.names}
    meta = {METADATA_KEY: rf.header.model_dump_json().encode()}
    return pa.Table.from_pydict(cols, schema=COLUMNS.with_metadata(meta))


def rollout_file_bytes(rf: RolloutFile) -> bytes:
    """The Parquet bytes of `rf` (zstd; validated first, so a writer cannot emit a bad file)."""
    buf = io.BytesIO()
    pq.write_table(_table(rf), buf, compression="zstd")
    return buf.getvalue()


def write_rollout_file(path: str | Path, rf: RolloutFile) -> str:
    """Write `rf` atomically to `path`; returns the file's sha256 (lower hex)."""
    data = rollout_file_bytes(rf)
    atomic_write(path, data, sync=False)  # a worker's outbox makes its own files durable
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileLimits:
    """What a reader accepts at most, checked before decompressing (a pool derives them from
    its rules: `meshrl.pool.file_limits`)."""

    max_bytes: int = 64 << 20  # the file itself
    max_rows: int = 1 << 16
    max_prompt_tokens: int = 1 << 14  # per row
    max_completion_tokens: int = 1 << 14  # per row
    max_header_bytes: int = 64 << 10
    max_json_depth: int = 16
    max_string_bytes: int = 256  # prompt_id, finish_reason, tool names
    max_segments: int = 64  # per row (a pool's: 2 x its tasks' most turns)
    max_row_groups: int = 64
    # the header's TOPLOC parameters size the proof column (2 + 2 x topk bytes a proof, one
    # proof per chunk_size tokens): a header naming a huge top-k or a chunk of one token made
    # a small file of compressible proofs cost +513 MB (issue #41). None: any chunk size and
    # a top-k of at most `max_toploc_topk`; set (`meshrl.pool.file_limits`): exactly that.
    toploc_chunk_size: int | None = None
    toploc_topk: int | None = None
    max_toploc_topk: int = 1024

    def max_leaf_values(self, column: str, rows: int, chunk_size: int) -> int:
        """Most leaf values column `column` may hold in a file of `rows` rows."""
        if column == "prompt_tokens":
            return rows * self.max_prompt_tokens
        if column in ("completion_tokens", "logprobs"):
            return rows * self.max_completion_tokens
        if column == "toploc_proofs":
            return rows * -(-self.max_completion_tokens // chunk_size)
        if column.startswith("segment_"):
            return rows * self.max_segments
        return rows


# columns read dictionary-encoded, so their values' lengths are checked before expansion
_DICTIONARY = {"prompt_id": "prompt_id", "finish_reason": "finish_reason",
               "toploc_proofs": "toploc_proofs.list.element",
               "segment_tools": "segment_tools.list.element"}
_PAGE_SLACK = 1 << 16  # Parquet's own bytes (page headers, levels) of a column
_CHUNK_SLACK = 1 << 12  # and of each more column chunk (an honest 1-row chunk: under 1 kB)
# what a malformed file makes the Parquet reader raise (never a crash of the reading process)
_UNREADABLE = (pa.ArrowException, OSError, ValueError, KeyError, IndexError, TypeError,
               UnicodeDecodeError, OverflowError)


def read_rollout_file(source: str | Path | bytes,
                      limits: FileLimits | None = None) -> RolloutFile:
    """Read and validate a rollout file (a path or its bytes); RolloutFileError if it is off
    or over `limits` (checked before the data is decompressed)."""
    limits = limits or FileLimits()
    size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
    if size > limits.max_bytes:
        raise RolloutFileError(f"file of {size} bytes > limit {limits.max_bytes}")
    try:
        src = pa.BufferReader(source) if isinstance(source, bytes) else source
        footer = pq.ParquetFile(src, thrift_string_size_limit=limits.max_header_bytes + (1 << 16),
                                thrift_container_size_limit=1 << 16, schema_depth_limit=8)
        header = _header(footer.metadata.metadata or {}, limits)
        _check_declared(footer, header, limits)
        _check_pages(footer.metadata, source, size)
        # the columns are ours (checked above): read the string and proof values as
        # dictionaries, bounded before they are expanded
        reader = pq.ParquetFile(src, metadata=footer.metadata,
                                read_dictionary=list(_DICTIONARY.values()))
        # one row group at a time: Arrow cannot read a dictionary-read list column of several
        # row groups in one call, and any row-group layout is a legal file (issue #41: an
        # honest file of one row group per row was refused, hence slashed)
        groups = [reader.read_row_group(i) for i in range(reader.num_row_groups)]
        table = _expand(pa.concat_tables(groups) if groups else reader.read(), header, limits)
    except _UNREADABLE as e:
        if isinstance(e, RolloutFileError):
            raise
        raise RolloutFileError(f"not a readable Parquet file: {type(e).__name__}: {e}") \
            from None
    if table.schema.remove_metadata() != COLUMNS:
        raise RolloutFileError(f"wrong columns or types: expected {COLUMNS}, got {table.schema}")
    for name in COLUMNS.names:
        col = table.column(name)
        inner = pc.list_flatten(col) if pa.types.is_list(col.type) else None
        if col.null_count or (inner is not None and inner.null_count):
            raise RolloutFileError(f"column {name!r} has nulls")
    rows = table.to_pylist()
    rf = RolloutFile(header, [Completion(**row) for row in rows])
    _check(rf)
    if any(not c.segment_kinds for c in rf.completions):  # the writer stores every segment
        raise RolloutFileError("a row names no segments")
    return rf


def _value_bytes(header: RolloutHeader, limits: FileLimits) -> dict[str, int]:
    """The longest value each dictionary-read column may hold (its byte width per value)."""
    return {"prompt_id": limits.max_string_bytes, "finish_reason": limits.max_string_bytes,
            "toploc_proofs": header.proof_bytes, "segment_tools": limits.max_string_bytes}


def _check_declared(reader: pq.ParquetFile, header: RolloutHeader, limits: FileLimits) -> None:
    """The footer's declared sizes, before any page is read."""
    md = reader.metadata
    if md.num_rows > limits.max_rows:
        raise RolloutFileError(f"{md.num_rows} rows > limit {limits.max_rows}")
    if md.num_row_groups > limits.max_row_groups:
        raise RolloutFileError(f"{md.num_row_groups} row groups > limit "
                               f"{limits.max_row_groups}")
    if reader.schema_arrow.names != COLUMNS.names:
        raise RolloutFileError(f"wrong columns or types: expected {COLUMNS.names}, got "
                               f"{reader.schema_arrow.names}")
    if md.num_columns != len(COLUMNS):
        raise RolloutFileError(f"{md.num_columns} leaf columns, the schema has {len(COLUMNS)}")
    groups = [md.row_group(i) for i in range(md.num_row_groups)]
    # a corrupted footer can disagree with itself; pyarrow aborts the process on an index past
    # a row group's own column count, so every count is checked before it is used
    if any(g.num_columns != len(COLUMNS) for g in groups):
        raise RolloutFileError("a row group's column count differs from the schema's")
    if sum(g.num_rows for g in groups) != md.num_rows or any(g.num_rows < 0 for g in groups):
        raise RolloutFileError("row groups' row counts differ from the file's")
    rows, widths = md.num_rows, _value_bytes(header, limits)
    for j, name in enumerate(COLUMNS.names):
        chunks = [g.column(j) for g in groups]
        values = sum(c.num_values for c in chunks)
        most = limits.max_leaf_values(name, rows, header.toploc_chunk_size)
        if values > most:
            raise RolloutFileError(f"column {name!r} declares {values} values > limit {most}")
        budget = most * (widths.get(name, 8) + 4) + _PAGE_SLACK + _CHUNK_SLACK * len(chunks)
        declared = sum(c.total_uncompressed_size for c in chunks)
        if declared > budget:
            raise RolloutFileError(f"column {name!r} declares {declared} uncompressed bytes > "
                                   f"limit {budget}")


_MAX_PAGE_HEADER = 1 << 16  # bytes of one page header (statistics of a 256-byte string fit)
_MAX_PAGES = 1 << 16  # in a file beyond three a column chunk (honest: one or two a chunk)


class _Compact:
    """Just enough of Thrift's compact protocol to read Parquet page headers: fields are
    skipped by type, nothing is allocated by a length the data declares."""

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def byte(self) -> int:
        if self.at >= len(self.buf):
            raise RolloutFileError("a page header runs past its column chunk")
        self.at += 1
        return int(self.buf[self.at - 1])

    def varint(self) -> int:
        out = shift = 0
        for _ in range(10):
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
        raise RolloutFileError("a page header holds a malformed integer")

    def int(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 8:
            raise RolloutFileError("a page header nests too deep")
        if kind in (1, 2):  # booleans: in the field header
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.at += 8
        elif kind == 8:
            n = self.varint()  # read before `at` is: the length's own bytes come first
            self.at += n
        elif kind in (9, 10):
            head = self.byte()
            n = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(n):
                self.skip(3 if head & 0x0F in (1, 2) else head & 0x0F, depth + 1)  # a bool: a byte
        elif kind == 11:
            n = self.varint()
            types = self.byte() if n else 0
            for _ in range(n):
                self.skip(types >> 4, depth + 1)
                self.skip(types & 0x0F, depth + 1)
        elif kind == 12:
            self.struct(depth + 1)
        else:
            raise RolloutFileError(f"a page header holds an unknown Thrift type {kind}")
        if self.at > len(self.buf):
            raise RolloutFileError("a page header runs past its column chunk")

    def struct(self, depth: int = 0, want: frozenset[int] = frozenset(),
               ) -> dict[int, int | dict[int, int]]:
        """The integer fields `want` of a struct (their nested structs' field 1, the values
        count), every other field skipped."""
        out: dict[int, int | dict[int, int]] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return out
            last = last + (head >> 4) if head >> 4 else self.int()
            kind = head & 0x0F
            if last in want and kind in (5, 6):
                out[last] = self.int()
            elif last in want and kind == 12:
                out[last] = {k: v for k, v in self.struct(depth + 1, frozenset({1})).items()
                             if isinstance(v, int)}
            else:
                self.skip(kind, depth)


# PageHeader: 2 uncompressed_page_size, 3 compressed_page_size, 5 data page, 7 dictionary
# page, 8 data page v2 (each of the last three: field 1 = num_values)
_PAGE_FIELDS = frozenset({2, 3, 5, 7, 8})


def _check_pages(md: pq.FileMetaData, source: str | Path | bytes, size: int) -> None:
    """Every page header of every column chunk against the footer (already bounded): the
    bytes a page decompresses to and the values it decodes are what Arrow allocates, and
    they come from the page headers, not the footer. A footer that understated a column
    (declared 1,000 bytes, a dictionary page of 64 MiB) cost 374 MB before the value was
    refused (issue #41): here it is refused before any page is decompressed."""
    pages = 0
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(open(source, "rb")) if not isinstance(source, bytes) else None
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            for j in range(len(COLUMNS)):
                chunk = group.column(j)
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                    start = min(start, chunk.dictionary_page_offset)
                length = chunk.total_compressed_size
                if start < 4 or length < 0 or start + length > size - 8:
                    raise RolloutFileError(f"column {COLUMNS.names[j]!r} of row group {g}: "
                                           "its pages lie outside the file")
                if f is None:
                    raw = memoryview(source)[start:start + length]  # type: ignore[index]
                else:
                    f.seek(start)
                    raw = memoryview(f.read(length))
                pages += _check_chunk_pages(raw, chunk, f"column {COLUMNS.names[j]!r} of row "
                                            f"group {g}")
                if pages > _MAX_PAGES + 3 * len(COLUMNS) * md.num_row_groups:
                    raise RolloutFileError(f"more than {pages - 1} pages")


def _check_chunk_pages(raw: memoryview, chunk: pq.ColumnChunkMetaData, where: str) -> int:
    """The pages of one column chunk: their decompressed bytes within the chunk's declared
    uncompressed size, their values within its declared values. Returns the page count."""
    at = pages = uncompressed = values = 0
    while at < len(raw):
        reader = _Compact(raw[at:at + _MAX_PAGE_HEADER])
        fields = reader.struct(want=_PAGE_FIELDS)
        body, inner = fields.get(3), fields.get(2)
        if not isinstance(body, int) or not isinstance(inner, int) or body < 0 or inner < 0:
            raise RolloutFileError(f"{where}: a page header without its sizes")
        uncompressed += inner  # (the footer's count adds the headers: a writer's choice)
        for kind in (5, 8):
            sub = fields.get(kind)
            values += sub.get(1, 0) if isinstance(sub, dict) else 0
        at += reader.at + body
        pages += 1
    if at != len(raw):
        raise RolloutFileError(f"{where}: its pages run past the column chunk")
    if uncompressed > chunk.total_uncompressed_size:
        raise RolloutFileError(f"{where}: its pages decompress to {uncompressed} bytes, the "
                               f"footer declares {chunk.total_uncompressed_size}")
    if values > chunk.num_values:
        raise RolloutFileError(f"{where}: its pages hold {values} values, the footer declares "
                               f"{chunk.num_values}")
    return pages


def _expand(table: pa.Table, header: RolloutHeader, limits: FileLimits) -> pa.Table:
    """Dictionary columns back to their plain types, once their distinct values are bounded;
    every string valid UTF-8; list lengths per row bounded."""
    for name, limit in _value_bytes(header, limits).items():
        col = table.column(name)
        want = COLUMNS.field(name).type
        want_values = want.value_type if pa.types.is_list(want) else want
        for chunk in col.chunks:
            values = chunk.values if pa.types.is_list(chunk.type) else chunk
            # the stored type itself, never one the cast below would coerce (binary or
            # large_string read as a string: issue #41)
            if (not pa.types.is_dictionary(values.type) or values.type.value_type != want_values
                    or pa.types.is_list(chunk.type) != pa.types.is_list(want)):
                raise RolloutFileError(f"wrong columns or types: column {name!r} is "
                                       f"{chunk.type}")
            longest = pc.max(pc.binary_length(values.dictionary)).as_py() or 0
            if longest > limit:
                raise RolloutFileError(f"column {name!r} holds a value of {longest} bytes > "
                                       f"limit {limit}")
        table = table.set_column(table.schema.get_field_index(name), COLUMNS.field(name),
                                 pc.cast(col, COLUMNS.field(name).type))
    table.validate(full=True)  # ArrowInvalid on invalid UTF-8
    for name, limit in (("prompt_tokens", limits.max_prompt_tokens),
                        ("completion_tokens", limits.max_completion_tokens),
                        *((n, limits.max_segments) for n in COLUMNS.names
                          if n.startswith("segment_"))):
        longest = pc.max(pc.list_value_length(table.column(name))).as_py() or 0
        if longest > limit:
            raise RolloutFileError(f"a row of {name!r} has {longest} tokens > limit {limit}")
    return table


def _json_depth(raw: bytes) -> int:
    """Deepest nesting of [ and { in JSON text (outside strings), without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == 0x5C:  # backslash
                escaped = True
            elif ch == 0x22:  # quote
                in_string = False
        elif ch == 0x22:
            in_string = True
        elif ch in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif ch in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _header(metadata: dict[bytes, bytes], limits: FileLimits) -> RolloutHeader:
    raw = metadata.get(METADATA_KEY)
    if raw is None:
        raise RolloutFileError("no meshrl.rollout header in the file's metadata")
    if len(raw) > limits.max_header_bytes:
        raise RolloutFileError(f"header of {len(raw)} bytes > limit {limits.max_header_bytes}")
    if _json_depth(raw) > limits.max_json_depth:
        raise RolloutFileError(f"header nests deeper than {limits.max_json_depth} levels")
    try:
        data = json.loads(raw)
    except ValueError:
        raise RolloutFileError("header is not JSON") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        got = data.get("schema_version") if isinstance(data, dict) else None
        raise RolloutFileError(f"schema version {got!r}, this reader reads {SCHEMA_VERSION}")
    try:
        header = RolloutHeader.model_validate(data)
    except ValidationError as e:
        raise RolloutFileError(f"bad header: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") \
            from None
    _check_proof_params(header, limits)
    return header


def _check_proof_params(header: RolloutHeader, limits: FileLimits) -> None:
    """The header's TOPLOC parameters, which size the proof column, before any column is read."""
    for name, want in (("toploc_chunk_size", limits.toploc_chunk_size),
                       ("toploc_topk", limits.toploc_topk)):
        got = getattr(header, name)
        if want is not None and got != want:
            raise RolloutFileError(f"header's {name} {got}: this pool's proofs use {want}")
    if header.toploc_topk > limits.max_toploc_topk:
        raise RolloutFileError(f"header's toploc_topk {header.toploc_topk} > limit "
                               f"{limits.max_toploc_topk}")


def _check(rf: RolloutFile) -> None:
    """Consistency of the rows with each other and with the header."""
    if not rf.completions:
        raise RolloutFileError("a rollout file holds at least one completion")
    size = rf.header.proof_bytes
    seen: set[tuple[str, int]] = set()
    for i, c in enumerate(rf.completions):
        where = f"completion {i}"
        if len(c.logprobs) != len(c.completion_tokens):
            raise RolloutFileError(f"{where}: {len(c.logprobs)} logprobs for "
                                   f"{len(c.completion_tokens)} completion tokens")
        if not c.prompt_tokens or not c.completion_tokens:
            raise RolloutFileError(f"{where}: empty prompt or completion")
        if c.finish_reason not in FINISH_REASONS:
            raise RolloutFileError(f"{where}: finish reason {c.finish_reason!r} not in "
                                   f"{FINISH_REASONS}")
        if any(len(p) != size for p in c.toploc_proofs):
            raise RolloutFileError(f"{where}: TOPLOC proofs must be {size} bytes each")
        why = _segment_error(c, rf.header.toploc_chunk_size)
        if why is not None:
            raise RolloutFileError(f"{where}: {why}")
        if (c.prompt_id, c.sample_index) in seen:
            raise RolloutFileError(f"{where}: duplicate (prompt_id, sample_index)")
        seen.add((c.prompt_id, c.sample_index))


def _segment_error(c: Completion, chunk_size: int) -> str | None:
    """Why row `c`'s segments are malformed (None: they are not): equally many entries per
    segment column, kinds known, lengths >= 1 tiling the completion, a model segment first,
    no two environment segments in a row, tool names and exit statuses on environment
    segments only, environment log-probs exactly 0, one proof per chunk of each model
    segment (an episode's proofs are per model segment; a single-turn row's count is the
    replay's to judge)."""
    n = len(c.segment_kinds)
    if not n:
        return None
    if not len(c.segment_lengths) == len(c.segment_tools) == len(c.segment_exits) == n:
        return "segment columns of different lengths"
    if any(k not in (SEGMENT_MODEL, SEGMENT_ENV) for k in c.segment_kinds):
        return f"unknown segment kind in {sorted(set(c.segment_kinds))}"
    if any(x < 1 for x in c.segment_lengths) or sum(c.segment_lengths) != len(
            c.completion_tokens):
        return "segment lengths do not tile the completion"
    if c.segment_kinds[0] != SEGMENT_MODEL:
        return "the first segment is not the model's"
    if any(a == b == SEGMENT_ENV for a, b in itertools.pairwise(c.segment_kinds)):
        return "two environment segments in a row"
    for s in segments(c):
        if s.model and (s.tool or s.exit):
            return "a model segment names a tool or exit status"
        if not s.model and (not s.tool or any(c.logprobs[s.start:s.end])):
            return "an environment segment without its tool, or with non-zero log-probs"
    if n > 1:
        want = sum(-(-(s.end - s.start) // chunk_size) for s in segments(c) if s.model)
        if len(c.toploc_proofs) != want:
            return f"{len(c.toploc_proofs)} TOPLOC proofs, the model segments need {want}"
    return None
