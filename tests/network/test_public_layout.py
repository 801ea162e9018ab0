"""`public_host`: the pool's public roles listen and are advertised on it, the chain behind a
filter; anvil and the dashboard stay on loopback; keys travel in 0600 files, never argv (and are
the run's own: tests/network/test_pool_keys.py)."""

from __future__ import annotations

import tomllib

import pytest

from meshrl.config import ConfigError, load_config
from meshrl.network.config import NetworkConfig
from meshrl.network.roles import Layout, anvil_role, build_roles


def _layout(tmp_path, *over: str) -> Layout:
    return Layout(load_config(NetworkConfig, [], ["--dir", str(tmp_path), "--base_port",
                                                  "20000", *over]))


def _toml(lay: Layout, role: str) -> dict:
    return tomllib.loads(lay.config_path(role).read_text())


def test_public_roles_bind_and_advertise_the_public_host(tmp_path) -> None:
    lay = _layout(tmp_path, "--public_host", "127.0.0.2", "--anvil", "/bin/true")
    keys = lay.keys()
    roles = {r.name: r for r in build_roles(lay, keys, 1)}
    assert roles["rpc-filter"].argv[-6:] == ["--upstream", "http://127.0.0.1:20000", "--host",
                                             "127.0.0.2", "--port", "20014"]
    assert lay.public_rpc_url == "http://127.0.0.2:20014"
    assert _toml(lay, "discovery")["host"] == "127.0.0.2"
    orch = _toml(lay, "orchestrator")
    assert orch["host"] == "127.0.0.2"
    assert orch["work"]["shardcast_servers"] == ["http://127.0.0.2:20004",
                                                 "http://127.0.0.2:20005",
                                                 "http://127.0.0.2:20003"]
    assert orch["onboarding"]["discovery_url"] == "http://127.0.0.2:20001"
    assert orch["chain"]["rpc_url"] == "http://127.0.0.1:20000"  # the same host: anvil itself
    assert orch["join"] == {"rpc_url": "http://127.0.0.2:20014",  # strangers: the filter
                            "discovery_url": "http://127.0.0.2:20001",
                            "trainer": keys.trainer().address}
    assert "--server.host" in roles["origin"].argv and "127.0.0.2" in roles["relay-0"].argv
    assert _toml(lay, "worker-0")["orchestrator_url"] == "http://127.0.0.2:20002"
    assert anvil_role(lay).argv[1:3] == ["--host", "127.0.0.1"]
    assert "127.0.0.1:20015" in roles["dashboard"].health
    # keys: a 0600 file named in the config, never a key in argv or in a config file
    key_file = orch["chain"]["key_file"]
    assert oct((tmp_path / "network" / "keys" / "manager.key").stat().st_mode & 0o777) == "0o600"
    assert key_file.endswith("manager.key") and "private_key" not in orch["chain"]
    manager_hex = "0x" + bytes(keys.manager().key).hex()
    for r in roles.values():
        assert not any(manager_hex in a for a in r.argv)
    for path in (tmp_path / "network" / "configs").iterdir():
        assert "private_key" not in path.read_text()


def test_loopback_pool_has_no_filter(tmp_path) -> None:
    lay = _layout(tmp_path, "--anvil", "/bin/true")
    roles = {r.name for r in build_roles(lay, lay.keys(), 1)}
    assert "rpc-filter" not in roles and lay.public_rpc_url == lay.rpc_url
    assert _toml(lay, "orchestrator")["host"] == "127.0.0.1"


@pytest.mark.parametrize("bad", ["0.0.0.0", "http://x", "a b"])
def test_public_host_must_be_routable(tmp_path, bad) -> None:
    with pytest.raises(ConfigError, match="public_host"):
        _layout(tmp_path, "--public_host", bad)
