"""A contributor's chain commands: `meshrl keys new`, `chain send`, `chain rewards` (one
provider's work, read by topic filters and batches) and `chain claim`, keys from files only."""

from __future__ import annotations

import json
import os

import pytest
from eth_account import Account

from meshrl.cli import main
from meshrl.protocol.history import pool_history, provider_rewards
from meshrl.protocol.keystore import KeystoreError, load_key_file, write_key_file, write_keystore

from .helpers import RATE, TOKEN, file_hash


def _run(capsys, *args: str) -> tuple[int, list[dict], str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def test_keys_new_writes_private_keystores(tmp_path, capsys) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    args = ["keys", "new", "--dir", str(tmp_path / "k"), "--password_file", str(pw),
            "--kdf_iterations", "2"]
    rc, out, _ = _run(capsys, *args)
    assert rc == 0 and set(out[0]) == {"provider", "node"}
    for name in ("provider", "node"):
        path = tmp_path / "k" / f"{name}.json"
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        account = load_key_file(str(path), str(pw))
        assert account.address == out[0][name]["address"]
    assert out[0]["provider"]["address"] != out[0]["node"]["address"]
    rc, _, err = _run(capsys, *args)  # never overwrites keys silently
    assert rc == 1 and "exist" in err
    rc, again, _ = _run(capsys, *args, "--force")
    assert rc == 0 and again[0]["node"]["address"] != out[0]["node"]["address"]
    # no password file and no terminal (pytest's stdin): refused, nothing asked on argv
    rc, _, err = _run(capsys, "keys", "new", "--dir", str(tmp_path / "k2"))
    assert rc == 1 and "--password_file" in err and not (tmp_path / "k2").exists()


def test_key_files_hex_and_keystore(tmp_path) -> None:
    a = Account.create()
    path = write_key_file(a, tmp_path / "a.key")
    assert load_key_file(str(path)).address == a.address
    os.chmod(path, 0o644)
    with pytest.raises(KeystoreError, match="readable by others"):
        load_key_file(str(path))
    write_keystore(a, "pw", tmp_path / "a.json", iterations=2)
    assert load_key_file(str(tmp_path / "a.json"), password_env="PW",
                         env={"PW": "pw"}).address == a.address
    with pytest.raises(KeystoreError, match="no password"):
        load_key_file(str(tmp_path / "a.json"), password_env="PW", env={})


def _submit(world, n: int) -> None:
    """p1's node n1 submits n files; p2's node n3 joins and submits 2 (others' work)."""
    for i in range(n):
        world.p1.submit_work(world.pool, world.n1.address, file_hash(f"p1-{i}"), 10 + i)
    world.p2.join_pool(*world.invite(world.pool, world.n3.address, nonce=7))
    for i in range(2):
        world.p2.submit_work(world.pool, world.n3.address, file_hash(f"p2-{i}"), 5)


def test_provider_rewards_is_the_pool_history_of_one_provider(world) -> None:
    _submit(world, 3)
    view = provider_rewards(world.fed, world.pool, world.p1.address)
    assert len(view["works"]) == 3 and {w["node"] for w in view["works"]} == {world.n1.address}
    full = pool_history(world.fed, world.pool)
    assert view["nodes"] == {world.n1.address.lower(): full["rewards"][world.n1.address.lower()]}
    assert view["rewards"]["earned"] == (10 + 11 + 12) * RATE
    assert view["rewards"]["claimable"] == 0  # locked
    world.backend.advance_time(86400 + 1)
    view = provider_rewards(world.fed, world.pool, world.p1.address)
    assert view["rewards"]["claimable"] == 33 * RATE and all(w["claimable"] for w in view["works"])
    other = provider_rewards(world.fed, world.pool, world.p2.address)
    assert len(other["works"]) == 2 and other["rewards"]["earned"] == 10 * RATE
    assert provider_rewards(world.fed, world.pool, world.stranger.address)["works"] == []


@pytest.mark.anvil
@pytest.mark.parametrize("base_world", ["anvil"], indirect=True)
def test_send_rewards_claim_with_key_files(world, tmp_path, capsys) -> None:
    dep = tmp_path / "dep.json"
    world.fed.deployment.save(dep)
    pw = tmp_path / "pw"
    pw.write_text("pw")
    keystore = write_keystore(world.p1.account, "pw", tmp_path / "p1.json", iterations=2)
    common = ["--chain.rpc_url", world.backend.url, "--chain.deployment", str(dep)]
    as_p1 = [*common, "--chain.key_file", str(keystore), "--chain.password_file", str(pw)]
    to = Account.create().address
    rc, out, _ = _run(capsys, "chain", "send", *as_p1, "--to", to, "--ether", "0.5",
                      "--tokens", "7")
    assert rc == 0 and out[0]["eth"] == 5 * 10**17 and out[0]["token_balance"] == 7 * TOKEN
    rc, _, err = _run(capsys, "chain", "send", *as_p1, "--to", to)
    assert rc == 1 and "--ether" in err

    _submit(world, 3)
    rc, out, _ = _run(capsys, "chain", "rewards", *common, "--pool", str(world.pool),
                      "--provider", world.p1.address)
    assert rc == 0 and out[0]["rewards"] == {"earned": 33 * RATE, "claimable": 0, "claimed": 0}
    rc, out, _ = _run(capsys, "chain", "claim", *as_p1, "--pool", str(world.pool))
    assert rc == 0 and out[0]["claimed_items"] == 0  # still locked: nothing to claim
    world.backend.advance_time(86400 + 1)
    rc, out, _ = _run(capsys, "chain", "claim", *as_p1, "--pool", str(world.pool), "--batch", "2")
    assert rc == 0 and out[0]["claimed_items"] == 3 and out[0]["amount"] == 33 * RATE
    assert len(out[0]["txs"]) == 2
    rc, out, _ = _run(capsys, "chain", "rewards", *as_p1, "--pool", str(world.pool))
    assert out[0]["rewards"] == {"earned": 33 * RATE, "claimable": 0, "claimed": 33 * RATE}
    rc, _, err = _run(capsys, "chain", "claim", *common, "--chain.key_file",
                      str(tmp_path / "nope.json"))
    assert rc == 1 and "not found" in err
