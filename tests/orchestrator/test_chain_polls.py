"""What one poll of the chain costs the orchestrator: it follows the chain four times a second,
and most polls find no new block."""

from __future__ import annotations

from rpc_requests import sent_requests

from .parts import unchained_view


def test_a_poll_without_a_new_block_reads_only_the_block_number() -> None:
    view = unchained_view(pool_id=1)
    try:
        w3 = view.protocol.backend.w3
        with sent_requests(w3) as first:
            events, times, now = view._fetch(view.cursor)
        last = view.cursor.next_block - 1
        assert events == [] and now == times[last] == w3.eth.get_block(last)["timestamp"]
        assert first[0] == "eth_blockNumber" and "eth_getLogs" in first
        assert "eth_getBlockByNumber" in first[1:] or "batch of 1" in first[1:]
        with sent_requests(w3) as idle:  # no block since: the last block's time is known
            assert view._fetch(view.cursor)[2] == now
        assert idle == ["eth_blockNumber"]
        view.protocol.backend.tester.mine_blocks(1)
        with sent_requests(w3) as moved:  # a new block: its logs and its time are read
            _, times, later = view._fetch(view.cursor)
        assert view.cursor.next_block - 1 == last + 1
        assert later == w3.eth.get_block(last + 1)["timestamp"] >= now
        assert moved[:2] == ["eth_blockNumber", "eth_getLogs"] and len(moved) == 3
    finally:
        view.close()
