"""`meshrl network up` on a terminal: where to look (the dashboard, the join URL, the logs)
printed once, then one status line redrawn in place (elapsed, roles up and restarts, the
trainer's phase, step and last held-out accuracy) instead of the supervisor's JSON lines, which
stay in `events.jsonl` and the roles' `logs/`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["UpStatus", "trainer_progress"]


def _last_lines(path: Path, size: int = 8192) -> list[str]:
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - size))
        return f.read().decode(errors="replace").splitlines()[1:] or []


def trainer_progress(metrics: Path) -> str:
    """'sft step 12', 'rl step 40, accuracy 0.72', or 'starting' from the trainer's metrics."""
    phase, step, acc = "starting", None, None
    for line in _last_lines(metrics):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        kind = r.get("kind")
        if kind in ("sft", "step"):
            phase, step = ("sft" if kind == "sft" else "rl"), r.get("step")
        elif kind == "eval" and r.get("accuracy") is not None:
            acc = r["accuracy"]
    out = phase if step is None else f"{phase} step {step}"
    return out if acc is None else f"{out}, accuracy {acc:.2f}"


class UpStatus:
    """The terminal view of a running network (nothing when `out` is not a terminal)."""

    def __init__(self, root: Path, out: TextIO | None = None, enabled: bool | None = None,
                 every_s: float = 2.0) -> None:
        self.root, self.out = root, out or sys.stdout
        self.enabled = self.out.isatty() if enabled is None else enabled
        self.every_s, self._last, self.t0 = every_s, 0.0, time.monotonic()
        self.text = ""

    def header(self, urls: dict[str, str]) -> None:
        """Where to look, once (printed even without a terminal)."""
        for name, url in urls.items():
            if url:
                print(f"meshrl network: {name} {url}", file=self.out, flush=True)

    def tick(self, procs: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.every_s):
            return
        self._last = now
        up = sum(1 for p in procs.values() if p.popen is not None and p.popen.poll() is None)
        restarts = sum(p.restarts for p in procs.values())
        mins, secs = divmod(int(now - self.t0), 60)
        self.text = (f"{mins:d}:{secs:02d} | roles {up}/{len(procs)} up, {restarts} restarts | "
                     f"trainer {trainer_progress(self.root / 'trainer' / 'metrics.jsonl')}")
        self.out.write("\r\x1b[2K" + self.text[:200])
        self.out.flush()

    def end(self) -> None:
        if self.enabled and self.text:
            self.out.write("\n")
            self.out.flush()
