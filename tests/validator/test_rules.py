"""A validator judges by the pool's published rules only (`GET /rules`, served here by the
orchestrator's own route): a `[rules]` pin that differs from the published value, for any rule
field, refuses it at start with one line naming that field; published rules that change while
it runs stop it the same way; and so an operator's typo never judges an honest file (the old
defect: a validator configured with seed 8 where the pool publishes 7 hard-invalidated every
honest file)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from helpers import claim, honest_file, rules, rules_server

from meshrl.config import EXIT_REFUSED
from meshrl.pool import RULE_FIELDS, Check, PoolRules, PoolRulesError, RulesPins, VerdictKind
from meshrl.protocol import deploy
from meshrl.protocol.anvil import AnvilNode, find_anvil
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.judge import replay_config
from meshrl.validator.node import ValidatorNode
from meshrl.validator.verify import verify_file
from meshrl.wire import SignedClient
from network import PARAMS, key
from orchestrator.net import SRC, write_toml

# what the pool publishes: every field away from its default, so a pin of the default drifts
PUBLISHED: PoolRules = rules(max_new=8, prompts=2, group=4, async_level=2, seed=7).model_copy(
    update={"files_per_step": 3, "proof_profile": "meshrl-cpu-engine",
            "policy_signer": "0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A"})
SERVED: dict[str, Any] = PUBLISHED.model_dump(mode="json", exclude={"pool_id"})


@dataclass(frozen=True)
class Drift:
    """A pin of one rule field to another value than the published one, and the leaf of that
    field a refusal names with both values as it writes them."""

    value: Any
    leaf: str
    mine: str
    theirs: str


DRIFTED: dict[str, Drift] = {
    "task": Drift({"mix": [{"type": "arithmetic", "digits": 3, "operators": "+-"}]},
                  "task.mix.0.digits", "3", "2"),
    "sampling": Drift({**SERVED["sampling"], "temperature": 0.7}, "sampling.temperature",
                      "0.7", "1.0"),
    "group_size": Drift(8, "group_size", "8", "4"),
    "prompts_per_file": Drift(3, "prompts_per_file", "3", "2"),
    "files_per_step": Drift(1, "files_per_step", "1", "3"),
    "async_level": Drift(0, "async_level", "0", "2"),
    "seed": Drift(8, "seed", "8", "7"),
    "proof_profile": Drift("any-hardware", "proof_profile", "'any-hardware'",
                           "'meshrl-cpu-engine'"),
    "prompt_format": Drift("auto", "prompt_format", "'auto'", "'raw'"),
    "policy_signer": Drift("0x1563915e194D8CfBA1943570603F7606A3115508", "policy_signer",
                           "'0x1563915e194D8CfBA1943570603F7606A3115508'",
                           "'0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A'"),
    "replay": Drift({"rows_fraction": 1.0}, "replay.rows_fraction", "1.0", "0.25"),
    "batch": Drift({"files": 4, "max_delay_s": 10.0}, "batch.files", "4", "1"),
}


def test_every_rule_field_has_a_drift_case():
    assert set(DRIFTED) == set(RULE_FIELDS)
    assert PoolRules(pool_id=1, **SERVED) == PUBLISHED  # the server publishes PUBLISHED


async def _start(url: str, pins: dict[str, Any], **cfg: Any) -> tuple[ValidatorNode, PoolRules]:
    """What a validator does at start with these pins: read the published rules and check them
    (`ValidatorNode._rules`, raising `PoolRulesError` to refuse)."""
    node = ValidatorNode(ValidatorConfig(orchestrator_url=url, rules=pins, **cfg),
                         Account.create())
    async with SignedClient(url, node.account.key) as orch:
        return node, await node._rules(orch)


def _refusal(pins: dict[str, Any]) -> str:
    async def go() -> None:
        async with rules_server(1, **SERVED) as url:
            await _start(url, pins)

    with pytest.raises(PoolRulesError) as e:
        asyncio.run(go())
    return str(e.value)


@pytest.mark.slow  # a validator (and a chain) per case: not in test-fast
@pytest.mark.parametrize("field", RULE_FIELDS)
def test_a_drifted_rule_refuses_the_validator_naming_the_field(field):
    d = DRIFTED[field]
    everything = RulesPins.of(PUBLISHED).model_dump(mode="json")
    # the one rule pinned, or every rule pinned to the published value but this one
    for pins in ({field: d.value}, {**everything, field: d.value}):
        assert _refusal(pins) == (
            "refusing to start, this validator's [rules] differ from the pool's published "
            f"rules: rules.{d.leaf}: configured {d.mine}, the pool publishes {d.theirs} (pin "
            "the published value or leave the rule unset)")


def test_pins_equal_to_the_published_rules_start_and_unset_ones_take_them():
    async def go(pins: dict[str, Any]) -> PoolRules:
        async with rules_server(1, **SERVED) as url:
            node, got = await _start(url, pins)
            assert node.rules == got
            return got

    everything = RulesPins.of(PUBLISHED).model_dump(mode="json")
    assert asyncio.run(go(everything)) == PUBLISHED
    assert asyncio.run(go({})) == PUBLISHED  # nothing pinned: judged by the published rules
    assert asyncio.run(go({"seed": 7, "task": {"type": "arithmetic", "digits": 2,
                                                "operators": "+-"}})) == PUBLISHED


@pytest.mark.slow  # a validator (and a chain) per case: not in test-fast
@pytest.mark.parametrize("field", RULE_FIELDS)
def test_a_rule_changed_while_running_stops_the_validator_naming_the_field(field):
    """The next read of `GET /rules` (every `rules_check_s`) sees the changed rule."""
    d = DRIFTED[field]

    async def go() -> str:
        async with rules_server(1, then={field: d.value}, **SERVED) as url:
            node, started = await _start(url, {}, rules_check_s=0.001)
            assert started == PUBLISHED
            await asyncio.sleep(0.01)
            async with SignedClient(url, node.account.key) as orch:
                with pytest.raises(PoolRulesError) as e:
                    await node._recheck_rules(orch)
            return str(e.value)

    assert asyncio.run(go()) == ("stopping, the pool's rules changed while running: "
                                 f"rules.{d.leaf}: started with {d.theirs}, the pool now "
                                 f"publishes {d.mine}")


@pytest.mark.slow  # a validator (and a chain) per case: not in test-fast
def test_an_honest_file_is_judged_by_the_published_rules_never_a_drifted_pin(engine, tok):
    """Pins equal to the published rules: the honest file is accepted. A pin of seed 8 where
    the pool publishes 7: refused before it judges anything, where judging by its own value
    would have slashed the honest worker (the old defect)."""
    published = rules(max_new=16, seed=7)
    honest = honest_file(engine, tok, published)

    async def start(pins: dict[str, Any]) -> tuple[ValidatorNode, PoolRules]:
        served = published.model_dump(mode="json", exclude={"pool_id"})
        async with rules_server(1, **served) as url:
            return await _start(url, pins)

    node, by = asyncio.run(start(RulesPins.of(published).model_dump(mode="json")))
    d = verify_file(engine, tok, honest, claim(honest), by, by.task.build(),
                    replay_config(node.cfg, by))
    assert d.kind is VerdictKind.ACCEPT, d.reason
    with pytest.raises(PoolRulesError, match=r"rules\.seed: configured 8, the pool publishes 7"):
        asyncio.run(start({"seed": 8}))
    # what a validator judging by its own seed would have done to this honest file
    local = published.model_copy(update={"seed": 8})
    d = verify_file(engine, tok, honest, claim(honest), local, local.task.build(),
                    replay_config(node.cfg, local))
    assert d.kind is VerdictKind.HARD_INVALID
    assert {Check.RULES, Check.PROMPTS, Check.SAMPLING_SEED} <= set(d.checks), d.reason


# ---- a real `meshrl validator` process on a real chain, stopped by a change of the rules ------
@contextmanager
def served(server: AbstractAsyncContextManager[str]) -> Iterator[str]:
    """An async server context (here `rules_server`) run on its own thread's event loop, so a
    process or blocking code can talk to it; yields its url."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(30)
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@pytest.mark.slow  # a validator (and a chain) per case: not in test-fast
@pytest.mark.anvil
def test_a_running_validator_process_stops_refused_when_the_rules_change(tmp_path: Path):
    """A real `meshrl validator` on a real chain starts under the published rules, then sees
    the pool's seed change: it exits `EXIT_REFUSED` with one line naming the field."""
    if find_anvil() is None:
        pytest.skip("anvil not installed (run `make setup`)")
    anvil = AnvilNode()
    with anvil as backend:
        fed = key("fed")
        backend.fund(fed.address, 10**21)
        deploy(backend, fed, PARAMS).save(tmp_path / "deployment.json")
        with served(rules_server(1, then={"seed": 8}, **SERVED)) as url:
            cfg = write_toml(tmp_path / "validator.toml", {
                "pool_id": 1, "orchestrator_url": url, "work_dir": str(tmp_path / "v"),
                "poll_interval": 0.2, "rules_check_s": 0.5,
                "chain": {"deployment": str(tmp_path / "deployment.json"), "rpc_url": anvil.url},
                "rules": {"proof_profile": "meshrl-cpu-engine"}})  # agrees: it starts
            proc = subprocess.run([sys.executable, "-m", "meshrl.cli", "validator", str(cfg)],
                                  capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYTHONPATH": str(SRC)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_REFUSED, out[-3000:]
    assert '"msg": "pool rules"' in out  # it started under the published rules
    [line] = [x for x in out.splitlines() if x.strip() and not x.startswith("{")]
    assert line == ("meshrl validator: stopping, the pool's rules changed while running: "
                    "rules.seed: started with 7, the pool now publishes 8"), line
