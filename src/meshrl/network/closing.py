"""Closing an open-ended pool (`on_stop = "drain"`, configs/pool.toml) without taking its
members' rewards with it.

A reward is claimable `lock_period` after its work was submitted, from the chain only. The demo
stops every role, anvil included, at once: rewards still locked then sit on a chain that no
longer answers. Draining instead:

1. stops taking work: the trainer, the validators, the orchestrator, discovery and shardcast
   stop (a member's work orders then go unanswered; its worker waits, and claims on);
2. keeps anvil (mining an empty block every few seconds, `mine`: a quiet chain's clock stands
   still), its public RPC (`public_host`), the dashboard and the pool's own workers (each
   claims its provider's rewards every `workers.claim_every_s`) answering until every reward
   earned in the pool is claimed, or the last one to unlock has been claimable for
   `claim_window_s` (chain time), whichever comes first;
3. says so: when it starts (`closing`: the time the chain closes, the unclaimed tokens and
   providers, what a member must do), and when it ends (`closed`: what was left unclaimed,
   by provider), on stdout and in `events.jsonl`.

A second Ctrl-C (or SIGTERM) stops at once and says plainly what is left: the chain's state is
kept in `chain/anvil-state.json`, so the same `network up` resumes the chain and members claim
then. An item still under an open verdict at the stop is claimable only once the verdict is
settled (`meshrl chain settle`, which anyone may call after its dispute period): it is listed
as unclaimed.

The chain is read through `meshrl chain works` (a process: the network package does not
import the chain client), as the report does.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Left", "drain", "mine", "rewards_left"]

UNCLAIMED = ("submitted", "accused")  # an item that may still be paid


@dataclass
class Left:
    """Rewards earned in the pool and not yet claimed, as the chain says at `now`."""

    now: int  # chain time (unix seconds)
    items: int = 0
    tokens: float = 0.0
    last_unlock: int = 0  # chain time the last of them unlocks (0: none left)
    by_provider: dict[str, float] = field(default_factory=dict)  # provider -> tokens

    def close_at(self, window_s: float, since: int) -> int:
        """When the chain may close: the claim window after the last unlock, or after `since`
        (the drain's start) for rewards unlocked before it."""
        return int(max(self.last_unlock, since) + window_s) if self.items else self.now

    def summary(self) -> dict[str, Any]:
        return {"unclaimed_items": self.items, "unclaimed_tokens": round(self.tokens, 6),
                "providers": {k: round(v, 6) for k, v in sorted(self.by_provider.items())},
                "last_unlock": self.last_unlock}


def rewards_left(history: dict[str, Any] | None) -> Left | None:
    """What `meshrl chain works` (`pool_history`) says is still to be claimed; None when the
    chain did not answer."""
    if not history:
        return None
    # the chain's time is its latest block's: a quiet chain's stands still, while anvil
    # stamps the next block (a claim) with the wall clock
    out = Left(now=max(int(history["now"]), int(time.time())))
    for w in history["works"]:
        if w["status"] not in UNCLAIMED or w.get("wiped"):
            continue
        out.items += 1
        tokens = int(w["reward"]) / 10**18
        out.tokens += tokens
        out.last_unlock = max(out.last_unlock, int(w["unlock_at"]))
        key = str(w["provider"]).lower()
        out.by_provider[key] = out.by_provider.get(key, 0.0) + tokens
    return out


def mine(rpc_url: str) -> bool:
    """Ask the local chain (anvil, on loopback) for an empty block. A contract reads the time
    of the latest block: on a chain where nobody sends a transaction any more that time stands
    still, and a locked reward would never read as claimable. The draining network mines one
    every few seconds, so every reward unlocks on time."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "evm_mine", "params": []}).encode()
    req = urllib.request.Request(rpc_url, body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def drain(read: Callable[[], dict[str, Any] | None], window_s: float, max_s: float,
          stopped: Callable[[], bool], say: Callable[[str, dict[str, Any]], None],
          tick: Callable[[], None], every_s: float = 10.0) -> str:
    """Keep the chain up (the caller's roles run on) until nothing is left to claim, or the
    last reward has been claimable `window_s`, or `max_s` passed, or `stopped()`. `read`:
    the chain's pool history; `say(what, fields)`: print and record; `tick()`: one supervision
    round. Returns how it ended: "claimed", "window over", "time limit" or "interrupted"."""
    t0 = time.monotonic()
    left = rewards_left(read())
    since = left.now if left else int(time.time())
    close_at = left.close_at(window_s, since) if left else 0
    say("closing", {**(left.summary() if left else {"chain": "did not answer"}),
                    "close_at": close_at, "claim_window_s": window_s,
                    "members": "keep your worker running (it claims what unlocks), or run "
                    "`meshrl chain claim` once your rewards unlock, before close_at (unix "
                    "time); after that this chain no longer answers"})
    how, last_read = "time limit", time.monotonic()
    while time.monotonic() - t0 < max_s:
        if stopped():
            how = "interrupted"
            break
        if left is not None and (left.items == 0 or left.now >= close_at):
            how = "claimed" if left.items == 0 else "window over"
            break
        tick()
        time.sleep(0.5)
        if time.monotonic() - last_read >= every_s:
            last_read = time.monotonic()
            left = rewards_left(read()) or left
            if left is not None:  # a later unlock (a file submitted at the stop) moves it
                close_at = max(close_at, left.close_at(window_s, since))
    end = rewards_left(read()) or left
    fields = {**(end.summary() if end else {}), "how": how}
    if end is not None and end.items:
        fields["members"] = ("rewards left unclaimed stay on this chain: its state is kept "
                             "(chain/anvil-state.json) and the same `meshrl network up` "
                             "resumes it; claim then with `meshrl chain claim`")
    say("closed", fields)
    return how
