"""AnvilNode on a picked port someone else binds first: it picks again, and never mistakes
the other listener for its own node."""

from __future__ import annotations

import socket

import pytest

from meshrl.protocol import ChainError
from meshrl.protocol.anvil import AnvilNode

pytestmark = pytest.mark.anvil


def test_a_picked_port_taken_by_another_node_is_picked_again() -> None:
    with AnvilNode() as other_backend:  # the other node on the port ours picked
        other_backend.fund("0x" + "11" * 20, 12345)
        node = AnvilNode()
        taken = node.port = int(other_backend.url.rsplit(":", 1)[1])
        backend = node.start()
        try:
            assert node.port != taken and backend.url.endswith(f":{node.port}")
            # ours is a fresh chain, not the other node's
            assert backend.w3.eth.get_balance("0x" + "11" * 20) == 0
        finally:
            node.stop()


def test_a_port_the_caller_chose_is_never_changed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: probes are refused at once
        port = s.getsockname()[1]
        node = AnvilNode(port=port)
        with pytest.raises(ChainError, match="Address already in use"):
            node.start(timeout=10)
        assert node.port == port and node.proc is None
