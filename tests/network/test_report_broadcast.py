"""The report's broadcast table says each version's kind and bytes, read from the role logs."""

import json

from meshrl.network.report import _broadcast


def _log(path, *lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_each_version_row_names_its_kind_bytes_and_who_rebuilt_it_from_a_delta(tmp_path):
    _log(tmp_path / "logs" / "trainer.log",
         {"ts": 10.0, "msg": "version stored", "version": 1, "payload": "full",
          "bytes": 1000, "fetch_bytes": 1000},
         {"ts": 10.5, "msg": "published", "version": 1},
         {"ts": 20.0, "msg": "version stored", "version": 2, "payload": "delta",
          "bytes": 1600, "fetch_bytes": 600},
         {"ts": 20.5, "msg": "published", "version": 2})
    _log(tmp_path / "logs" / "w0.log",
         {"ts": 11.0, "msg": "fetched", "version": 1, "payload": "full"},
         {"ts": 21.5, "msg": "fetched", "version": 2, "payload": "delta"})
    _log(tmp_path / "logs" / "w1.log",
         {"ts": 23.0, "msg": "fetched", "version": 2, "payload": "full"})
    rows = _broadcast(tmp_path, ["w0", "w1"])
    assert [(r["version"], r["kind"], r["bytes"], r["fetch_bytes"], r["workers_loaded"],
             r["workers_by_delta"], r["max_s"]) for r in rows] == [
        (1, "full", 1000, 1000, 1, 0, 0.5), (2, "delta", 1600, 600, 2, 1, 2.5)]
