"""The rollout file: round trip, and a strict reader for corrupt, truncated and wrong files."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from meshrl.wire.errors import RolloutFileError
from meshrl.wire.models import LedgerEntry, SlotRequest
from meshrl.wire.rollout_file import (
    COLUMNS,
    METADATA_KEY,
    SCHEMA_VERSION,
    RolloutHeader,
    read_rollout_file,
    rollout_file_bytes,
    write_rollout_file,
)

from .helpers import sample_rollout


def test_round_trip(tmp_path: Path) -> None:
    rf = sample_rollout()
    sha = write_rollout_file(tmp_path / "r.parquet", rf)
    data = (tmp_path / "r.parquet").read_bytes()
    assert sha == hashlib.sha256(data).hexdigest()
    back = read_rollout_file(tmp_path / "r.parquet")
    assert back.header == rf.header
    assert len(back.completions) == 6
    for a, b in zip(back.completions, rf.completions, strict=True):
        assert a.completion_tokens == b.completion_tokens
        assert a.toploc_proofs == b.toploc_proofs
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)  # stored as float32
    assert read_rollout_file(data).header.sampling_seed == 77


def _table_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _good_table() -> pa.Table:
    return pq.read_table(pa.BufferReader(rollout_file_bytes(sample_rollout())))


def test_truncated_and_corrupt_files() -> None:
    data = rollout_file_bytes(sample_rollout())
    for bad in (data[: len(data) // 2], data[:-9], b"", b"PAR1" + b"\x00" * 100):
        with pytest.raises(RolloutFileError, match="not a readable Parquet"):
            read_rollout_file(bad)
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF
    with pytest.raises(RolloutFileError):
        read_rollout_file(bytes(flipped))


def test_wrong_schema_version_and_missing_header() -> None:
    t = _good_table()
    meta = json.loads(t.schema.metadata[METADATA_KEY])
    meta["schema_version"] = 99
    with pytest.raises(RolloutFileError, match="schema version 99"):
        read_rollout_file(_table_bytes(t.replace_schema_metadata({METADATA_KEY: json.dumps(meta)})))
    with pytest.raises(RolloutFileError, match=r"no meshrl\.rollout header"):
        read_rollout_file(_table_bytes(t.replace_schema_metadata({})))
    meta["schema_version"] = SCHEMA_VERSION
    meta["work_units"] = "many"
    with pytest.raises(RolloutFileError, match=r"bad header.*work_units"):
        read_rollout_file(_table_bytes(t.replace_schema_metadata({METADATA_KEY: json.dumps(meta)})))


def test_a_file_carries_its_policy_version_and_no_step_beside_it() -> None:
    """Issue #44: a file's step was always its policy version, so the header holds the version
    alone. A file of the schema that carried both is refused by its version; one that says it
    is of this schema and still carries a step is a bad header; a slot request or a ledger
    entry with a step is refused the same way (no field to disagree with the version)."""
    t = _good_table()
    meta = json.loads(t.schema.metadata[METADATA_KEY])
    assert "step" not in meta and meta["policy_version"] == 4
    old = {**meta, "schema_version": 3, "step": 4}
    with pytest.raises(RolloutFileError, match="schema version 3"):
        read_rollout_file(_table_bytes(t.replace_schema_metadata({METADATA_KEY: json.dumps(old)})))
    stepped = {**meta, "step": 4}
    with pytest.raises(RolloutFileError, match=r"bad header.*step"):
        read_rollout_file(_table_bytes(t.replace_schema_metadata(
            {METADATA_KEY: json.dumps(stepped)})))
    slot = {"sha256": "ab" * 32, "size": 10, "policy_version": 4, "work_units": 3, "counter": 0}
    SlotRequest.model_validate(slot)
    with pytest.raises(ValidationError, match="step"):
        SlotRequest.model_validate({**slot, "step": 4})
    assert "step" not in LedgerEntry.model_fields and "step" not in RolloutHeader.model_fields


def test_wrong_types_and_missing_columns() -> None:
    t = _good_table()
    i = COLUMNS.get_field_index("reward")
    wrong = t.set_column(i, "reward", pa.array([str(x) for x in t["reward"].to_pylist()]))
    with pytest.raises(RolloutFileError, match="wrong columns or types"):
        read_rollout_file(_table_bytes(wrong))
    with pytest.raises(RolloutFileError, match="wrong columns or types"):
        read_rollout_file(_table_bytes(t.drop_columns(["logprobs"])))


def test_inconsistent_lengths_and_bad_values() -> None:
    t = _good_table()
    lp = t["logprobs"].to_pylist()
    lp[2] = lp[2][:-1]
    i = COLUMNS.get_field_index("logprobs")
    bad = t.set_column(i, COLUMNS.field(i), pa.array(lp, pa.list_(pa.float32())))
    with pytest.raises(RolloutFileError, match="completion 2: 8 logprobs for 9"):
        read_rollout_file(_table_bytes(bad))
    proofs = t["toploc_proofs"].to_pylist()
    proofs[0][0] = proofs[0][0][:-1]
    i = COLUMNS.get_field_index("toploc_proofs")
    bad = t.set_column(i, COLUMNS.field(i), pa.array(proofs, pa.list_(pa.binary())))
    with pytest.raises(RolloutFileError, match="proofs must be 10 bytes"):
        read_rollout_file(_table_bytes(bad))
    fr = t["finish_reason"].to_pylist()
    fr[1] = "gave up"
    i = COLUMNS.get_field_index("finish_reason")
    bad = t.set_column(i, COLUMNS.field(i), pa.array(fr, pa.string()))
    with pytest.raises(RolloutFileError, match="finish reason 'gave up'"):
        read_rollout_file(_table_bytes(bad))


def test_nulls_are_refused() -> None:
    t = _good_table()
    i = COLUMNS.get_field_index("completion_tokens")
    vals = t["completion_tokens"].to_pylist()
    vals[0] = None
    loose = pa.field("completion_tokens", pa.list_(pa.int32()))  # nullable, as a forger writes it
    bad = t.set_column(i, loose, pa.array(vals, pa.list_(pa.int32())))
    with pytest.raises(RolloutFileError):
        read_rollout_file(_table_bytes(bad))


def test_writer_refuses_inconsistent_files() -> None:
    rf = sample_rollout()
    rf.completions[0].logprobs.append(0.0)
    with pytest.raises(RolloutFileError, match="completion 0"):
        rollout_file_bytes(rf)
    rf = sample_rollout()
    rf.completions[1].sample_index = 0
    with pytest.raises(RolloutFileError, match="duplicate"):
        rollout_file_bytes(rf)


def test_null_inside_a_list_is_refused() -> None:
    t = _good_table()
    i = COLUMNS.get_field_index("prompt_tokens")
    vals = t["prompt_tokens"].to_pylist()
    vals[3][1] = None
    bad = t.set_column(i, COLUMNS.field(i), pa.array(vals, pa.list_(pa.int32())))
    with pytest.raises(RolloutFileError, match="'prompt_tokens' has nulls"):
        read_rollout_file(_table_bytes(bad))


def _episode(rf):
    """Row 0 of `rf` as an episode: model 4 tokens, a calculator's output of 2, model 3."""
    c = rf.completions[0]
    c.segment_kinds, c.segment_lengths = [0, 1, 0], [4, 2, 3]
    c.segment_tools, c.segment_exits = ["", "calc", ""], [0, 0, 0]
    c.logprobs[4:6] = [0.0, 0.0]
    c.toploc_proofs = c.toploc_proofs[:1] * 2  # one chunk (4 tokens) per model segment
    return rf


