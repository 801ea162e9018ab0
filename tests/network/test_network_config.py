"""The network's [chain] table changes only the keys it names: the rest keep the local network's
values (disputable verdicts with a one-minute period, short periods), never the protocol's own
defaults (a one-hour dispute period, which held every verdict of the demo open and stalled its
trainer). Its validators split the files and are bonded and funded at set-up."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from meshrl.network.config import NETWORK_CHAIN, TOKEN, NetworkConfig
from meshrl.network.keys import DevKeys
from meshrl.network.roles import Layout, build_roles, devnet_argv

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_a_chain_table_keeps_the_networks_other_values() -> None:
    c = NetworkConfig.model_validate({"chain": {"unbonding_delay": 900}})
    assert c.chain.unbonding_delay == 900
    assert (c.chain.dispute_period, c.chain.vote_period, c.chain.verdict_bond,
            c.chain.quorum) == (60, 30, 10 * TOKEN, 1)
    assert c.chain.min_stake == NETWORK_CHAIN.min_stake


def test_the_shipped_network_config_has_disputes_on_and_two_validators() -> None:
    raw = tomllib.loads((CONFIGS / "network.toml").read_text())
    c = NetworkConfig.model_validate({"chain": raw["chain"], "validators": raw["validators"]})
    assert c.chain.dispute_period == 60 and c.chain.verdict_bond == 10 * TOKEN
    assert c.validators.count == 2 and c.validators.rogue == 0


def test_a_rogue_needs_an_honest_validator_beside_it() -> None:
    with pytest.raises(ValueError, match="at least one validator must be honest"):
        NetworkConfig.model_validate({"validators": {"count": 2, "rogue": 2}})


def _toml(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def test_validators_split_the_files_and_are_all_given_the_role(tmp_path) -> None:
    cfg = NetworkConfig.model_validate({"dir": str(tmp_path), "dashboard": False,
                                        "validators": {"count": 3, "rogue": 1}})
    lay = Layout(cfg)
    keys = lay.keys()  # a loopback pool: anvil's dev accounts, as before
    devnet = _toml(Path(devnet_argv(lay, keys)[-1]))
    roles = {r.name: r for r in build_roles(lay, keys, 1)}
    names = ["validator", "validator-1", "validator-2"]
    assert [n for n in roles if n.startswith("validator")] == names
    addrs = [keys.validator(j).address for j in range(3)]
    assert devnet["validators"] == addrs and len(set(addrs)) == 3
    # no validator key is another role's
    others = {keys.manager().address, keys.trainer().address, keys.federator().address,
              *(keys.provider(i).address for i in range(4)),
              *(keys.node(i).address for i in range(4))}
    assert not others & set(addrs)
    for j, name in enumerate(names):
        v = _toml(Path(roles[name].argv[-1]))
        assert v["share"] == {"index": j, "of": 3, "audit": 0.1}
        assert v["keys"]["dev_index"] == DevKeys(4).validator_dev_index(j)
        assert v["rogue"]["mode"] == ("accuse-honest" if j == 2 else "none")
        assert v["bond_verdicts"] == 32 and v["work_dir"].endswith(name)


def test_the_shipped_pool_config_trains_until_stopped_drains_and_its_workers_claim(
        tmp_path) -> None:
    """configs/pool.toml over configs/network.toml: no accuracy target or step budget ends the
    pool, a stop drains it (network/closing.py), and the pool's own workers claim."""
    from meshrl.config import load_config

    cfg = load_config(NetworkConfig, [CONFIGS / "network.toml", CONFIGS / "pool.toml"],
                      [f"--dir={tmp_path}"])
    assert cfg.on_stop == "drain" and cfg.claim_window_s >= 600 and cfg.max_minutes == 0
    assert cfg.train["stop_at_accuracy"] > 1 and cfg.train["steps"] >= 10**6
    lay = Layout(cfg)
    roles = {r.name: r for r in build_roles(lay, lay.keys(), 1)}
    worker = _toml(Path(roles["worker-0"].argv[-1]))
    assert worker["claim_every_s"] == cfg.workers.claim_every_s > 0


