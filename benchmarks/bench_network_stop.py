"""How long Ctrl-C of `meshrl network up` takes to end the network, per phase.

Starts the smallest network (anvil, discovery, orchestrator, origin, one validator, one worker,
the trainer; no relays, no dashboard), waits for a phase, then sends SIGINT to the process group
as a terminal's Ctrl-C does, and times the exit. Reads events.jsonl for each role's `stopped`
record: rc -9 is a role the supervisor had to SIGKILL.

    python benchmarks/bench_network_stop.py [chain|warm|rl|report ...]
    (STOP_BENCH_KEEP=DIR keeps each run under DIR/<phase>)

One JSON line per phase: {"phase", "stop_s", "rc", "killed": [roles], "stopped": {role: rc}}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

TINY = """
name = "stop"
base_port = {port}
relays = 0
dashboard = {dashboard}
after_training = "{after}"
[validators]
count = 1
[workers]
honest = 1
dishonest = 0
[pool]
prompts_per_file = 4
group_size = 4
dead_after = 60
[train]
steps = {steps}
stop_at_accuracy = 2.0
[train.sft]
max_steps = {sft}
[train.rollout]
prompts_per_step = 4
[train.eval]
num_problems = 4
every = 100
[train.run]
checkpoint_every = 1
plot = false
"""


def events(root: Path) -> list[dict[str, Any]]:
    path = root / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []


def _metrics(root: Path, kind: str) -> bool:
    for path in (root / "trainer").rglob("metrics.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip() and json.loads(line).get("kind") == kind:
                return True
    return False


# phase -> (network settings, the moment Ctrl-C is sent)
PHASES: dict[str, tuple[dict[str, Any], Any]] = {
    # anvil up, the contracts being deployed (`meshrl chain devnet`)
    "chain": ({}, lambda root: any(e["event"] == "start" and e["role"] == "anvil"
                                   for e in events(root))),
    # every role started, the trainer in its warm start (SFT that does not end soon)
    "warm": ({"sft": 100000}, lambda root: _metrics(root, "sft")),
    # RL: the worker mid-file, the validator judging, the trainer waiting for files
    "rl": ({"sft": 0}, lambda root: _metrics(root, "step")),
    # the trainer finished (after_training = "stop"): Ctrl-C while the report is written
    "report": ({"sft": 0, "steps": 1, "after": "stop"},
               lambda root: any(e["event"] == "finished" for e in events(root))),
}


def measure(phase: str, tmp: Path, port: int, timeout: float = 900) -> dict[str, Any]:
    over, ready = PHASES[phase]
    cfg = tmp / "net.toml"
    cfg.write_text(TINY.format(port=port, dashboard=str(over.get("dashboard", False)).lower(),
                               after=over.get("after", "serve"), steps=over.get("steps", 1000),
                               sft=over.get("sft", 0)))
    root = tmp / "stop"
    log = (tmp / "up.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "meshrl.cli", "network", "up",
                             str(ROOT / "configs" / "network.toml"), str(cfg), "--dir", str(tmp)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready(root):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{phase}: not reached; see {tmp / 'up.log'}")
            time.sleep(0.1)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(300)
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    stopped = {e["role"]: e["rc"] for e in events(root) if e["event"] == "stopped"}
    return {"phase": phase, "stop_s": round(seconds, 1), "rc": rc, "stopped": stopped,
            "killed": sorted(r for r, c in stopped.items() if c == -signal.SIGKILL)}


def main() -> None:
    phases = sys.argv[1:] or list(PHASES)
    for i, phase in enumerate(phases):
        port = 23000 + (os.getpid() % 100) * 40 + 20 * (i % 2)
        keep = os.environ.get("STOP_BENCH_KEEP")
        if keep:
            (Path(keep) / phase).mkdir(parents=True, exist_ok=True)
            print(json.dumps(measure(phase, Path(keep) / phase, port)), flush=True)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(phase, Path(tmp), port)), flush=True)


if __name__ == "__main__":
    main()
