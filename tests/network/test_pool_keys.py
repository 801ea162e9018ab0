"""Issue #41: a pool opened to other hosts (`public_host`) never runs on anvil's public test
mnemonic. `network up` generates the run's own keys for it (0600 files in the run directory,
kept across restarts, funded on the local chain, named by `GET /join`) and refuses, in one
line, any role key anyone can derive; a loopback demo keeps the dev keys."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from eth_account import Account

from meshrl.config import load_config
from meshrl.network.config import NetworkConfig
from meshrl.network.keys import (
    ANVIL_MNEMONIC,
    WELL_KNOWN_ADDRESSES,
    DevKeys,
    PoolKeyError,
    WellKnownKeyError,
    write_key_file,
)
from meshrl.network.roles import Layout, build_roles
from meshrl.network.supervisor import Supervisor
from meshrl.network.up import _devnet
from meshrl.validator.config import ValidatorKeysConfig
from meshrl.validator.keys import load_validator_key
from meshrl.worker.config import KeysConfig
from meshrl.worker.keys import load_keys

ROOT = Path(__file__).resolve().parents[2]


def _layout(tmp_path: Path, *over: str) -> Layout:
    return Layout(load_config(NetworkConfig, [], ["--dir", str(tmp_path), "--base_port",
                                                  "20000", "--dashboard", "false", *over]))


def _toml(lay: Layout, role: str) -> dict:
    return tomllib.loads(lay.config_path(role).read_text())


def _derived(i: int) -> str:
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").address


def test_well_known_keys_are_the_test_mnemonics_accounts() -> None:
    from meshrl.network.keys import well_known_index

    assert [_derived(i) for i in range(20)] == list(WELL_KNOWN_ADDRESSES)
    assert well_known_index(WELL_KNOWN_ADDRESSES[11].lower()) == 11  # the old trainer
    assert well_known_index(_derived(25)) is None  # past the listed ones only when asked
    assert well_known_index(_derived(25), upto=30) == 25
    assert well_known_index(Account.create().address, upto=30) is None


def test_public_pool_generates_private_keys_and_keeps_them(tmp_path) -> None:
    lay = _layout(tmp_path, "--public_host", "127.0.0.2")
    keys = lay.keys()
    assert keys.source == "generate"
    kdir = tmp_path / "network" / "keys"
    files = sorted(p.name for p in kdir.iterdir())
    assert files == sorted(["federator.key", "manager.key", "trainer.key", "password",
                            "validator.json", "validator-1.json",
                            *(f"{w}-{part}.json" for w in ("worker-0", "worker-1", "worker-2",
                                                            "cheater-0")
                              for part in ("provider", "node"))])
    for p in kdir.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    addrs = [a.address for a in keys.accounts.values()]
    assert len(set(addrs)) == len(addrs) == 13  # 3 + 2 validators + 4 workers x 2
    dev = {_derived(i).lower() for i in range(40)}
    assert not dev & {a.lower() for a in addrs}
    # a restart of the same run reads the same keys
    again = lay.keys()
    assert {r: a.address for r, a in again.accounts.items()} == \
        {r: a.address for r, a in keys.accounts.items()}
    # the roles are given them, in forms their own loaders open
    roles = {r.name: r for r in build_roles(lay, keys, 1)}
    orch = _toml(lay, "orchestrator")
    assert orch["join"]["trainer"] == keys.trainer().address
    assert orch["rules"]["policy_signer"] == keys.trainer().address
    assert orch["chain"]["key_file"] == str(kdir / "manager.key")
    assert "--publisher" in roles["relay-0"].argv
    assert roles["relay-0"].argv[roles["relay-0"].argv.index("--publisher") + 1] == \
        keys.trainer().address
    v = _toml(lay, "validator-1")["keys"]
    assert load_validator_key(ValidatorKeysConfig(**v), 31337, env={}).address == \
        keys.validator(1).address
    w = _toml(lay, "cheater-0")["keys"]
    wk = load_keys(KeysConfig(**w), 31337, env={})
    assert (wk.provider.address, wk.node.address) == (keys.provider(3).address,
                                                      keys.node(3).address)
    assert _toml(lay, "trainer")["network"]["key_file"] == str(kdir / "trainer.key")


def test_public_pool_refuses_well_known_keys_by_role(tmp_path) -> None:
    with pytest.raises(WellKnownKeyError) as e:
        _layout(tmp_path, "--public_host", "127.0.0.2", "--keys.source", "dev").keys()
    assert (e.value.role, e.value.index) == ("federator", 0)
    # the operator's own keys directory: a dev trainer key among fresh ones is refused by name
    own = tmp_path / "own"
    write_key_file(DevKeys(4).trainer(), own / "trainer.key")
    with pytest.raises(WellKnownKeyError) as e:
        _layout(tmp_path, "--public_host", "127.0.0.2", "--keys.dir", str(own)).keys()
    assert (e.value.role, e.value.address, e.value.index) == \
        ("trainer", DevKeys(4).trainer().address, 11)
    assert "\n" not in str(e.value)
    # a run first started on loopback (dev keys) is not opened to other hosts on them
    _layout(tmp_path, "--name", "demo").keys()
    with pytest.raises(WellKnownKeyError, match="federator"):
        _layout(tmp_path, "--name", "demo", "--public_host", "127.0.0.2").keys()
    # a key file others can read is refused too
    os.chmod(own / "trainer.key", 0o644)
    with pytest.raises(PoolKeyError, match="readable by others"):
        _layout(tmp_path, "--keys.dir", str(own)).keys()


def test_loopback_demo_keeps_dev_keys_and_never_overwrites_generated_ones(tmp_path) -> None:
    lay = _layout(tmp_path)
    keys = lay.keys()
    dev = DevKeys(4)
    assert keys.source == "dev" and keys.trainer().address == dev.trainer().address
    build_roles(lay, keys, 1)
    assert _toml(lay, "worker-1")["keys"] == {"dev_index": 1}
    assert _toml(lay, "validator-1")["keys"] == {"dev_index": dev.validator_dev_index(1)}
    # generated keys stay the run's: `auto` keeps them, `dev` refuses to overwrite them
    gen = _layout(tmp_path, "--name", "gen", "--keys.source", "generate").keys()
    assert _layout(tmp_path, "--name", "gen").keys().trainer().address == gen.trainer().address
    with pytest.raises(PoolKeyError, match="another key"):
        _layout(tmp_path, "--name", "gen", "--keys.source", "dev").keys()
    assert _layout(tmp_path, "--name", "gen").keys().federator().address == \
        gen.federator().address


def test_network_up_on_dev_keys_with_a_public_host_is_refused_in_one_line(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-m", "meshrl.cli", "network", "up", "--dir",
                          str(tmp_path), "--public_host", "127.0.0.2", "--keys.source", "dev",
                          "--base_port", "20100", "--anvil", "/bin/true"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"meshrl network up: keys: the federator key "
                               f"{WELL_KNOWN_ADDRESSES[0]} is account 0 of anvil's public test "
                               "mnemonic"), lines[0]
    assert not (tmp_path / "network" / "configs").exists()  # nothing was started


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read(1 << 20))


@pytest.mark.anvil
def test_generated_keys_own_the_chain_and_join_names_them(tmp_path) -> None:
    """Real anvil, the real `meshrl chain devnet` and orchestrator processes `up` starts: the
    generated federator (funded by anvil_setBalance, no dev account involved) deploys, the
    generated manager runs the pool, the validators have the role, and `GET /join` names the
    generated trainer."""
    from meshrl.protocol import Deployment, Protocol
    from meshrl.protocol.anvil import AnvilNode

    # clear of `run_network`'s 21000-27040, which a parallel worker may be using (make test)
    base = 28000 + (os.getpid() % 100) * 20
    lay = _layout(tmp_path, "--public_host", "127.0.0.2", "--base_port", str(base))
    node = AnvilNode(port=base)
    backend = node.start()
    orch = None
    try:
        keys = lay.keys()
        (lay.root / "logs").mkdir(parents=True)
        sup = Supervisor(lay.root, 1.0, 3)
        pool = _devnet(sup, lay, keys)
        p = Protocol(backend, Deployment.load(lay.deployment))
        assert p.federator() == keys.federator().address
        assert p.pool(pool).manager == keys.manager().address
        assert all(p.is_validator(keys.validator(j).address) for j in range(2))
        assert not any(p.is_validator(a) for a in WELL_KNOWN_ADDRESSES)
        spec = next(r for r in build_roles(lay, keys, pool) if r.name == "orchestrator")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        with (tmp_path / "orchestrator.log").open("wb") as log:
            orch = subprocess.Popen(spec.argv, cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                manifest = _get(lay.orchestrator_url + "/join")
                break
            except OSError:
                assert orch.poll() is None, (tmp_path / "orchestrator.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the orchestrator did not answer"
                time.sleep(0.3)
        assert manifest["trainer"] == keys.trainer().address
        assert manifest["rules"]["policy_signer"] == keys.trainer().address
        assert manifest["rpc_url"] == lay.public_rpc_url
    finally:
        if orch is not None:
            orch.terminate()
            orch.wait(30)
        node.stop()