def test_the_shipped_tools_config_runs_episodes_with_a_lying_calculator(tmp_path) -> None:
    """configs/network_tools.toml over configs/network.toml (`make demo-network-tools`): the
    pool's task runs episodes with the calculator, the trainer warm-starts on tool-use traces
    under the pool's rules, and its cheater is the lying tool."""
    from meshrl.config import load_config
    from meshrl.pool.episode import max_segments
    from meshrl.rl.config import RLConfig
    from meshrl.tasks import TasksConfig

    cfg = load_config(NetworkConfig, [CONFIGS / "network.toml", CONFIGS / "network_tools.toml"],
                      [f"--dir={tmp_path}"])
    tasks = TasksConfig.model_validate(cfg.pool.task).build()
    assert tasks.names == ["tool_arithmetic"] and max_segments(tasks) == 3
    lay = Layout(cfg)
    roles = {r.name: r for r in build_roles(lay, lay.keys(), 1)}
    cheat = _toml(Path(roles["cheater-0"].argv[-1]))["cheat"]
    assert cheat["mode"] == "forge-tools"
    assert all(_toml(Path(roles[f"worker-{i}"].argv[-1]))["cheat"]["mode"] == "none"
               for i in range(cfg.workers.honest))
    trainer = load_config(RLConfig, [Path(a) for a in roles["trainer"].argv[-2:]])
    assert trainer.model.preset == "qwen2-tiny" and trainer.sft.max_steps == 150
    assert trainer.rollout.max_new_tokens == 64 and trainer.tasks.mix[0].type == "tool_arithmetic"


def test_the_batched_config_publishes_its_batch_rule_to_every_role(tmp_path) -> None:
    """configs/batched.toml over configs/network.toml: the orchestrator publishes the batch
    rule, and every worker's and validator's pins carry it (a role that differs refuses)."""
    from meshrl.config import load_config

    cfg = load_config(NetworkConfig, [CONFIGS / "network.toml", CONFIGS / "batched.toml"],
                      [f"--dir={tmp_path}"])
    assert cfg.pool.rules().batch.files == 4 and cfg.pool.rules().batch.max_delay_s == 0.5
    lay = Layout(cfg)
    roles = {r.name: r for r in build_roles(lay, lay.keys(), 1)}
    orch = _toml(Path(roles["orchestrator"].argv[-1]))
    assert orch["rules"]["batch"] == {"files": 4, "max_delay_s": 0.5}
    for name in ("worker-0", "validator", "validator-1"):
        assert _toml(Path(roles[name].argv[-1]))["rules"]["batch"]["files"] == 4, name
    plain = load_config(NetworkConfig, [CONFIGS / "network.toml"], [f"--dir={tmp_path}"])
    assert plain.pool.rules().batch.files == 1  # the default network submits per file


def test_a_public_pool_gets_the_slack_and_turnaround_orders_of_far_members(tmp_path) -> None:
    """configs/network.toml leaves async_level to its default: 2 on loopback (the demo, as it
    was, its orchestrator wanting files without measuring lags), 24 with `public_host`, with
    work orders sized by each member's measured lag (docs/joining.md, remote members); the
    orchestrator, the trainer and the origin's kept versions all follow it, and a value the
    operator names wins."""
    from meshrl.config import load_config

    def roles(*extra: str) -> dict:
        cfg = load_config(NetworkConfig, [CONFIGS / "network.toml"],
                          [f"--dir={tmp_path / str(len(extra))}", *extra])
        lay = Layout(cfg)
        return {r.name: r for r in build_roles(lay, lay.keys(), 1)}

    def seen(rs: dict) -> tuple[int, int, bool, str]:
        orch = _toml(Path(rs["orchestrator"].argv[-1]))
        trainer = _toml(Path(rs["trainer"].argv[-1]))
        argv = rs["origin"].argv
        return (orch["rules"]["async_level"], trainer["async_level"],
                orch["work"]["turnaround_orders"], argv[argv.index("--keep") + 1])

    assert seen(roles()) == (2, 2, False, "6")
    assert seen(roles("--public_host=127.0.0.1")) == (24, 24, True, "28")
    assert seen(roles("--public_host=127.0.0.1", "--pool.async_level=5"))[:2] == (5, 5)
