"""`meshrl network up` on a terminal: where to look, once, then one status line redrawn."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from meshrl.network.status import UpStatus, trainer_progress


class _Popen:
    def __init__(self, rc):
        self.rc = rc

    def poll(self):
        return self.rc


def test_trainer_progress_reads_the_metrics_tail(tmp_path) -> None:
    m = tmp_path / "metrics.jsonl"
    assert trainer_progress(m) == "starting"
    m.write_text("\n".join(json.dumps(r) for r in [
        {"kind": "sft", "step": 3}, {"kind": "eval", "accuracy": 0.25, "step": 3},
        {"kind": "step", "step": 7}]) + "\n")
    assert trainer_progress(m) == "rl step 7, accuracy 0.25"


def test_status_line_is_redrawn_in_place(tmp_path) -> None:
    out = io.StringIO()
    st = UpStatus(tmp_path, out, enabled=True)
    st.header({"dashboard": "http://127.0.0.1:18555", "join": ""})
    procs = {"a": SimpleNamespace(popen=_Popen(None), restarts=1),
             "b": SimpleNamespace(popen=_Popen(1), restarts=0)}
    st.tick(procs, force=True)
    st.tick(procs, force=True)
    st.end()
    text = out.getvalue()
    assert text.startswith("meshrl network: dashboard http://127.0.0.1:18555\n")
    assert "join" not in text  # an empty URL is not printed
    assert text.count("\r\x1b[2K") == 2 and "roles 1/2 up, 1 restarts | trainer starting" in text
    quiet = io.StringIO()
    UpStatus(tmp_path, quiet, enabled=False).tick(procs, force=True)
    assert quiet.getvalue() == ""
