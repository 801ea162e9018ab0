"""A signed request captured from the wire is refused as a replay after `kill -9` and a restart
of discovery or the orchestrator on the same state; a fresh request is served."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from meshrl.wire import sign_request

from .conftest import Pool, orchestrator_config
from .net import Service, announcement, hexkey

pytestmark = pytest.mark.anvil


def send(url: str, method: str, path: str, headers: dict[str, str],
         body: bytes) -> tuple[int, dict]:
    """One raw HTTP request with exactly these headers (what an eavesdropper could resend)."""
    req = urllib.request.Request(url + path, data=body or None, method=method,
                                 headers={**headers, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def audience(url: str) -> str:
    """The audience the service's requests are signed for (`GET /identity`)."""
    with urllib.request.urlopen(url + "/identity", timeout=30) as r:
        return str(json.load(r)["audience"])


def replayed_after_kill9(svc: Service, key: str, method: str, path: str, body: bytes) -> None:
    url = svc.start()
    aud = audience(url)
    captured = sign_request(key, method, path, body, audience=aud).as_dict()
    assert send(url, method, path, captured, body)[0] == 200
    svc.kill9()
    url = svc.start()  # same database, a new process (and port)
    try:
        status, answer = send(url, method, path, captured, body)
        assert (status, answer["error"]) == (409, "replayed nonce")
        fresh = sign_request(key, method, path, body, audience=aud).as_dict()
        assert send(url, method, path, fresh, body)[0] == 200
    finally:
        svc.stop()


def test_orchestrator_refuses_a_replay_after_kill9(pool: Pool) -> None:
    chain, tmp = pool.chain, pool.tmp / "replay-orch"
    tmp.mkdir()
    fed = chain.fed
    pool_id = fed.create_pool(fed.pool(chain.pool).domain, chain.accounts["mgr"].address, 10**15)
    fed.start_pool(pool_id)
    cfg = orchestrator_config(chain, tmp, pool_id=pool_id, db=str(tmp / "orch.db"),
                              store={"root": str(tmp / "files")})
    replayed_after_kill9(Service("orchestrator", cfg, tmp), pool.key("trainer"), "GET",
                         "/nodes", b"")


def test_discovery_refuses_a_replay_after_kill9(pool: Pool) -> None:
    chain, tmp = pool.chain, pool.tmp / "replay-disc"
    tmp.mkdir()
    svc = Service("discovery", {
        "port": 0, "db": str(tmp / "disc.db"), "sync_s": 5.0,
        "chain": {"deployment": str(chain.deployment), "rpc_url": chain.node.url}}, tmp)
    body = announcement(chain, "p1").model_dump_json().encode()
    replayed_after_kill9(svc, hexkey(chain.accounts["n4"]), "PUT", "/nodes", body)
