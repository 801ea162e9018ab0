"""Property tests: after any sequence of actions (valid or not), the books balance.

- total stake == sum of provider stakes; total unbonding == sum of unbonding amounts;
- the protocol's token balance == stake + unbonding + slashed-not-collected;
- token supply grows exactly by what was claimed;
- a pool's node count == the nodes that point at it.
"""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from meshrl.protocol import TxReverted

from .helpers import PARAMS, TOKEN, World, file_hash

AMOUNT = st.sampled_from([0, 1, 50, 150, 250, 400]).map(lambda x: x * TOKEN)
STAKE_MOVES = st.one_of(
    st.tuples(st.just("unstake"), st.integers(0, 2), AMOUNT),
    st.tuples(st.just("slash"), st.integers(0, 2), AMOUNT),
)
ACTION = st.one_of(
    STAKE_MOVES,
    STAKE_MOVES,
    STAKE_MOVES,
    st.tuples(st.just("register"), st.integers(0, 2), AMOUNT),
    st.tuples(st.just("add_stake"), st.integers(0, 2), AMOUNT),
    st.tuples(st.just("unstake"), st.integers(0, 2), AMOUNT),
    st.tuples(st.just("withdraw"), st.integers(0, 2)),
    st.tuples(st.just("slash"), st.integers(0, 2), AMOUNT),
    st.tuples(
        st.just("advance"), st.sampled_from([60, PARAMS.lock_period, PARAMS.unbonding_delay])
    ),
    st.tuples(st.just("submit"), st.integers(1, 50)),
    st.tuples(st.just("invalidate"), st.booleans()),
    st.tuples(st.just("claim")),
    st.tuples(st.just("leave_or_join")),
    st.tuples(st.just("eject")),
)


def _apply(w: World, action: tuple, state: dict) -> None:
    providers = [w.p1, w.p2, w.stranger]
    kind = action[0]
    if kind == "register":
        providers[action[1]].register_provider(action[2])
    elif kind == "add_stake":
        providers[action[1]].add_stake(action[2])
    elif kind == "unstake":
        providers[action[1]].request_unstake(action[2])
    elif kind == "withdraw":
        providers[action[1]].withdraw()
    elif kind == "slash":
        w.fed.slash(providers[action[1]].address, action[2])
    elif kind == "advance":
        w.backend.advance_time(action[1])
    elif kind == "submit":
        f = file_hash(f"inv-{state['n']}")
        state["n"] += 1
        w.p1.submit_work(w.pool, w.n1.address, f, action[1])
        state["files"].append(w.fed.work_id(w.n1.address, f))
    elif kind == "invalidate" and state["files"]:
        f = state["files"][-1]
        (w.validator.hard_invalidate if action[1] else w.validator.soft_invalidate)(f)
    elif kind == "claim" and state["files"]:
        w.p1.claim(state["files"][:1])
    elif kind == "eject":
        w.manager.eject_node(w.pool, w.n1.address)
    elif kind == "leave_or_join":
        if w.fed.node(w.n1.address).pool:
            w.p1.leave_pool(w.n1.address)
        else:
            state["nonce"] += 1
            w.p1.join_pool(*w.invite(w.pool, w.n1.address, nonce=state["nonce"]))


def _check(w: World, supply0: int) -> None:
    f = w.fed
    providers = [f.provider(c.address) for c in (w.p1, w.p2, w.stranger)]
    totals = f.totals()
    assert totals["stake"] == sum(p.stake for p in providers)
    assert totals["unbonding"] == sum(p.unbonding for p in providers)
    held = f.balance(f.contract.address)
    assert held == totals["stake"] + totals["unbonding"] + totals["slashed"] + totals["bonds"]
    supply = f.token.functions.totalSupply().call()
    assert supply == supply0 + totals["claimed"]
    members = sum(f.node(n.address).pool == w.pool for n in (w.n1, w.n2, w.n3))
    assert f.pool(w.pool).node_count == members


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=st.lists(ACTION, min_size=1, max_size=10))
@example(actions=[("unstake", 0, 150 * TOKEN), ("slash", 0, 400 * TOKEN), ("withdraw", 0)])
@example(actions=[("submit", 5), ("advance", PARAMS.lock_period), ("claim",), ("claim",)])
def test_books_balance_after_any_actions(tester_world: World, actions: list) -> None:
    w = tester_world
    snap = w.backend.snapshot()
    try:
        supply0 = w.fed.token.functions.totalSupply().call()
        state = {"n": 0, "files": [], "nonce": 100}
        for action in actions:
            # invalid actions must revert cleanly; the books must still balance
            with contextlib.suppress(TxReverted):
                _apply(w, action, state)
        _check(w, supply0)  # every prefix of a sequence is itself an example
    finally:
        w.backend.revert(snap)
