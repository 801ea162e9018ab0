"""Node rules: the node key must sign the ownership proof; signatures are strictly checked."""

from __future__ import annotations

from meshrl.protocol import ownership_digest, sign_ownership
from meshrl.protocol.signing import sign_digest

from .helpers import TOKEN, World, key

SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def _proof(
    world: World,
    signer_key: bytes,
    provider: str,
    chain_id: int | None = None,
    protocol: str | None = None,
) -> bytes:
    return sign_ownership(
        signer_key,
        protocol or world.fed.contract.address,
        chain_id or world.backend.chain_id,
        provider,
        world.fed.node_generation(world.n2.address),
    )


def test_digest_matches_contract(world: World) -> None:
    n1, p1 = world.n1.address, world.p1.address
    world.manager.eject_node(world.pool, n1)  # generation 1: the digest must follow it
    onchain = world.fed.contract.functions.ownership_digest(n1, p1).call()
    assert onchain == ownership_digest(
        world.fed.contract.address, world.backend.chain_id, n1, p1, 1
    )


def test_add_node_with_node_signature(world: World) -> None:
    r = world.p1.add_node(world.n2, 3)
    assert r.event("NodeAdded").args["node"] == world.n2.address
    info = world.fed.node(world.n2.address)
    assert (info.provider, info.compute_units, info.pool) == (world.p1.address, 3, 0)
    assert world.fed.provider(world.p1.address).compute_units == 8


def test_add_node_without_node_key_signature_reverts(world: World) -> None:
    n2, p1 = world.n2, world.p1
    cases = {
        "signed by the provider": _proof(world, p1.account.key, p1.address),
        "signed by another node": _proof(world, world.n3.key, p1.address),
        "signed for another provider": _proof(world, n2.key, world.p2.address),
        "signed for another chain": _proof(world, n2.key, p1.address, chain_id=1),
        "signed for another contract": _proof(
            world, n2.key, p1.address, protocol=world.fed.token.address
        ),
    }
    for i, sig in enumerate(cases.values()):
        world.expect_revert(
            "nodes: bad node signature",
            lambda s=sig: p1.add_node(n2, 1, signature=s),
            check_funds=i == 0,
        )
    assert world.fed.node(n2.address).provider == "0x" + "0" * 40


def test_malformed_signatures_revert(world: World) -> None:
    n2, p1 = world.n2, world.p1
    good = _proof(world, n2.key, p1.address)
    r, s, v = good[:32], int.from_bytes(good[32:64], "big"), good[64]
    high_s = r + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])  # same point, flipped
    world.expect_revert("sig: malleable s", lambda: p1.add_node(n2, 1, signature=high_s))
    world.expect_revert("sig: bad v", lambda: p1.add_node(n2, 1, signature=good[:64] + b"\x01"))
    world.expect_revert("sig: bad length", lambda: p1.add_node(n2, 1, signature=good[:64]))
    world.expect_revert("sig: bad r", lambda: p1.add_node(n2, 1, signature=bytes(32) + good[32:]))
    p1.add_node(n2, 1, signature=good)


def test_add_node_rules(world: World) -> None:
    world.expect_revert("nodes: not a provider", lambda: world.stranger.add_node(world.n2, 1))
    world.expect_revert("nodes: zero compute units", lambda: world.p1.add_node(world.n2, 0))
    world.expect_revert("nodes: already added", lambda: world.p2.add_node(world.n1, 1))
    world.expect_revert("nodes: already added", lambda: world.p1.add_node(world.n1, 1))


def test_remove_node(world: World) -> None:
    world.expect_revert("nodes: node in a pool", lambda: world.p1.remove_node(world.n1.address))
    world.expect_revert("nodes: not node provider", lambda: world.p1.remove_node(world.n3.address))
    world.p2.remove_node(world.n3.address)
    assert world.fed.provider(world.p2.address).compute_units == 0
    # once removed, the node can be added by whoever holds its key's proof
    world.p1.add_node(world.n3, 2)
    assert world.fed.node(world.n3.address).provider == world.p1.address


def test_sign_digest_is_canonical() -> None:
    k = key("canon")
    for i in range(20):
        sig = sign_digest(k.key, i.to_bytes(32, "big"))
        assert len(sig) == 65 and sig[64] in (27, 28)
        assert int.from_bytes(sig[32:64], "big") <= SECP256K1_N // 2
    assert TOKEN == 10**18
