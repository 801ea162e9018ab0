"""The validator's memory of leaves past their batch's window (issue 46): bounded against a
flood (oldest evicted), persisted across restarts, a torn last line skipped."""

from __future__ import annotations

from meshrl.validator.state import LeafMemory


def _entry(i: int) -> dict:
    return {"batch_id": f"{i:064x}", "index": i % 4, "block": i, "until": 1000 + i}


def test_memory_is_capped_oldest_first_and_survives_a_restart(tmp_path):
    path = tmp_path / "leaf_memory.jsonl"
    m = LeafMemory(path, cap=5)
    for i in range(8):  # a flood of 8 leaves into a memory of 5
        m.add({f"w{i}": _entry(i)})
    assert len(m) == 5 and "w2" not in m and m.get("w3") == _entry(3)
    m.add({"w3": _entry(99)})  # a file seen again in a later batch keeps its first entry
    assert m.get("w3") == _entry(3)
    # the file is compacted when twice the cap: never more than 2 x cap lines on disk
    assert len(path.read_text().splitlines()) <= 10
    with open(path, "a") as f:
        f.write('["w9", {"batch_')  # a crash mid-append
    again = LeafMemory(path, cap=5)
    assert list(again.entries) == list(m.entries) and again.get("w7") == _entry(7)
    again.add({"w10": _entry(10)})
    assert "w3" not in again and LeafMemory(path, 5).get("w10") == _entry(10)


def test_a_memory_of_zero_remembers_nothing(tmp_path):
    m = LeafMemory(tmp_path / "m.jsonl", cap=0)
    m.add({"w0": _entry(0)})
    assert "w0" not in m and not (tmp_path / "m.jsonl").exists()
