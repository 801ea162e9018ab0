"""A hostile pool's `GET /join` must not get a contributor to sign for a thief (issue #41).

Real processes on loopback: the real chain (an anvil with the real deployment, where the
contributor holds real tokens and ether), a hostile `/join` server (aiohttp) serving a crafted
manifest signed by the thief, and `meshrl worker join URL --chain.rpc_url REAL` with keystores.

- `replay`: the manifest names the real token, an address of the thief's own as the protocol
  and an RPC of the thief's chain (a second anvil, same chain id) that serves meshrl's code and
  state at both addresses; anything the worker signs there is replayed on the real chain.
- `rogue protocol`: the thief deployed meshrl's own protocol on the real chain, staking the real
  token; the manifest names it with honest code hashes (so code checks alone pass) and the real
  chain's RPC.

Both times the worker refuses in one line and signs nothing: the real chain's allowance for the
thief stays 0, the contributor's nonce stays 0 on both chains.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from meshrl.pool import JoinManifest, PoolRules
from meshrl.protocol import Protocol, ProtocolParams, deploy
from meshrl.protocol.anvil import AnvilNode
from meshrl.protocol.backend import RpcBackend
from meshrl.protocol.keystore import write_keystore
from meshrl.protocol.signing import sign_digest

pytestmark = pytest.mark.anvil
SRC = Path(__file__).resolve().parents[2] / "src"
TOKEN = 10**18
PARAMS = ProtocolParams(min_stake=100 * TOKEN, stake_per_unit=10 * TOKEN)


def _key(label: str) -> LocalAccount:
    return Account.from_key(keccak(text=f"meshrl-hostile-join-{label}"))


FED, THIEF, PROVIDER, NODE = (_key(n) for n in ("fed", "thief", "provider", "node"))


class HostilePool:
    """A real aiohttp server on loopback answering `GET /join` (a fresh `server_time` each
    time) and `GET /rules` with what the thief crafted."""

    def __init__(self, manifest: JoinManifest, raw: bytes = b"") -> None:
        self.manifest, self.raw = manifest, raw
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.hits: list[str] = []

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def join(request: web.Request) -> web.Response:
            self.hits.append(request.path)
            if self.raw:
                return web.Response(body=self.raw, content_type="application/json")
            m = self.manifest.model_copy(update={"server_time": time.time()})
            return web.Response(body=m.model_dump_json(), content_type="application/json")

        async def rules(request: web.Request) -> web.Response:
            self.hits.append(request.path)
            return web.Response(body=self.manifest.rules.model_dump_json(),
                                content_type="application/json")

        app = web.Application()
        app.router.add_get("/join", join)
        app.router.add_get("/rules", rules)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> HostilePool:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _code_hash(backend: RpcBackend, addr: str) -> str:
    return "0x" + keccak(bytes(backend.w3.eth.get_code(addr))).hex()  # type: ignore[arg-type]


def _crafted(rpc: RpcBackend, rpc_url: str, token: str, protocol: str) -> JoinManifest:
    rules = PoolRules(pool_id=1)
    m = JoinManifest(
        pool_id=1, domain_id=0, chain_id=rpc.chain_id, rpc_url=rpc_url, token=token,
        protocol=protocol, deployment_block=0,
        code_hashes={"token": _code_hash(rpc, token), "protocol": _code_hash(rpc, protocol)},
        rules=rules, rules_digest=rules.digest(), discovery_url="http://127.0.0.1:9",
        shardcast_servers=[], min_stake=PARAMS.min_stake, stake_per_unit=PARAMS.stake_per_unit,
        reward_rate=10**15, max_units_per_file=1000, trainer=THIEF.address,
        heartbeat_interval_s=1.0, dead_after=3, signature_window_s=300,
        server_time=time.time(), signer=THIEF.address)
    return m.model_copy(update={"signature": "0x" + sign_digest(THIEF.key, m.digest()).hex()})


@pytest.fixture
def chains() -> Iterator[tuple[AnvilNode, Protocol, AnvilNode, Protocol]]:
    real, fake = AnvilNode(), AnvilNode()
    try:
        a, b = real.start(), fake.start()
        for backend in (a, b):
            for acct in (FED, THIEF, PROVIDER, NODE):
                backend.fund(acct.address, 10**20)
        # the same deployer at the same nonce: the thief's chain has the real token's address
        dep_a, dep_b = deploy(a, FED, PARAMS), deploy(b, FED, PARAMS)
        assert (dep_a.token, dep_a.protocol) == (dep_b.token, dep_b.protocol)
        fed_a, fed_b = Protocol(a, dep_a, FED), Protocol(b, dep_b, FED)
        for fed in (fed_a, fed_b):  # the contributor holds tokens on both (the thief mints its)
            fed.mint(PROVIDER.address, 1000 * TOKEN)
        yield real, fed_a, fake, fed_b
    finally:
        real.stop()
        fake.stop()


def _replay(src: RpcBackend, dst: RpcBackend, sender: str) -> int:
    """Send every transaction `sender` signed on `src` to `dst` too; how many."""
    n = 0
    for number in range(src.block_number() + 1):
        for tx in src.w3.eth.get_block(number, full_transactions=True)["transactions"]:
            if tx["from"].lower() == sender.lower():  # type: ignore[index]
                txh = "0x" + bytes(tx["hash"]).hex()  # type: ignore[index]
                raw = src._rpc("eth_getRawTransactionByHash", [txh])
                with contextlib.suppress(Exception):  # a nonce the real chain refuses
                    dst._rpc("eth_sendRawTransaction", [raw])
                n += 1
    return n


def _join(tmp: Path, url: str, rpc: str | None) -> subprocess.Popen:
    (tmp / "pw").write_text("pw\n")
    write_keystore(PROVIDER, "pw", tmp / "provider.json", 2)
    write_keystore(NODE, "pw", tmp / "node.json", 2)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("MESHRL_KEYSTORE_PASSWORD", None)
    return subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "worker", "join", url,
         *(["--chain.rpc_url", rpc] if rpc else []),
         "--keys.provider_keystore", str(tmp / "provider.json"),
         "--keys.node_keystore", str(tmp / "node.json"), "--keys.password_file",
         str(tmp / "pw"), "--work_dir", str(tmp / "w"), "--fund_poll_s", "0.3",
         "--poll_interval", "0.3", "--engine.num_threads", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("attack", ["replay", "rogue protocol"])
def test_a_hostile_pool_gets_no_signature_for_a_thief(chains, tmp_path, attack) -> None:
    real, fed_a, fake, fed_b = chains
    a, b = fed_a.backend, fed_b.backend
    assert isinstance(a, RpcBackend) and isinstance(b, RpcBackend)
    token = fed_a.deployment.token
    if attack == "replay":
        # on its own chain the thief deploys meshrl's protocol (staking the token copy there)
        # at an address of its own: on the real chain nothing is there yet, the thief's next
        # deployment will be
        rogue = deploy(b, THIEF, PARAMS, token=token)
        spender, served = rogue.protocol, _crafted(b, fake.url, token, rogue.protocol)
    else:
        rogue = deploy(a, THIEF, PARAMS, token=token)  # meshrl's code, the thief's federator
        spender, served = rogue.protocol, _crafted(a, real.url, token, rogue.protocol)
    with HostilePool(served) as pool:
        w = _join(tmp_path, pool.url, real.url)
        deadline = time.monotonic() + 120
        while w.poll() is None and time.monotonic() < deadline:
            if a.w3.eth.get_transaction_count(PROVIDER.address) or \
                    b.w3.eth.get_transaction_count(PROVIDER.address):
                time.sleep(3)  # it signed: let it go on a moment, then look
                break
            time.sleep(0.3)
        if w.poll() is None:
            w.kill()
        _, err = w.communicate(timeout=30)
    _replay(b, a, PROVIDER.address)
    # on the real chain, the thief may spend nothing of the contributor's
    assert fed_a.allowance(PROVIDER.address, spender) == 0
    assert fed_a.balance(PROVIDER.address) == 1000 * TOKEN
    assert a.w3.eth.get_transaction_count(PROVIDER.address) == 0
    assert b.w3.eth.get_transaction_count(PROVIDER.address) == 0
    assert pool.hits == ["/join"]  # nothing asked of the pool after its manifest
    lines = [x for x in err.decode().splitlines() if x.strip() and not x.startswith("{")]
    assert w.returncode == 1 and len(lines) == 1, err.decode()[-3000:]
    assert "refused" in lines[0] and "nothing was signed" in lines[0], lines[0]
    assert ("(protocol)" if attack == "replay" else "(minter)") in lines[0], lines[0]
    assert "fund on chain" not in err.decode()


def test_without_an_rpc_of_its_own_the_worker_refuses_and_names_the_hint(chains,
                                                                          tmp_path) -> None:
    _, fed_a, fake, fed_b = chains
    dep = fed_a.deployment
    assert isinstance(fed_b.backend, RpcBackend)
    with HostilePool(_crafted(fed_b.backend, fake.url, dep.token, dep.protocol)) as pool:
        w = _join(tmp_path, pool.url, None)
        _, err = w.communicate(timeout=120)
    lines = [x for x in err.decode().splitlines() if x.strip() and not x.startswith("{")]
    assert w.returncode == 1 and len(lines) == 1, err.decode()[-3000:]
    assert "--chain.rpc_url" in lines[0] and fake.url in lines[0], lines[0]
    assert fed_b.backend.w3.eth.get_transaction_count(PROVIDER.address) == 0


def test_an_oversized_manifest_is_refused_unread(chains, tmp_path) -> None:
    _, fed_a, fake, fed_b = chains
    dep = fed_a.deployment
    assert isinstance(fed_b.backend, RpcBackend)
    served = _crafted(fed_b.backend, fake.url, dep.token, dep.protocol)
    with HostilePool(served, raw=b"[" * (4 << 20)) as pool:
        w = _join(tmp_path, pool.url, fake.url)
        _, err = w.communicate(timeout=120)
    lines = [x for x in err.decode().splitlines() if x.strip() and not x.startswith("{")]
    assert w.returncode == 1 and len(lines) == 1, err.decode()[-3000:]
    assert "more than 1048576" in lines[0], lines[0]
