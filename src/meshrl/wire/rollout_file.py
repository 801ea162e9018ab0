"""The rollout file: one Parquet file per batch a node generated for one step.

File-level fields live in the Parquet key-value metadata under `meshrl.rollout` as JSON
(`RolloutHeader`: schema version, node, provider, pool, step, policy version, task and sampling
parameters with the sampling seed, TOPLOC parameters, declared work units). One row per
completion (`COLUMNS`). `read_rollout_file` is strict: wrong schema version, missing or extra
columns, wrong types, nulls, inconsistent lengths, proofs of the wrong size or a corrupt or
truncated file raise `RolloutFileError` naming the problem; nothing is silently coerced.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    "SCHEMA_VERSION",
    "Completion",
    "RolloutFile",
    "RolloutHeader",
    "read_rollout_file",
    "rollout_file_bytes",
    "write_rollout_file",
]

SCHEMA_VERSION = 1
METADATA_KEY = b"meshrl.rollout"
FINISH_REASONS = ("eos", "stop", "length")

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
])


class RolloutHeader(BaseModel):
    """File-level fields (JSON in the Parquet metadata)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    node: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$")
    provider: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$")
    pool_id: int = Field(ge=0)
    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    task: dict[str, Any] = Field(description="task config (the tasks mix entry)")
    sampling: dict[str, Any] = Field(description="sampling parameters as generated with")
    sampling_seed: int = Field(ge=0, lt=2**64)
    prompt_seed: int = Field(ge=0, description="the work order's seed prompts derive from")
    toploc_chunk_size: int = Field(32, ge=1)
    toploc_topk: int = Field(128, ge=1)
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


@dataclass
class RolloutFile:
    header: RolloutHeader
    completions: list[Completion]


def _table(rf: RolloutFile) -> pa.Table:
    _check(rf)
    cols = {name: [getattr(c, name) for c in rf.completions] for name in COLUMNS.names}
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


def read_rollout_file(source: str | Path | bytes) -> RolloutFile:
    """Read and validate a rollout file (a path or its bytes); RolloutFileError if it is off."""
    try:
        reader = pq.ParquetFile(pa.BufferReader(source) if isinstance(source, bytes) else source)
        table = reader.read()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise RolloutFileError(f"not a readable Parquet file: {e}") from None
    header = _header(table.schema.metadata or {})
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
    return rf


def _header(metadata: dict[bytes, bytes]) -> RolloutHeader:
    raw = metadata.get(METADATA_KEY)
    if raw is None:
        raise RolloutFileError("no meshrl.rollout header in the file's metadata")
    try:
        data = json.loads(raw)
    except ValueError:
        raise RolloutFileError("header is not JSON") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        got = data.get("schema_version") if isinstance(data, dict) else None
        raise RolloutFileError(f"schema version {got!r}, this reader reads {SCHEMA_VERSION}")
    try:
        return RolloutHeader.model_validate(data)
    except ValidationError as e:
        raise RolloutFileError(f"bad header: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") \
            from None


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
        if (c.prompt_id, c.sample_index) in seen:
            raise RolloutFileError(f"{where}: duplicate (prompt_id, sample_index)")
        seen.add((c.prompt_id, c.sample_index))
