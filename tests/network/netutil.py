"""Shared by the network end-to-end tests: start `meshrl network up` from a TOML text, wait,
read the chain, the ledger and the supervisor's events."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from meshrl.network.keys import dev_account
from meshrl.protocol import Deployment, Protocol
from meshrl.protocol.backend import RpcBackend
from meshrl.protocol.history import pool_disputes
from meshrl.wire import SignedClient
from meshrl.wire.models import LedgerPage

ROOT = Path(__file__).resolve().parents[2]


def wait(check: Any, timeout: float, what: str, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (out := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(every)
    return out


def events(root: Path) -> list[dict[str, Any]]:
    path = root / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def short_network(name: str, *, steps: int, checkpoint_every: int, workers: str,
                  top: str = "", pool: str = "", train: str = "", sft_steps: int = 30,
                  eval_problems: int = 32, prompts_per_step: int = 8,
                  prompts_per_file: int = 4) -> str:
    """The shortened network of the end-to-end tests (TOML over configs/network.toml):
    `sft_steps` SFT steps, then `steps` RL steps of `prompts_per_step` prompts (8) in files of
    `prompts_per_file` (4), serving on after training. `top` adds top-level keys (and tables
    before [workers]), `workers` is the body of [workers], `pool` and `train` add keys to
    [pool] and [train]; `{port}` is left to `run_network`."""
    return f"""
name = "{name}"
base_port = {{port}}
after_training = "serve"
{top}
[workers]
{workers}
[pool]
prompts_per_file = {prompts_per_file}
dead_after = 60
{pool}
[train]
steps = {steps}
stop_at_accuracy = 2.0
{train}
[train.sft]
max_steps = {sft_steps}
[train.rollout]
prompts_per_step = {prompts_per_step}
[train.eval]
num_problems = {eval_problems}
every = 100
[train.run]
checkpoint_every = {checkpoint_every}
plot = false
"""


def run_network(tmp: Path, config: str, name: str, port_offset: int = 0,
                timeout: float = 1500) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """`meshrl network up` with configs/network.toml + `config` (its `{port}` filled in); yields
    (run dir, process) once the trainer finished (the config keeps the network serving), and
    stops it with Ctrl-C."""
    port = 21000 + (os.getpid() % 150) * 40 + port_offset
    cfg = tmp / "net.toml"
    cfg.write_text(config.replace("{port}", str(port)))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = (tmp / "up.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "meshrl.cli", "network", "up",
                             str(ROOT / "configs" / "network.toml"), str(cfg),
                             "--dir", str(tmp)], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    root = tmp / name
    try:
        wait(lambda: any(e["event"] == "finished" for e in events(root)) or
             proc.poll() is not None, timeout, "trainer did not finish", every=0.5)
        assert proc.poll() is None, (tmp / "up.log").read_text()[-3000:]
        yield root, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
        out.close()


def info(root: Path) -> dict[str, Any]:
    return json.loads((root / "network.json").read_text())


def chain(root: Path) -> Protocol:
    net = info(root)
    return Protocol(RpcBackend(net["rpc_url"]), Deployment.load(net["deployment"]),
                    dev_account(0))


def settled_verdicts(chain: Protocol, pool: int) -> list[dict[str, Any]] | None:
    """The pool's verdicts once none is open, else None; called in a wait loop, it cuts short
    what only waits. Each validator votes on what another accused, and a vote is all a verdict
    gets here (no federator ruling); once every open verdict has its vote, the periods left
    (60 s, + 30 s when challenged) change nothing but the clock, so the chain's clock is moved
    past the last of them and the validators settle on their next loop. A verdict still
    without a vote keeps its real period."""
    rows = pool_disputes(chain, pool)
    still = [r for r in rows if r["outcome"] == "open"]
    if not still:
        return rows
    if all(r["uphold"] + r["overturn"] > 0 for r in still):
        ahead = max(int(r["until"]) for r in still) - chain.backend.now()
        if ahead > 0:
            chain.backend.advance_time(ahead + 1)
    return None


def ledger(root: Path) -> dict[str, Any]:
    net = info(root)
    key = Path(net["trainer_key_file"]).read_text().strip()

    async def read() -> dict[str, Any]:
        out, after = {}, 0
        async with SignedClient(net["orchestrator"], key) as c:
            while True:
                page = await c.call("GET", "/ledger", response=LedgerPage,
                                    query={"after": after, "limit": 1000})
                if not page.entries:
                    return out
                # the granted row of each file (a copy submitted by another node has its own)
                out.update({e.sha256: e for e in page.entries if e.granted})
                after = page.next_after
    return asyncio.run(read())


