"""A worker generates only by the pool's published rules. One whose `[rules]` pins any rule to
another value refuses to start, before anything is staked, in one line naming the field (exit
`EXIT_REFUSED`, so no supervisor restarts it); rules that change while it works stop it the same
way. In process against the orchestrator's own `GET /rules` route on loopback, then as real
`meshrl worker` processes against a whole pool (anvil, discovery, orchestrator)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from eth_account import Account
from helpers import rules_server

from meshrl.config import EXIT_REFUSED
from meshrl.pool import RULE_FIELDS, PoolRules, PoolRulesError, RulesPins, require_same_rules
from meshrl.protocol.anvil import find_anvil
from meshrl.wire import SignedClient
from meshrl.wire.rollout_file import read_rollout_file
from meshrl.worker.config import WorkerConfig
from meshrl.worker.profile import accepted_rules
from network import RULES, Net, fund_provider, start_net, wait_until, worker
from orchestrator.net import Service

pytestmark = pytest.mark.anvil  # some tests start anvil (tests/anvil_rule.py)

# per rule field: a value other than the published one (network.RULES), and how the refusal
# names it
DRIFT: dict[str, tuple[Any, str]] = {
    "task": ({"type": "arithmetic", "digits": 3, "operators": "+-"},
             "rules.task.mix.0.digits: configured 3, the pool publishes 2"),
    "sampling": ({"max_new_tokens": 17, "temperature": 1.0, "top_p": 1.0},
                 "rules.sampling.max_new_tokens: configured 17, the pool publishes 16"),
    "group_size": (5, "rules.group_size: configured 5, the pool publishes 4"),
    "prompts_per_file": (3, "rules.prompts_per_file: configured 3, the pool publishes 2"),
    "files_per_step": (2, "rules.files_per_step: configured 2, the pool publishes 8"),
    "async_level": (3, "rules.async_level: configured 3, the pool publishes 2"),
    "seed": (12, "rules.seed: configured 12, the pool publishes 11"),
    "proof_profile": ("any-hardware", "rules.proof_profile: configured 'any-hardware', the pool "
                      "publishes 'meshrl-cpu-engine'"),
    "prompt_format": ("chat", "rules.prompt_format: configured 'chat', the pool publishes "
                      "'raw'"),
    "policy_signer": ("0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A",
                      "rules.policy_signer: configured "
                      "'0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A', the pool publishes None"),
    "replay": ({"rows_fraction": 1.0},
               "rules.replay.rows_fraction: configured 1.0, the pool publishes 0.25"),
    "batch": ({"files": 4, "max_delay_s": 10.0},
              "rules.batch.files: configured 4, the pool publishes 1"),
}


def test_every_rule_field_has_a_drift_case():
    assert set(DRIFT) == set(RULE_FIELDS)


def _accepted(pins: dict[str, Any], pool_id: int = 1) -> PoolRules | None:
    cfg = WorkerConfig(pool_id=pool_id, rules=pins)

    async def go() -> PoolRules | None:
        async with rules_server(1, **RULES) as url, \
                SignedClient(url, Account.create().key) as orch:
            return await accepted_rules(orch, cfg, asyncio.Event())
    return asyncio.run(go())


@pytest.mark.parametrize("field", sorted(DRIFT))
def test_a_worker_pinning_another_value_of_any_rule_refuses(field: str) -> None:
    value, named = DRIFT[field]
    with pytest.raises(PoolRulesError) as e:
        _accepted({field: value})
    assert str(e.value) == (f"refusing to start, this worker's [rules] differ from the pool's "
                            f"published rules: {named} (pin the published value or leave the "
                            "rule unset)")


def test_pins_equal_to_the_published_rules_are_accepted() -> None:
    published = PoolRules(pool_id=1, **RULES)
    assert _accepted({}) == published  # nothing pinned: every rule is taken as published
    assert _accepted(RulesPins.of(published).model_dump(mode="json")) == published
    with pytest.raises(PoolRulesError, match="manages pool 1, this worker's pool_id is 2"):
        _accepted({}, pool_id=2)


@pytest.mark.parametrize("field", sorted(DRIFT))
def test_a_work_order_with_changed_rules_stops_the_worker(field: str) -> None:
    started = PoolRules(pool_id=1, **RULES)
    require_same_rules(started, PoolRules(pool_id=1, **RULES))  # the same rules: work on
    now = PoolRules(pool_id=1, **{**RULES, field: DRIFT[field][0]})
    with pytest.raises(PoolRulesError) as e:
        require_same_rules(started, now)
    # the pin is what the worker started with, the published value what the order now says
    assert str(e.value).startswith(f"stopping, the pool's rules changed while running: "
                                   f"rules.{field}")


# ---- real processes ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def net(tmp_path_factory):
    if find_anvil() is None:
        pytest.skip("anvil not installed (run `make setup`)")
    n = start_net(tmp_path_factory.mktemp("drift"))
    yield n
    n.close()


def _error_lines(log: str) -> list[str]:
    return [x for x in log.splitlines() if x.strip() and not x.startswith("{")]


@pytest.mark.slow
def test_a_drifted_worker_process_refuses_before_staking(net: Net) -> None:
    p, n, _ = fund_provider(net, "drift")
    w = worker(net, "drift", rules={"seed": DRIFT["seed"][0]})
    w.start()
    assert w.wait(180) == EXIT_REFUSED, w.log.read_text()[-3000:]
    [line] = _error_lines(w.log.read_text())
    assert line == (f"meshrl worker: refusing to start, this worker's [rules] differ from the "
                    f"pool's published rules: {DRIFT['seed'][1]} (pin the published value or "
                    "leave the rule unset)")
    assert not net.fed.provider(p.address).registered  # nothing staked
    assert net.fed.node(n.address).pool == 0


def _restart_orchestrator(net: Net, **rules: Any) -> None:
    """The same orchestrator (database, port) started again, publishing changed rules."""
    assert net.orch is not None
    port = int(net.orch.url.rsplit(":", 1)[1])
    cfg = {k: v for k, v in _config(net.orch).items() if k != "ready_file"}
    net.orch.stop()
    net.orch = Service("orchestrator", {**cfg, "port": port, "rules": {**RULES, **rules}},
                       net.tmp)
    net.orch.start()
    assert net.orch.url.endswith(f":{port}")


def _config(s: Service) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(s.config.read_text())


def _files(work_dir: Path) -> list[Any]:
    box = work_dir / "outbox"
    return [read_rollout_file(p.read_bytes()).header
            for p in [*box.glob("*.parquet"), *(box / "sent").glob("*.parquet")]]


@pytest.mark.slow
def test_rules_changed_while_running_stop_the_worker_process(net: Net) -> None:
    fund_provider(net, "steady")
    w = worker(net, "steady", max_files=0)  # works until stopped
    w.start()
    work_dir = net.tmp / "w-steady"
    wait_until(lambda: _files(work_dir), 300)  # it works under the published rules
    _restart_orchestrator(net, seed=DRIFT["seed"][0])
    assert w.wait(180) == EXIT_REFUSED, w.log.read_text()[-3000:]
    [line] = _error_lines(w.log.read_text())
    assert line == ("meshrl worker: stopping, the pool's rules changed while running: rules.seed: "
                    "started with 11, the pool now publishes 12")
    files = _files(work_dir)
    started = PoolRules(pool_id=net.pool, **RULES).digest()
    assert files and all(h.rules_sha256 == started for h in files)  # none by the new rules
