import hashlib
import json

import pytest

from meshrl.worker.outbox import Outbox, OutboxEntry, OutboxError, is_stale


def _entry(data: bytes, version: int = 3, created: float = 0.0) -> OutboxEntry:
    return OutboxEntry(hashlib.sha256(data).hexdigest(), len(data), counter=0,
                       policy_version=version, work_units=10, created=created)


def test_phases_survive_a_reopen(tmp_path):
    box = Outbox(tmp_path)
    a = box.put(b"first", _entry(b"first", created=1.0))
    b = box.put(b"second", _entry(b"second", created=2.0))
    box.mark(a, "uploaded")
    box.mark(b, "submitted", "0xabc")
    again = Outbox(tmp_path).pending()
    assert [(e.sha256, e.phase, e.tx_hash) for e in again] == [
        (a.sha256, "uploaded", ""), (b.sha256, "submitted", "0xabc")]
    assert box.data_path(a.sha256).read_bytes() == b"first"


def test_a_record_written_with_a_step_reads_back(tmp_path):
    """An outbox record from before issue #44 names a `step` beside its version (always equal):
    a restarted worker reads it (the step dropped) and goes on with the file."""
    box = Outbox(tmp_path)
    a = box.put(b"old", _entry(b"old", version=5))
    rec = tmp_path / f"{a.sha256}.json"
    rec.write_text(json.dumps({**json.loads(rec.read_text()), "step": 5}))
    [e] = Outbox(tmp_path).pending()
    assert (e.sha256, e.policy_version, e.counter, e.phase) == (a.sha256, 5, 0, "written")


def test_finish_and_drop_keep_a_record(tmp_path):
    box = Outbox(tmp_path)
    a, b = box.put(b"a", _entry(b"a")), box.put(b"b", _entry(b"b", version=0))
    box.finish(a)
    box.finish(a)  # a crash inside finish replays it: still one record
    box.drop(b, "stale")
    assert box.pending() == [] and len(box) == 0
    assert [r["sha256"] for r in box.sent()] == [a.sha256]
    assert box.dropped()[0]["reason"] == "stale"
    assert (tmp_path / "dropped" / f"{b.sha256}.parquet").read_bytes() == b"b"


def test_crash_leftovers_are_cleaned(tmp_path):
    box = Outbox(tmp_path)
    (tmp_path / ".x.parquet.1.tmp").write_bytes(b"half")  # a write cut by a crash
    (tmp_path / ("ff" * 32 + ".parquet")).write_bytes(b"bytes without a record")
    box = Outbox(tmp_path)
    assert box.pending() == []
    assert list(tmp_path.glob("*.parquet")) == [] and list(tmp_path.glob(".*.tmp")) == []
    with open(tmp_path / "sent.jsonl", "w") as f:  # a cut last line is ignored
        f.write(json.dumps({"sha256": "aa"}) + "\n" + '{"sha256": "b')
    assert box.sent() == [{"sha256": "aa"}]


def test_unreadable_records_are_errors(tmp_path):
    box = Outbox(tmp_path)
    (tmp_path / ("aa" * 32 + ".json")).write_text("{broken")
    with pytest.raises(OutboxError, match="unreadable"):
        box.pending()


def test_stale_rule():
    assert not is_stale(3, 5, 2) and is_stale(2, 5, 2) and not is_stale(5, 5, 0)
    assert is_stale(4, 5, 0)
