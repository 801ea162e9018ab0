"""SIGTERM reaches every wait of a worker, its first policy fetch included: a worker whose
policy source accepts connections and never answers stops within seconds of SIGTERM (it was
killed after 20 s by `network up`'s supervisor). Real processes: anvil, discovery,
orchestrator, `meshrl worker`, and a policy source that holds every connection open."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from network import RULES, fund_provider, key, start_net, wait_until, worker

pytestmark = [pytest.mark.slow, pytest.mark.anvil]


class HoldingServer:
    """Accepts every connection, reads what is sent, never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.mark.timing
def test_sigterm_during_the_first_policy_fetch_stops_the_worker_in_seconds(tmp_path) -> None:
    source = HoldingServer()
    work = {"step": 0, "max_units_per_file": 100_000, "slot_ttl_s": 20.0,
            "shardcast_servers": [source.url]}
    net = start_net(tmp_path, orch={"work": work, "rules": {
        **RULES, "policy_signer": key("trainer").address}})
    try:
        fund_provider(net, "held")
        w = worker(net, "held")
        w.start()
        wait_until(lambda: source.held or w.proc.poll() is not None, 240)
        assert w.proc.poll() is None, w.log.read_text()[-3000:]
        time.sleep(1.0)  # well inside the fetch, which has no answer coming
        t0 = time.monotonic()
        w.proc.send_signal(signal.SIGTERM)
        rc = w.wait(60)
        seconds = time.monotonic() - t0
        lines = [json.loads(x) for x in w.log.read_text().splitlines() if x.startswith("{")]
        assert rc == 0, w.log.read_text()[-3000:]
        assert any(x.get("msg") == "stopped" for x in lines)
        assert seconds < 5, seconds
    finally:
        net.close()
        source.close()
