"""Contract events read with an incremental block cursor: each poll asks only for the blocks
after the last one it saw (in bounded ranges), never rescanning from block 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import eth_abi
from eth_utils import event_abi_to_log_topic, to_checksum_address

from meshrl.protocol.backend import Backend

__all__ = ["Event", "EventCursor", "EventDecoder"]


@dataclass(frozen=True)
class Event:
    """One decoded log: event name, arguments, and where it happened."""

    name: str
    args: dict[str, Any]
    address: str
    block: int
    tx_hash: str
    log_index: int
    block_hash: str = ""  # 0x-hex, as the log names it ("" where a node leaves it out)


class _Layout:
    """One event's arguments: which are topics, which are data, and their ABI types; `ok` is
    False where an argument is an array, a struct or an indexed dynamic value (web3 decodes
    those)."""

    def __init__(self, item: dict[str, Any]) -> None:
        self.name = str(item["name"])
        ins = item.get("inputs", [])
        self.names = [i["name"] for i in ins]
        self.indexed = [bool(i.get("indexed")) for i in ins]
        self.types = [i["type"] for i in ins]
        self.ok = not item.get("anonymous") and all(
            "[" not in t and t != "tuple" and not (ix and t in ("bytes", "string"))
            for t, ix in zip(self.types, self.indexed, strict=True))

    def args(self, topics: list[bytes], data: bytes) -> dict[str, Any] | None:
        """The arguments of a log, as web3's `process_log` gives them (addresses
        checksummed); None where the log does not fit this event's layout."""
        topical = [t for t, ix in zip(self.types, self.indexed, strict=True) if ix]
        if len(topics) != len(topical) + 1:
            return None
        try:
            top = iter([eth_abi.decode([t], bytes(raw))[0]
                        for t, raw in zip(topical, topics[1:], strict=True)])
            rest = iter(eth_abi.decode([t for t, ix in zip(self.types, self.indexed,
                                                           strict=True) if not ix], data))
        except Exception:  # a log another ABI wrote under this topic: web3 says why
            return None
        out = {}
        for name, t, ix in zip(self.names, self.types, self.indexed, strict=True):
            v = next(top) if ix else next(rest)
            out[name] = to_checksum_address(v) if t == "address" else v
        return out


class EventDecoder:
    """Decodes the logs of a set of contracts from their ABIs (unknown logs are skipped). The
    arguments are decoded here with eth-abi (web3's `process_log` took 1.1 ms of CPU a log:
    a report read of 850 events, a second); web3 decodes the rest."""

    def __init__(self, backend: Backend, contracts: list[Any]):
        self._by_key: dict[tuple[str, bytes], tuple[Any, _Layout]] = {}
        for c in contracts:
            for item in c.abi:
                if item.get("type") == "event":
                    topic = event_abi_to_log_topic(item)
                    self._by_key[(c.address.lower(), topic)] = (
                        getattr(c.events, item["name"])(), _Layout(item))

    def decode(self, log: Any) -> Event | None:
        if not log["topics"]:
            return None
        found = self._by_key.get((log["address"].lower(), bytes(log["topics"][0])))
        if found is None:
            return None
        ev, lay = found
        args = lay.args([bytes(t) for t in log["topics"]], bytes(log["data"])) if lay.ok \
            else None
        if args is None:
            d = ev.process_log(log)
            name, args = d["event"], dict(d["args"])
        else:
            name = lay.name
        return Event(
            name,
            args,
            log["address"],
            int(log["blockNumber"]),
            "0x" + bytes(log["transactionHash"]).hex(),
            int(log["logIndex"]),
            "0x" + bytes(log["blockHash"]).hex() if log.get("blockHash") else "",
        )

    def decode_receipt(self, receipt: Any) -> list[Event]:
        return [e for e in (self.decode(log) for log in receipt["logs"]) if e is not None]


class EventCursor:
    """Yields new events of some contracts, remembering the next block to read."""

    def __init__(
        self,
        backend: Backend,
        decoder: EventDecoder,
        addresses: list[str],
        from_block: int = 0,
        max_range: int = 2000,
        topics: list[str | None] | None = None,
    ):
        self.backend = backend
        self.decoder = decoder
        self.addresses = addresses
        self.next_block = from_block
        self.max_range = max_range
        self.topics = topics  # a log filter the node applies (e.g. one event of one node)
        self.queries = 0  # get_logs calls made, to check that polls stay incremental

    def poll(self) -> list[Event]:
        """Every event from `next_block` up to the latest block; advances the cursor once
        every range is read (a failed read leaves it where it was: nothing read is lost)."""
        latest = self.backend.block_number()
        events: list[Event] = []
        start = self.next_block
        while start <= latest:
            to_block = min(latest, start + self.max_range - 1)
            query: dict[str, Any] = {"address": self.addresses, "fromBlock": start,
                                     "toBlock": to_block}
            if self.topics is not None:
                query["topics"] = self.topics
            logs = self.backend.w3.eth.get_logs(query)  # type: ignore[arg-type]
            self.queries += 1
            events.extend(e for e in map(self.decoder.decode, logs) if e is not None)
            start = to_block + 1
        self.next_block = start
        return sorted(events, key=lambda e: (e.block, e.log_index))
