"""Contract events read with an incremental block cursor: each poll asks only for the blocks
after the last one it saw (in bounded ranges), never rescanning from block 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_utils import event_abi_to_log_topic

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


class EventDecoder:
    """Decodes the logs of a set of contracts from their ABIs (unknown logs are skipped)."""

    def __init__(self, backend: Backend, contracts: list[Any]):
        self._by_key: dict[tuple[str, bytes], Any] = {}
        for c in contracts:
            for item in c.abi:
                if item.get("type") == "event":
                    topic = event_abi_to_log_topic(item)
                    self._by_key[(c.address.lower(), topic)] = getattr(c.events, item["name"])()

    def decode(self, log: Any) -> Event | None:
        if not log["topics"]:
            return None
        ev = self._by_key.get((log["address"].lower(), bytes(log["topics"][0])))
        if ev is None:
            return None
        d = ev.process_log(log)
        return Event(
            d["event"],
            dict(d["args"]),
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
    ):
        self.backend = backend
        self.decoder = decoder
        self.addresses = addresses
        self.next_block = from_block
        self.max_range = max_range
        self.queries = 0  # get_logs calls made, to check that polls stay incremental

    def poll(self) -> list[Event]:
        """Every event from `next_block` up to the latest block; advances the cursor."""
        latest = self.backend.block_number()
        events: list[Event] = []
        while self.next_block <= latest:
            to_block = min(latest, self.next_block + self.max_range - 1)
            logs = self.backend.w3.eth.get_logs(
                {"address": self.addresses, "fromBlock": self.next_block, "toBlock": to_block}
            )
            self.queries += 1
            events.extend(e for e in map(self.decoder.decode, logs) if e is not None)
            self.next_block = to_block + 1
        return sorted(events, key=lambda e: (e.block, e.log_index))
