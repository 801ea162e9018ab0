"""Claims in batches that fit the endpoint they are sent through.

A claim of 64 items (the contract's limit) is ~4.6 KB of JSON and takes ~1.2 M gas to estimate
(up to ~7 M when every item scans accusations). A public RPC bounds both: `meshrl chain
rpc-filter` refuses a body above `max_body` (HTTP 413) and estimates with at most `max_gas`
(an estimate above it fails "out of gas"); hosted RPCs have bounds of their own. So the batch is
sized, not fixed:

- from the endpoint's own word where it gives one: the filter answers `GET <url>/health` with
  its `limits` (`size_bounds`); the batch is the largest whose encoded request stays under
  `max_body` (`fit_batch`: the claim's calldata for n ids, as the transaction and its estimate
  carry it);
- from a refusal for size otherwise (a body or gas bound it did not announce): the batch is
  halved and the same items sent again, down to one item; one item refused for size ends in
  `ClaimTooLarge`, a typed error, never an endless retry. Later batches keep the smaller size.

Every other failure (a revert, a transport error) raises as it would have: the caller decides
whether to wait it out (the worker's claimer does) or to report it (`meshrl chain claim`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meshrl.protocol.errors import ChainError, OutOfGas, RequestTooLarge

if TYPE_CHECKING:
    from meshrl.protocol.chain import Protocol

__all__ = ["MAX_CLAIM", "ClaimTooLarge", "Claimed", "claim_all", "fit_batch",
           "refused_for_size", "size_bounds"]

MAX_CLAIM = 64  # the contract's `MAX_CLAIM`: items of one claim transaction
# what a request carries beside the claim's calldata: the signed transaction's other fields
# (nonce, gas price, gas, to, value, v, r, s, chain id) hex-encoded, and the JSON-RPC envelope;
# an estimate carries the same calldata, with from/to/value as JSON fields
ENVELOPE_BYTES = 512
# what a JSON-RPC endpoint says when a request is too big for it (its body, or its gas cap)


class ClaimTooLarge(ChainError):
    """Even a one-item claim is refused for size by the endpoint: nothing more to split."""


@dataclass
class Claimed:
    """What `claim_all` did: the batches sent (item ids), their transactions, the amount minted
    (base units), refusals for size it split after, and the batch size it ended on."""

    batches: list[list[bytes]] = field(default_factory=list)
    txs: list[str] = field(default_factory=list)
    amount: int = 0
    refusals: int = 0
    batch: int = 0

    @property
    def items(self) -> int:
        return sum(len(b) for b in self.batches)


def size_bounds(rpc_url: str, timeout_s: float = 5.0) -> dict[str, int]:
    """The endpoint's request bounds if it says them (`meshrl chain rpc-filter`'s
    `GET /health` `limits`: max_body, max_gas, max_batch), else {}. Read with a small cap on
    the answer: an endpoint is a stranger's."""
    url = rpc_url.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            body = json.loads(r.read(16 << 10))
    except (OSError, ValueError, urllib.error.URLError):
        return {}
    limits = body.get("limits") if isinstance(body, dict) else None
    if not isinstance(limits, dict):
        return {}
    out = {}
    for k in ("max_body", "max_gas", "max_batch"):
        v = limits.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out[k] = v
    return out


def request_bytes(p: Protocol, n: int) -> int:
    """The size of the larger request a claim of `n` items makes (its estimate, or its signed
    transaction), bytes: calldata hex-encoded plus `ENVELOPE_BYTES`."""
    data = p.contract.functions.claim([b"\xff" * 32] * n)._encode_transaction_data()
    return len(data) + ENVELOPE_BYTES  # `data` is "0x" + hex: the bytes it takes in JSON


def fit_batch(p: Protocol, bounds: dict[str, int], want: int = MAX_CLAIM) -> int:
    """The largest batch up to `want` (and the contract's 64) whose requests fit the endpoint's
    `max_body` (at least 1: a bound that refuses one item is found out by sending it)."""
    n = max(1, min(want, MAX_CLAIM))
    limit = bounds.get("max_body")
    if limit:
        while n > 1 and request_bytes(p, n) > limit:
            n -= 1
    return n


def refused_for_size(e: BaseException) -> bool:
    """Whether the endpoint refused the request for its size: its body (HTTP 413,
    `RequestTooLarge`), or the gas of its estimate (the filter's cap: `OutOfGas`)."""
    return isinstance(e, OutOfGas | RequestTooLarge)


def claim_all(p: Protocol, ids: list[bytes], batch: int = MAX_CLAIM,
              bounds: dict[str, int] | None = None) -> Claimed:
    """Claim `ids` as `p`'s signer, in batches that fit the endpoint (module docstring).
    `bounds`: the endpoint's (None: ask it, `size_bounds`; {}: none known)."""
    if bounds is None:
        url = getattr(p.backend, "url", "")
        bounds = size_bounds(url) if url else {}
    out = Claimed(batch=fit_batch(p, bounds, batch))
    i = 0
    while i < len(ids):
        part = ids[i:i + out.batch]
        try:
            r = p.claim(part)
        except ChainError as e:
            if not refused_for_size(e):
                raise
            out.refusals += 1
            if len(part) == 1:
                raise ClaimTooLarge(f"the endpoint refuses even a one-item claim for its "
                                    f"size: {e}") from e
            out.batch = max(1, len(part) // 2)
            continue
        out.batches.append(part)
        out.txs.append(r.tx_hash)
        out.amount += int(r.event("RewardsClaimed").args["amount"])
        i += len(part)
    return out
