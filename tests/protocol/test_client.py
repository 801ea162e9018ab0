"""The client itself: one revert type on every backend and path, incremental event cursor,
deployment files, public API."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import meshrl.protocol as protocol
from meshrl.protocol import (
    ChainError,
    Deployment,
    DuplicateFile,
    NodeNotInPool,
    OutOfGas,
    Protocol,
    RpcBackend,
    TxReverted,
)
from meshrl.protocol.errors import REVERTS, reverted

from .helpers import TOKEN, World, file_hash

CONTRACTS = Path(protocol.__file__).parent / "contracts"


def test_revert_caught_before_sending(world: World) -> None:
    block = world.backend.block_number()
    with pytest.raises(TxReverted) as info:
        world.stranger.withdraw()
    assert info.value.reason == "stake: nothing unbonding"
    assert info.value.tx_hash is None  # caught by gas estimation, nothing was mined
    assert world.backend.block_number() == block


def test_status_zero_receipt_is_an_error(world: World) -> None:
    block = world.backend.block_number()
    with pytest.raises(TxReverted) as info:
        world.stranger.withdraw(gas=300_000)  # explicit gas: no estimation, mined and failed
    assert info.value.reason == "stake: nothing unbonding"
    assert info.value.tx_hash is not None
    assert world.backend.block_number() == block + 1
    receipt = world.backend.w3.eth.get_transaction_receipt(info.value.tx_hash)
    assert receipt["status"] == 0


def test_out_of_gas_is_an_error(world: World) -> None:
    with pytest.raises(TxReverted) as info:
        world.p1.transfer(world.p2.address, 1, gas=30_000)
    assert info.value.reason == "out of gas"
    world.p1.transfer(world.p2.address, 1, gas=100_000)  # enough gas: fine


def test_reverting_view_call_maps_to_txreverted(world: World) -> None:
    fn = world.fed.token.functions.transfer(world.p1.address, 10**30)
    with pytest.raises(TxReverted) as info:
        world.backend.call(fn, world.stranger.address)
    assert info.value.reason == "token: balance too low"
    assert (
        world.backend.call(
            world.fed.token.functions.transfer(world.p1.address, 1), world.stranger.address
        )
        is True
    )


def test_a_view_call_is_one_request_to_the_node(world: World) -> None:
    """No chain-id round trip before each eth_call (web3's validation middleware asked the node
    every time: 4.6 against 1.6 ms of CPU an eth_call on anvil); a transaction still sends."""
    from rpc_requests import sent_requests

    with sent_requests(world.backend.w3) as sent:
        assert world.fed.provider(world.p1.address).stake > 0
        assert sent == ["eth_call"], sent
        world.p1.transfer(world.p2.address, 1)  # signed here for the deployment's chain
        assert "eth_sendRawTransaction" in sent and "eth_chainId" not in sent[1:], sent


def test_event_cursor_is_incremental(world: World) -> None:
    cursor = world.fed.events()
    history = cursor.poll()
    names = [e.name for e in history]
    assert names.count("PoolCreated") == 2 and "NodeJoined" in names
    assert [(e.block, e.log_index) for e in history] == sorted(
        (e.block, e.log_index) for e in history
    )
    queries = cursor.queries
    assert cursor.poll() == [] and cursor.queries == queries  # no new block: no query at all
    world.p1.submit_work(world.pool, world.n1.address, file_hash("ev"), 3)
    new = cursor.poll()
    assert [e.name for e in new] == ["WorkSubmitted"]
    assert new[0].args["units"] == 3 and cursor.queries == queries + 1
    # the log's block hash is the block's: a validator picks replayed rows from it unread
    assert all(e.block_hash == world.backend.block_hash(e.block) for e in history + new)
    assert cursor.next_block == world.backend.block_number() + 1


def test_block_hash_is_the_hash_of_the_block_holding_a_submission(world: World) -> None:
    """What picks the rows a validator replays of the submitted file (pool/sampled.py)."""
    cursor = world.fed.events(world.backend.block_number() + 1)
    world.p1.submit_work(world.pool, world.n1.address, file_hash("bh1"), 3)
    world.p1.submit_work(world.pool, world.n1.address, file_hash("bh2"), 3)
    a, b = cursor.poll()
    receipt = world.backend.w3.eth.get_transaction_receipt(a.tx_hash)
    assert world.backend.block_hash(a.block) == "0x" + bytes(receipt["blockHash"]).hex()
    assert len(world.backend.block_hash(a.block)) == 66
    assert world.backend.block_hash(b.block) != world.backend.block_hash(a.block)


def test_event_cursor_pages_through_long_ranges(world: World) -> None:
    whole = world.fed.events().poll()
    paged = world.fed.events()
    paged.max_range = 3
    assert paged.poll() == whole
    assert paged.queries >= (world.backend.block_number() - world.fed.deployment.block) // 3


def test_deployment_file_roundtrip(world: World, tmp_path) -> None:
    path = tmp_path / "chain" / "deployment.json"
    world.fed.deployment.save(path)
    loaded = Deployment.load(path)
    assert loaded == world.fed.deployment
    assert Protocol(world.backend, loaded).pool(world.pool).status == 2
    wrong = dataclasses.replace(loaded, chain_id=loaded.chain_id + 1)
    with pytest.raises(ValueError, match="chain"):
        Protocol(world.backend, wrong)


def test_client_without_account_reads_but_cannot_send(world: World) -> None:
    reader = Protocol(world.backend, world.fed.deployment)
    assert reader.balance(world.p1.address) > 0
    with pytest.raises(ValueError, match="signing account"):
        reader.mint(world.p1.address, TOKEN)


def test_unreachable_node_is_a_chain_error() -> None:
    with pytest.raises(ChainError):
        RpcBackend("http://127.0.0.1:9", timeout=0.5).wait_ready(timeout=0.5)


def test_public_api() -> None:
    assert sorted(protocol.__all__) == protocol.__all__
    for name in protocol.__all__:
        assert getattr(protocol, name) is not None
    assert {
        "Protocol",
        "deploy",
        "TxReverted",
        "EthTesterBackend",
        "RpcBackend",
        "EventCursor",
        "sign_invite",
    } <= set(protocol.__all__)


def test_missing_anvil_is_reported(tmp_path) -> None:
    from meshrl.protocol.anvil import AnvilNode, find_anvil

    assert find_anvil(str(tmp_path / "no-anvil")) is None
    with pytest.raises(ChainError, match="anvil not found"):
        AnvilNode(str(tmp_path / "no-anvil"))


def test_cli_help_does_not_import_web3() -> None:
    import subprocess
    import sys

    code = (
        "import sys, meshrl.cli as c; c.build_parser(); "
        "print(any(m.split('.')[0] in ('web3', 'eth_tester', 'vyper') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_full_lifecycle_seen_through_the_cursor(world: World) -> None:
    cursor = world.fed.events(from_block=world.backend.block_number() + 1)
    s = world.stranger
    s.register_provider(200 * TOKEN)
    s.add_node(world.n2, 2)
    s.join_pool(*world.invite(world.pool, world.n2.address, nonce=77))
    f = file_hash("life")
    wid = s.submit_work(world.pool, world.n2.address, f, 8).event("WorkSubmitted").args["work_id"]
    assert wid == world.fed.work_id(world.n2.address, f)
    world.backend.advance_time(world.fed.contract.functions.lock_period().call() + 1)
    s.claim([wid])
    s.leave_pool(world.n2.address)
    s.remove_node(world.n2.address)
    s.request_unstake(200 * TOKEN)
    world.backend.advance_time(world.fed.contract.functions.unbonding_delay().call() + 1)
    s.withdraw()
    names = [e.name for e in cursor.poll() if e.name not in ("Approval",)]
    assert names == [
        "Transfer", "ProviderRegistered", "NodeAdded", "NodeJoined", "WorkSubmitted",
        "RewardsClaimed", "Transfer", "NodeLeft", "NodeRemoved", "UnstakeRequested",
        "Transfer", "Withdrawn",
    ]  # fmt: skip
    assert world.fed.provider(s.address).stake == 0


def test_reverts_arrive_as_the_class_of_their_reason(world: World) -> None:
    """Caught by gas estimation (no transaction mined) as on chain (a status-0 receipt): the
    caller catches the class, not the message."""
    p1, pool, n1 = world.p1, world.pool, world.n1.address
    p1.submit_work(pool, n1, file_hash("twice"), 1)
    with pytest.raises(DuplicateFile) as dup:
        p1.submit_work(pool, n1, file_hash("twice"), 1)
    assert dup.value.tx_hash is None and dup.value.reason == "work: duplicate file"
    with pytest.raises(NodeNotInPool):
        p1.submit_work(world.pending_pool, n1, file_hash("elsewhere"), 1)
    with pytest.raises(NodeNotInPool):  # the manager's ejection of a node that left
        world.manager.eject_node(pool, world.n3.address)
    with pytest.raises(OutOfGas):
        world.p1.transfer(world.p2.address, 1, gas=30_000)
    with pytest.raises(TxReverted) as other:  # a reason no caller acts on: the base class
        world.stranger.withdraw()
    assert type(other.value) is TxReverted


def test_every_mapped_reason_is_a_contract_revert_message() -> None:
    """`REVERTS` names reasons the contracts really revert with (a renamed message would
    otherwise silently fall back to the base class)."""
    sources = "".join(p.read_text() for p in CONTRACTS.glob("*.vy"))
    messages = set(re.findall(r'"([a-z]+: [^"]+)"', sources))
    assert set(REVERTS) - {"out of gas"} <= messages
    assert all(issubclass(c, TxReverted) and c is not TxReverted for c in REVERTS.values())
    assert type(reverted("work: duplicate file", "0xab")) is DuplicateFile
    assert type(reverted("work: some new reason")) is TxReverted