def test_episode_rows_round_trip_with_their_loss_mask() -> None:
    """An episode's segments read back as written, and a single-turn row reads as the one
    model segment case; the loss mask is the model segments' tokens."""
    from meshrl.wire.rollout_file import loss_mask, segments

    rf = _episode(sample_rollout())
    back = read_rollout_file(rollout_file_bytes(rf))
    ep, single = back.completions[0], back.completions[1]
    assert [(s.kind, s.start, s.end, s.tool) for s in segments(ep)] == [
        (0, 0, 4, ""), (1, 4, 6, "calc"), (0, 6, 9, "")]
    assert loss_mask(ep) == [True] * 4 + [False] * 2 + [True] * 3
    assert single.segment_kinds == [0] and single.segment_lengths == [9]
    assert loss_mask(single) == [True] * 9


@pytest.mark.parametrize("edit, why", [
    (lambda c: setattr(c, "segment_kinds", [1, 0, 0]), "first segment is not the model"),
    (lambda c: setattr(c, "segment_lengths", [4, 2, 2]), "do not tile"),
    (lambda c: setattr(c, "segment_lengths", [4, 0, 5]), "do not tile"),
    (lambda c: setattr(c, "segment_kinds", [0, 2, 0]), "unknown segment kind"),
    (lambda c: c.logprobs.__setitem__(4, -0.5), "non-zero log-probs"),
    (lambda c: setattr(c, "segment_tools", ["", "", ""]), "without its tool"),
    (lambda c: setattr(c, "segment_exits", [3, 0, 0]), "model segment names"),
    (lambda c: setattr(c, "toploc_proofs", c.toploc_proofs[:1]), "TOPLOC proofs"),
    (lambda c: setattr(c, "segment_tools", ["", "calc"]), "different lengths"),
])
def test_malformed_episodes_are_refused(edit, why) -> None:
    """Environment tokens passed off as the model's log-probs, segments that do not tile the
    completion, an episode opening with a tool's output: each a named refusal, on the
    writer's side and on the reader's."""
    rf = _episode(sample_rollout())
    edit(rf.completions[0])
    with pytest.raises(RolloutFileError, match=why):
        rollout_file_bytes(rf)
    good = _table_bytes_of(_episode(sample_rollout()))
    names = ("segment_kinds", "segment_lengths", "segment_tools", "segment_exits", "logprobs",
             "toploc_proofs")
    t = pq.read_table(pa.BufferReader(good))
    c = rf.completions[0]
    for name in names:
        vals = t[name].to_pylist()
        vals[0] = getattr(c, name)
        i = COLUMNS.get_field_index(name)
        t = t.set_column(i, COLUMNS.field(i), pa.array(vals, COLUMNS.field(i).type))
    with pytest.raises(RolloutFileError, match=why):
        read_rollout_file(_table_bytes(t))


def _table_bytes_of(rf) -> bytes:
    return rollout_file_bytes(rf)


def test_segment_columns_are_bounded_before_they_are_read() -> None:
    """A row of more segments than the pool allows, or a tool name longer than a string may
    be, is refused by the limits (the footer's declared values, the dictionary's lengths)."""
    from meshrl.wire.rollout_file import FileLimits

    data = rollout_file_bytes(_episode(sample_rollout()))
    with pytest.raises(RolloutFileError, match="segment_"):
        read_rollout_file(data, FileLimits(max_segments=2))
    rf = _episode(sample_rollout())
    rf.completions[0].segment_tools[1] = "c" * 300
    with pytest.raises(RolloutFileError, match="'segment_tools' holds a value of 300 bytes"):
        read_rollout_file(rollout_file_bytes(rf))
