"""A hard verdict ejects its node at once but stands only after its dispute period. Until then
the orchestrator invites neither that node again nor a fresh node of the same provider (in the
demo, re-invited at once, the cheater was accused and ejected 19 times in the verdict's 60 s);
once the verdict is overturned, both may be invited again. Real anvil, discovery and
orchestrator processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eth_utils import keccak

from meshrl.wire import NoInvite, SignedClient
from meshrl.wire.models import Invite, NodeState, PoolNodes

from .conftest import Pool, pool_services
from .net import announcement, at_least, candidate_listings, run, wait_for

pytestmark = pytest.mark.anvil

DISPUTE = 600  # s: far longer than the test; the chain's clock is moved past it to settle


@pytest.fixture(scope="module")
def disputed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    with pool_services(tmp_path_factory.mktemp("verdicts"), (("n1", "p1"),)) as p:
        fed = p.chain.fed
        fed.set_validator(p.chain.accounts["stranger"].address)  # re-judges val's verdict
        fed.set_dispute_params(0, DISPUTE, 30, 1)
        yield p


def test_no_invite_while_a_fraud_verdict_is_open_and_again_once_overturned(
        disputed: Pool) -> None:
    p, c = disputed, disputed.chain
    n1 = c.accounts["n1"].address
    forged = keccak(text="forged file")
    c.client("p1").submit_work(c.pool, n1, forged, 2)
    wid = c.fed.work_id(n1, forged)
    c.client("val").hard_invalidate(wid)
    assert c.fed.node(n1).pool == 0  # ejected by the accusation itself
    assert c.fed.open_verdicts(c.accounts["p1"].address) == 1

    async def ejected(trainer: SignedClient) -> bool:
        nodes = await trainer.call("GET", "/nodes", response=PoolNodes)
        return any(n.address == n1 and n.state is NodeState.EJECTED for n in nodes.nodes)

    async def t() -> None:
        async with SignedClient(p.orch.url, p.key("trainer")) as trainer, \
                SignedClient(p.disc.url, p.key("n1")) as d1, \
                SignedClient(p.orch.url, p.key("n1")) as o1, \
                SignedClient(p.disc.url, p.key("n4")) as d4, \
                SignedClient(p.orch.url, p.key("n4")) as o4:
            await wait_for(lambda: ejected(trainer), timeout=15)
            await d1.call("PUT", "/nodes", announcement(c, "p1"))
            await d4.call("PUT", "/nodes", announcement(c, "p1"))  # p1's fresh node
            # two whole onboarding passes have considered both candidates
            seen = await candidate_listings(p.disc.url)
            await wait_for(lambda: at_least(candidate_listings(p.disc.url), seen + 3),
                           timeout=15)
            for o in (o1, o4):
                with pytest.raises(NoInvite):
                    await o.call("GET", "/invite")
            # another validator re-judges the file honest: the verdict is overturned
            c.client("stranger").vote(wid, False)
            c.fed.backend.advance_time(DISPUTE + 1)
            c.fed.settle(wid)
            assert c.fed.open_verdicts(c.accounts["p1"].address) == 0
            for o in (o1, o4):
                inv = await wait_for(lambda o=o: o.call("GET", "/invite", response=Invite),
                                     timeout=15)
                assert inv.pool_id == c.pool
    run(t())
