"""`meshrl discovery` as a process against anvil: who may announce, who may list a pool's
candidates, the per-IP cap, and statuses that follow the chain; every refusal its routes
declare reaches the client as its class.

One chain for the module, one discovery process (with its own registry) per test, so that no
test sees another's entries; the tests that change a node on chain use nodes no other test
announces (n5 removed, n2 ejected)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from meshrl.discovery.config import DiscoveryConfig
from meshrl.discovery.service import ChainStatus, Discovery
from meshrl.wire import ErrorCode, NotAnnounced, SignedClient, WireHTTPError, refusal_classes
from meshrl.wire.models import NodeEntry, NodeList, NodeStatus
from orchestrator.net import Chain, Service, announcement, hexkey, run, start_chain, wait_for

pytestmark = pytest.mark.anvil


@dataclass
class Disc:
    chain: Chain
    url: str

    def client(self, name: str) -> SignedClient:
        return SignedClient(self.url, hexkey(self.chain.accounts[name]))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    c = start_chain(tmp_path_factory.mktemp("disc-chain"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def disc(chain: Chain, tmp_path: Path) -> Iterator[Disc]:
    svc = Service("discovery", {
        "port": 0, "db": str(tmp_path / "disc.db"), "sync_s": 0.3, "manager_cache_s": 0.0,
        "max_nodes_per_ip": 3,
        "chain": {"deployment": str(chain.deployment), "rpc_url": chain.node.url}}, tmp_path)
    try:
        yield Disc(chain, svc.start())
    finally:
        svc.stop()


def expect(code: ErrorCode, coro) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WireHTTPError) as e:
        run(coro)
    assert type(e.value) is refusal_classes()[code] and e.value.status == code.status, e.value


async def put(d: Disc, node: str, provider: str) -> NodeEntry:
    async with d.client(node) as c:
        return await c.call("PUT", "/nodes", announcement(d.chain, provider), response=NodeEntry)


def test_who_may_announce(disc: Disc) -> None:
    expect(ErrorCode.NODE_NOT_ON_CHAIN, put(disc, "stranger", "p1"))
    expect(ErrorCode.PROVIDER_MISMATCH, put(disc, "n1", "p2"))
    entry = run(put(disc, "n1", "p1"))
    assert (entry.status, entry.ip, entry.info.hardware.cores) == (NodeStatus.PENDING,
                                                                   "127.0.0.1", 8)

    async def unsigned() -> int:
        async with aiohttp.ClientSession() as s, s.put(disc.url + "/nodes", json={}) as r:
            return r.status
    assert run(unsigned()) == 401


def test_a_node_reads_only_its_own_entry(disc: Disc) -> None:
    run(put(disc, "n1", "p1"))
    n1 = disc.chain.accounts["n1"].address

    async def read(who: str) -> NodeEntry:
        async with disc.client(who) as c:
            return await c.call("GET", f"/nodes/{n1}", response=NodeEntry)
    assert run(read("n1")).address == n1
    expect(ErrorCode.NOT_OWN_ENTRY, read("n2"))

    async def unannounced() -> NodeEntry:  # the stranger never announced itself
        async with disc.client("stranger") as c:
            return await c.call("GET", f"/nodes/{disc.chain.accounts['stranger'].address}")
    expect(ErrorCode.NOT_ANNOUNCED, unannounced())


def test_only_the_pool_manager_lists_candidates(disc: Disc) -> None:
    run(put(disc, "n1", "p1"))

    async def listing(who: str, pool: int | str) -> NodeList:
        async with disc.client(who) as c:
            return await c.call("GET", f"/pools/{pool}/nodes", response=NodeList)
    nodes = run(listing("mgr", disc.chain.pool)).nodes
    assert disc.chain.accounts["n1"].address in {n.address for n in nodes}
    expect(ErrorCode.NOT_POOL_MANAGER, listing("stranger", disc.chain.pool))
    expect(ErrorCode.BAD_POOL_ID, listing("mgr", "x"))


def test_cap_per_ip_address(disc: Disc) -> None:
    for n in ("n1", "n2", "n3"):
        run(put(disc, n, "p1"))
    run(put(disc, "n1", "p1"))  # an update is not a new node
    expect(ErrorCode.TOO_MANY_NODES_FOR_IP, put(disc, "n4", "p1"))


def test_status_follows_the_chain(disc: Disc) -> None:
    chain = disc.chain
    n5 = chain.accounts["n5"].address
    run(put(disc, "n5", "p2"))

    async def status(node: str) -> NodeStatus | None:
        async with disc.client(node) as c:
            try:
                e = await c.call("GET", f"/nodes/{chain.accounts[node].address}",
                                 response=NodeEntry)
                return e.status
            except NotAnnounced:
                return None

    async def becomes(node: str, want: NodeStatus | None) -> None:
        await wait_for(lambda: _eq(status(node), want), timeout=10)

    mgr = chain.client("mgr")
    mgr.blacklist_node(chain.pool, n5)
    run(becomes("n5", NodeStatus.BLACKLISTED))
    # the node is removed on chain by its provider: its entry disappears
    chain.client("p2").remove_node(n5)
    run(becomes("n5", None))


async def _eq(get, want) -> bool:  # type: ignore[no-untyped-def]
    return (await get) == want


def test_in_pool_then_ejected(disc: Disc) -> None:
    chain = disc.chain
    n2 = chain.accounts["n2"]
    run(put(disc, "n2", "p1"))
    mgr = chain.client("mgr")
    exp = chain.fed.backend.now() + 600
    chain.client("n2").join_pool(chain.pool, n2.address, 7, exp,
                                 mgr.sign_invite(chain.pool, n2.address, 7, exp))

    async def st() -> NodeStatus:
        async with disc.client("n2") as c:
            return (await c.call("GET", f"/nodes/{n2.address}", response=NodeEntry)).status
    run(wait_for(lambda: _eq(st(), NodeStatus.IN_POOL), timeout=10))
    mgr.eject_node(chain.pool, n2.address)
    run(wait_for(lambda: _eq(st(), NodeStatus.EJECTED), timeout=10))
    # and it stays ejected over two further syncs (counted by the service, not timed here)
    seen = run(syncs(disc))
    run(wait_for(lambda: _at_least(syncs(disc), seen + 2), timeout=10))
    assert run(st()) == NodeStatus.EJECTED



def test_every_declared_refusal_reaches_the_client_as_its_class(disc: Disc,
                                                                tmp_path: Path) -> None:
    accounts = disc.chain.accounts

    async def get(who: str, path: str) -> object:
        async with disc.client(who) as c:
            return await c.call("GET", path)

    async def over_the_cap() -> NodeEntry:  # three other nodes on this address already
        for n, p in (("n1", "p1"), ("n2", "p1"), ("n3", "p1")):
            await put(disc, n, p)
        return await put(disc, "n4", "p1")
    cases = {
        ErrorCode.NODE_NOT_ON_CHAIN: lambda: put(disc, "stranger", "p1"),
        ErrorCode.PROVIDER_MISMATCH: lambda: put(disc, "n1", "p2"),
        ErrorCode.TOO_MANY_NODES_FOR_IP: over_the_cap,
        ErrorCode.NOT_OWN_ENTRY: lambda: get("n2", f"/nodes/{accounts['n1'].address}"),
        ErrorCode.NOT_ANNOUNCED: lambda: get("stranger", f"/nodes/{accounts['stranger'].address}"),
        ErrorCode.BAD_POOL_ID: lambda: get("mgr", "/pools/0/nodes"),
        ErrorCode.NOT_POOL_MANAGER: lambda: get("stranger", f"/pools/{disc.chain.pool}/nodes"),
    }
    no_chain = SimpleNamespace(backend=SimpleNamespace(chain_id=1))  # routes only: no chain calls
    service = Discovery(DiscoveryConfig(db=str(tmp_path / "d.db")), no_chain)  # type: ignore[arg-type]
    declared = {c for r in service.routes() for c in r.refusals}
    service.registry.close()
    assert set(cases) == declared
    for code, attempt in cases.items():
        expect(code, attempt())


async def syncs(d: Disc) -> int:
    async with aiohttp.ClientSession() as s, s.get(d.url + "/health") as r:
        return int((await r.json())["info"]["syncs"])


async def _at_least(get, n: int) -> bool:  # type: ignore[no-untyped-def]
    return (await get) >= n


def test_a_sync_reads_every_node_in_batches_and_agrees_with_one_by_one(chain: Chain,
                                                                        tmp_path: Path) -> None:
    """A sync pass costs two batched requests to the node however many nodes are announced
    (it was two or three view calls per node, every `sync_s`), and gives each entry the
    status that reading its node alone gives: nodes gone from the chain are dropped."""
    import asyncio
    import time

    from eth_account import Account

    from rpc_requests import sent_requests

    d = Discovery(DiscoveryConfig(db=str(tmp_path / "d.db")), chain.fed)
    on_chain = [chain.accounts[f"n{i}"].address for i in range(1, 6)]
    gone = [Account.create().address for _ in range(25)]
    for address in on_chain + gone:
        d.registry.put(NodeEntry(address=address, info=announcement(chain, "p1"),
                                 status=NodeStatus.PENDING, updated_at=time.time()))

    def one_by_one(a: str) -> ChainStatus:  # the entries were pending: never "ejected"
        pool = chain.fed.node(a).pool
        if pool:
            return ChainStatus(NodeStatus.IN_POOL, pool)
        if chain.fed.is_blacklisted(chain.pool, a):
            return ChainStatus(NodeStatus.BLACKLISTED)
        return ChainStatus(NodeStatus.PENDING)

    alone = {a: one_by_one(a) for a in on_chain if chain.fed.node(a).provider != "0x" + "00" * 20}
    try:
        with sent_requests(chain.fed.backend.w3) as sent:
            changed = asyncio.run(d.sync())
    finally:
        d._chain.shutdown()
    free = sum(s.chain_pool == 0 for s in alone.values())  # their blacklist is read too
    assert sent == ["batch of 30"] + ([f"batch of {free}"] if free else []), sent
    assert changed >= len(gone)
    got = {e.address: ChainStatus(e.status, e.chain_pool) for e in d.registry.all()}
    d.registry.close()
    assert got == alone and alone
