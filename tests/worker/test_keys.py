import json

import pytest
from eth_account import Account

from meshrl.worker.config import KeysConfig
from meshrl.worker.keys import KeystoreError, dev_account, load_keys, write_keystore


def test_dev_keys_are_anvils_test_accounts():
    keys = load_keys(KeysConfig(dev_index=0), chain_id=31337)
    # account 0 of anvil's mnemonic is its well-known first dev account (the federator)
    assert dev_account(0).address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert keys.provider.address == dev_account(1).address
    assert keys.node.address == dev_account(2).address
    assert load_keys(KeysConfig(dev_index=1), 31337).node.address == dev_account(4).address


def test_dev_keys_refused_on_a_public_chain():
    with pytest.raises(KeystoreError, match="local chains"):
        load_keys(KeysConfig(dev_index=0), chain_id=84532)


@pytest.fixture
def keystores(tmp_path):
    p, n = Account.create(), Account.create()
    write_keystore(p, "pw", tmp_path / "p.json", iterations=2)
    write_keystore(n, "pw", tmp_path / "n.json", iterations=2)
    cfg = KeysConfig(provider_keystore=str(tmp_path / "p.json"),
                     node_keystore=str(tmp_path / "n.json"), password_env="PW")
    return p, n, cfg


def test_keystores_with_password_from_env_or_file(keystores, tmp_path):
    p, n, cfg = keystores
    keys = load_keys(cfg, 84532, env={"PW": "pw"})
    assert (keys.provider.address, keys.node.address) == (p.address, n.address)
    (tmp_path / "pw.txt").write_text("pw\n")
    cfg2 = cfg.model_copy(update={"password_file": str(tmp_path / "pw.txt")})
    assert load_keys(cfg2, 84532, env={}).node.key == n.key
    assert oct((tmp_path / "p.json").stat().st_mode & 0o777) == "0o600"


def test_key_errors_say_what_is_wrong(keystores, tmp_path):
    _, _, cfg = keystores
    with pytest.raises(KeystoreError, match=r"node keystore .* not found"):
        load_keys(cfg.model_copy(update={"node_keystore": str(tmp_path / "nope")}), 1,
                  env={"PW": "pw"})
    with pytest.raises(KeystoreError, match="no password"):
        load_keys(cfg, 1, env={})
    with pytest.raises(KeystoreError, match="cannot decrypt the provider"):
        load_keys(cfg, 1, env={"PW": "wrong"})
    (tmp_path / "p.json").write_text("{not json")
    with pytest.raises(KeystoreError, match="not JSON"):
        load_keys(cfg, 1, env={"PW": "pw"})
    (tmp_path / "p.json").write_text(json.dumps({"version": 3}))
    with pytest.raises(KeystoreError, match="malformed"):
        load_keys(cfg, 1, env={"PW": "pw"})


def test_dev_index_and_keystores_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        KeysConfig(dev_index=0, node_keystore="x.json")
