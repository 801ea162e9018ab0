"""The worker's one-line live status on a terminal: state, pool step, policy version, files
delivered, on chain and invalidated, tokens earned, claimable and claimed (the worker claims
them itself with `claim_every_s`; `meshrl.protocol.history.provider_rewards`, this provider's
work only). Redrawn in place; nothing when not a terminal
(the JSON log lines stay the record)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any, TextIO
from typing import Protocol as Proto

from meshrl.log import get_logger
from meshrl.wire.detached import detached

__all__ = ["StatusLine", "status_text"]

log = get_logger("meshrl.worker")
TOKEN = 10**18


class _Node(Proto):
    state: str
    pool_step: int
    files_done: int
    policy: Any


def status_text(node: _Node, rewards: dict[str, Any] | None) -> str:
    version = "-" if node.policy is None else f"v{node.policy.version}"
    sync = getattr(node.policy, "sync", None)
    if sync is not None and sync.sync_error is not None:
        version += f" (sync failing x{sync.sync_failures}: {sync.sync_error[:60]})"
    out = f"{node.state} | step {node.pool_step} | policy {version} | files sent " \
          f"{node.files_done}"
    if rewards is not None:
        works = rewards["works"]
        bad = sum(w["status"] in ("soft_invalidated", "hard_invalidated") for w in works)
        r = rewards["rewards"]
        out += f", on chain {len(works) - bad}, invalidated {bad} | earned " \
               f"{r['earned'] / TOKEN:.4f} tokens, claimable {r['claimable'] / TOKEN:.4f}, " \
               f"claimed {r['claimed'] / TOKEN:.4f}"
    return out


class StatusLine:
    """Redraws one line on `out` when it is a terminal (or `enabled`)."""

    def __init__(self, out: TextIO | None = None, enabled: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.enabled = self.out.isatty() if enabled is None else enabled
        self.last = ""

    def show(self, text: str) -> None:
        self.last = text
        if self.enabled:
            self.out.write("\r\x1b[2K" + text[:200])
            self.out.flush()

    async def run(self, node: _Node, read_rewards: Any, stop: asyncio.Event,
                  every_s: float = 2.0, chain_every_s: float = 20.0) -> None:
        """Redraw every `every_s`; read the chain's view of this provider every
        `chain_every_s` (a failed read keeps the last one)."""
        if not self.enabled:
            return
        rewards: dict[str, Any] | None = None
        last_read = -chain_every_s
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            if read_rewards is not None and loop.time() - last_read >= chain_every_s:
                last_read = loop.time()
                with contextlib.suppress(Exception):
                    rewards = await detached(read_rewards)
            self.show(status_text(node, rewards))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        self.out.write("\n")
