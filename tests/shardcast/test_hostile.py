"""Hostile peers, each a real process on loopback: servers that forge a version, advertise
version 10**15, serve a manifest with a NUL in a name, answer `{}` or a megabyte of listing, or
claim shards a version does not have. Relays and clients believe only manifests signed by the
publisher, refuse every such answer with a typed reason at the cost of that server alone, and
still get every real version from the honest servers beside them (the control in each test)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrl.cli import main as cli
from meshrl.shardcast import ClientConfig, RefusalReason, VersionNotFoundError, sign_manifest
from meshrl.shardcast.manifest import FileEntry, Manifest, build_manifest

from .conftest import (
    KEY,
    KEY_FILE,
    PUBLISHER,
    RUN,
    SHARD,
    SRC_ROOT,
    get_json,
    make_file,
    run,
    signed_client,
    spawn_service,
)

HOSTILE = Path(__file__).with_name("hostile.py")
OTHER_KEY = "0x" + "66" * 32  # a key that is not the publisher's
FAST = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=15, fsync=False,
                    long_poll=2.0)
ENV = {**os.environ, "PYTHONPATH": str(SRC_ROOT)}


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def hostile(procs: list, tmp_path: Path, name: str, routes: dict) -> str:
    """Start a hostile server answering `routes` (see hostile.py); its URL."""
    spec = tmp_path / f"{name}.json"
    spec.write_text(json.dumps(routes))
    p = subprocess.Popen([sys.executable, str(HOSTILE), str(spec)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=ENV, text=True)
    procs.append(p)
    return p.stdout.readline().strip()


def origin(procs: list, tmp_path: Path, name: str = "origin", run: str = RUN
           ) -> tuple[Path, str]:
    """An honest origin process of `run` (its store is published into by `meshrl shardcast
    publish`)."""
    root = tmp_path / name
    p, url = spawn_service(["origin", "--root", str(root), "--server.port", "0", "--run", run,
                            "--server.scan_interval", "0.05"], tmp_path / f"{name}.log")
    procs.append(p)
    return root, url


def publish(root: Path, src: Path, version: int, run: str = RUN) -> None:
    assert cli(["shardcast", "publish", "--key_file", KEY_FILE, "--run", run, "--src", str(src),
                "--root", str(root), "--version", str(version), "--shard_size", str(SHARD)]) == 0


def listing(*versions: int) -> dict:
    return {"json": {"latest": max(versions), "complete": list(versions), "partial": []}}


def version_routes(m: Manifest, manifest_body: str | None = None) -> dict:
    """A hostile server that holds `m` whole (its manifest, `have`; no shard is ever asked)."""
    return {"/versions": listing(m.version),
            f"/v/{m.version}/manifest": {"body": manifest_body or m.to_json().decode()},
            f"/v/{m.version}/have": {"json": {"complete": True, "have": None, "role": "relay"}}}


def forged_manifest(tmp_path: Path, version: int, size: int) -> Manifest:
    """A self-consistent manifest of bytes the publisher never published."""
    return build_manifest(make_file(tmp_path / "forged" / "w.bin", size, 99), version, SHARD,
                          run=RUN)


def nul_named(m: Manifest) -> str:
    """`m` with a NUL inside its file's name, signed by the publisher's own key (so only the
    name can make a receiver refuse it)."""
    bad = FileEntry(name="model\x00.bin", size=m.files[0].size, sha256=m.files[0].sha256)
    forged = Manifest.model_construct(**{**dict(m), "files": (bad,), "signature": ""})
    return sign_manifest(forged, KEY).to_json().decode()


def refusals(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.fields["url"], r.fields["reason"]) for r in caplog.records  # type: ignore[attr-defined]
            if r.getMessage() == "answer refused"]


FORGERIES = ["unsigned", "wrong_signer", "bad_signature", "wrong_version", "wrong_run",
             "nul_name"]


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_client_takes_a_version_only_from_servers_the_publisher_backs(
        forgery: str, tmp_path: Path, procs: list, caplog: pytest.LogCaptureFixture) -> None:
    """The forger is first in URL order (its manifest used to be believed); the client refuses
    it with the forgery's reason and fetches the publisher's bytes from the honest origin."""
    caplog.set_level(logging.INFO, "meshrl.shardcast")
    root, ourl = origin(procs, tmp_path)
    src = make_file(tmp_path / "w.bin", 5 * SHARD + 3, 1)
    publish(root, src, 1)
    publish(root, src, 2)
    version = 2
    m = forged_manifest(tmp_path, version, 4 * SHARD)
    body, reason = {
        "unsigned": (m.to_json().decode(), RefusalReason.UNSIGNED),
        "wrong_signer": (sign_manifest(m, OTHER_KEY).to_json().decode(),
                         RefusalReason.WRONG_SIGNER),
        "bad_signature": (m.model_copy(update={"signature": "0x" + "00" * 65}).to_json()
                          .decode(), RefusalReason.BAD_SIGNATURE),
        # the publisher's real, signed manifest of version 1, replayed as version 2
        "wrong_version": ((root / "v1" / "manifest.json").read_text(),
                          RefusalReason.WRONG_VERSION),
        # the publisher's own signature, on a version of another run (pool) it trains
        "wrong_run": (sign_manifest(m.model_copy(update={"run": "pool-2"}), KEY).to_json()
                      .decode(), RefusalReason.WRONG_RUN),
        "nul_name": (nul_named(m), RefusalReason.MALFORMED),
    }[forgery]
    furl = hostile(procs, tmp_path, "forger", version_routes(m, body))

    async def main():
        async with signed_client([furl, ourl], FAST, seed=0) as c:
            return await c.fetch(tmp_path / "out.bin", version)

    res = run(main())
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert res.servers[furl]["bytes"] == 0 and res.servers[furl]["refusals"] >= 1
    assert res.servers[ourl]["refusals"] == 0
    assert (furl, reason) in refusals(caplog)
    assert all(url == furl for url, _ in refusals(caplog))


def test_another_runs_version_signed_by_the_same_key_is_refused_by_clients_and_relays(
        tmp_path: Path, procs: list, caplog: pytest.LogCaptureFixture) -> None:
    """One trainer key signs the versions of two runs (pools 1 and 2), each served by its own
    origin process. Run 2's origin, first in URL order, serves its real, signed version 1 to
    run 1's client and relay process: both refuse it (`wrong_run`) and take run 1's version 1
    from run 1's origin; given run 2's origin alone, the client finds no version of its run."""
    caplog.set_level(logging.INFO, "meshrl.shardcast")
    root_a, url_a = origin(procs, tmp_path, "origin-a")
    root_b, url_b = origin(procs, tmp_path, "origin-b", run="pool-2")
    src_a, src_b = (make_file(tmp_path / f"{n}.bin", 3 * SHARD + 5, seed) for n, seed in
                    (("a", 1), ("b", 2)))
    publish(root_a, src_a, 1)
    publish(root_b, src_b, 1, run="pool-2")
    log = tmp_path / "relay.log"
    relay, rurl = spawn_service(["relay", "--publisher", PUBLISHER, "--run", RUN, "--root",
                                 str(tmp_path / "relay"), "--upstreams",
                                 json.dumps([url_b, url_a]), "--server.port", "0",
                                 "--client.poll_interval", "0.05", "--client.long_poll", "1"],
                                log)
    procs.append(relay)

    async def main():
        async with signed_client([url_b, url_a], FAST, seed=0) as c:
            direct = await c.fetch(tmp_path / "direct.bin", 1)
        async with signed_client([rurl], FAST) as c:
            await c.fetch(tmp_path / "mirrored.bin", 1)
        alone = FAST.model_copy(update={"wait_timeout": 1.0})
        async with signed_client([url_b], alone) as c:
            with pytest.raises(VersionNotFoundError):
                await c.fetch(tmp_path / "other.bin")
        return direct

    direct = run(main(), timeout=90)
    assert (tmp_path / "direct.bin").read_bytes() == src_a.read_bytes()
    assert (tmp_path / "mirrored.bin").read_bytes() == src_a.read_bytes()
    assert not (tmp_path / "other.bin").exists()
    assert direct.servers[url_b]["bytes"] == 0 and direct.servers[url_b]["refusals"] >= 1
    assert (url_b, RefusalReason.WRONG_RUN) in refusals(caplog)
    assert all(url == url_b for url, _ in refusals(caplog))
    assert (url_b, "wrong_run") in _refused(log) and relay.poll() is None
    assert not any(url == url_a for url, _ in _refused(log))


def test_claims_of_shards_a_version_does_not_have_cost_only_the_claimant(
        tmp_path: Path, procs: list, caplog: pytest.LogCaptureFixture) -> None:
    """A server with the publisher's real manifest whose `have` names shards past the version's
    end is refused (malformed) and never asked for a shard; the fetch completes elsewhere."""
    caplog.set_level(logging.INFO, "meshrl.shardcast")
    root, ourl = origin(procs, tmp_path)
    src = make_file(tmp_path / "w.bin", 4 * SHARD, 2)
    publish(root, src, 1)
    real = (root / "v1" / "manifest.json").read_text()
    liar = hostile(procs, tmp_path, "liar", {
        "/versions": listing(1), "/v/1/manifest": {"body": real},
        "/v/1/have": {"json": {"complete": False, "have": [0, 1, 10**6], "role": "relay"}}})

    async def main():
        async with signed_client([liar, ourl], FAST, seed=0) as c:
            return await c.fetch(tmp_path / "out.bin", 1)

    res = run(main())
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert res.servers[liar]["bytes"] == 0
    assert (liar, RefusalReason.MALFORMED) in refusals(caplog)


def _refused(log: Path) -> set[tuple[str, str]]:
    """(server, reason) of each answer the relay logged refusing (a line half written is
    skipped)."""
    out = set()
    for line in log.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("msg") == "answer refused":
            out.add((e["url"], e["reason"]))
    return out


def test_a_relay_keeps_mirroring_real_versions_beside_hostile_upstreams(
        tmp_path: Path, procs: list) -> None:
    """Upstreams advertising version 10**15, a manifest with a NUL in a name (signed by the
    publisher's key even), a listing `{}` and a listing of a megabyte: the relay process
    refuses each with its reason, never dies, and mirrors versions 1 and 2 of the honest origin
    as they are published; a client of the relay alone gets version 2."""
    root, ourl = origin(procs, tmp_path)
    huge = forged_manifest(tmp_path, 10**15, SHARD)
    nul = forged_manifest(tmp_path, 7, SHARD)
    upstreams = [
        hostile(procs, tmp_path, "huge", version_routes(huge)),
        hostile(procs, tmp_path, "nul", version_routes(nul, nul_named(nul))),
        hostile(procs, tmp_path, "empty", {"/versions": {"json": {}}}),
        hostile(procs, tmp_path, "big", {"/versions": {"repeat": [" ", 1 << 20]}}),
        ourl,
    ]
    log = tmp_path / "relay.log"
    relay, rurl = spawn_service(["relay", "--publisher", PUBLISHER, "--run", RUN, "--root",
                                 str(tmp_path / "relay"), "--upstreams", json.dumps(upstreams),
                                 "--server.port", "0", "--client.poll_interval", "0.05",
                                 "--client.long_poll", "1"], log)
    procs.append(relay)
    srcs = [make_file(tmp_path / f"w{v}.bin", 3 * SHARD + v, 10 + v) for v in (1, 2)]
    hostile_refusals = {(upstreams[0], "unsigned"), (upstreams[1], "malformed"),
                        (upstreams[2], "malformed"), (upstreams[3], "too_large")}
    # the relay refuses every hostile upstream before the first honest version (a wait on
    # its log, not a fixed sleep)
    deadline = time.monotonic() + 60
    while not hostile_refusals <= _refused(log):
        assert relay.poll() is None, log.read_text()
        assert time.monotonic() < deadline, (_refused(log), log.read_text()[-3000:])
        time.sleep(0.05)
    for v, src in zip((1, 2), srcs, strict=True):
        publish(root, src, v)
        deadline = time.monotonic() + 30
        while v not in asyncio.run(get_json(f"{rurl}/versions"))["complete"]:
            assert relay.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    async def main():
        async with signed_client([rurl], FAST) as c:
            return await c.fetch(tmp_path / "out.bin")

    res = run(main())
    assert res.version == 2 and (tmp_path / "out.bin").read_bytes() == srcs[1].read_bytes()
    assert relay.poll() is None
    events = [json.loads(line) for line in log.read_text().splitlines()
              if line.startswith("{")]
    refused = {(e["url"], e["reason"]) for e in events if e["msg"] == "answer refused"}
    assert hostile_refusals <= refused
    assert not any(url == ourl for url, _ in refused)
    assert "Traceback" not in log.read_text()
    health = asyncio.run(get_json(f"{rurl}/health"))
    assert set(health["mirrored"]) == {"1", "2"} and health["latest"] == 2


def test_fetch_cli_refuses_a_hostile_server_in_one_line_and_fetches_beside_it(
        tmp_path: Path, procs: list) -> None:
    """`meshrl shardcast fetch` from a server whose only version has a NUL in a name: one line,
    exit 1, no traceback (it used to die on a ValueError). With an honest origin beside it the
    same command fetches the publisher's version."""
    nul = forged_manifest(tmp_path, 1, SHARD)
    evil = hostile(procs, tmp_path, "nul", version_routes(nul, nul_named(nul)))
    fetch = [sys.executable, "-m", "meshrl.cli", "shardcast", "fetch", "--publisher", PUBLISHER,
             "--run", RUN, "--out", str(tmp_path / "out.bin"), "--client.wait_timeout", "1",
             "--client.poll_interval", "0.05", "--client.fsync", "false"]
    alone = subprocess.run([*fetch, "--server.urls", json.dumps([evil])], env=ENV,
                           capture_output=True, text=True, timeout=60)
    lines = [x for x in alone.stderr.splitlines() if x.strip() and not x.startswith("{")]
    assert alone.returncode == 1 and "Traceback" not in alone.stderr
    assert lines == ["meshrl shardcast fetch: shardcast: a version > -1 did not appear in time"]
    assert '"reason": "malformed"' in alone.stderr
    root, ourl = origin(procs, tmp_path)
    src = make_file(tmp_path / "w.bin", 2 * SHARD, 4)
    publish(root, src, 1)
    beside = subprocess.run([*fetch, "--server.urls", json.dumps([evil, ourl]),
                             "--version", "1"], env=ENV, capture_output=True, text=True,
                            timeout=60)
    assert beside.returncode == 0, beside.stderr
    assert json.loads(beside.stdout)["version"] == 1
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()


def test_a_relay_or_fetch_without_a_publisher_refuses_in_one_line(tmp_path: Path,
                                                                  capsys) -> None:
    """Nothing can be believed without the publisher's address: the relay refuses to start,
    publish refuses without the key; a malformed address is a config error."""
    assert cli(["shardcast", "relay", "--root", str(tmp_path / "r"), "--upstreams",
                '["http://127.0.0.1:9"]']) == 1
    assert capsys.readouterr().err.strip().endswith(
        "no publisher address is configured: no manifest can be authenticated (set the policy "
        "signer)")
    assert cli(["shardcast", "relay", "--root", str(tmp_path / "r"),
                "--publisher", PUBLISHER.lower()]) == 2
    assert "is not a checksummed Ethereum address" in capsys.readouterr().err
    src = make_file(tmp_path / "w.bin", 10, 1)
    assert cli(["shardcast", "publish", "--src", str(src), "--root", str(tmp_path / "o")]) == 2
    assert "--key_file is required" in capsys.readouterr().err


def test_a_server_list_that_is_not_one_is_a_typed_refusal(tmp_path: Path, capsys) -> None:
    """Servers may come from a work order: a port of 99999 is refused at once, not a ValueError
    in the middle of a fetch."""
    from meshrl.shardcast import ShardcastError
    from meshrl.shardcast.errors import BadServerUrl

    for bad in ("http://127.0.0.1:99999", "ftp://host", "http://", "http://h:1?x=1"):
        with pytest.raises(BadServerUrl):
            signed_client([bad])
    assert issubclass(BadServerUrl, ShardcastError)
    assert cli(["shardcast", "fetch", "--publisher", PUBLISHER, "--run", RUN,
                "--out", str(tmp_path / "x"),
                "--server.urls", '["http://127.0.0.1:99999"]']) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "meshrl shardcast fetch: shardcast: not a server URL: 'http://127.0.0.1:99999'")


def test_a_client_without_a_publisher_believes_no_manifest(tmp_path: Path, procs: list) -> None:
    """A server holds a real, signed version: a client with no publisher still refuses it
    (`PublisherRequired`), in one line from the CLI."""
    from meshrl.shardcast import PublisherRequired

    root, ourl = origin(procs, tmp_path)
    publish(root, make_file(tmp_path / "w.bin", SHARD, 1), 1)

    async def main():
        async with signed_client([ourl], FAST, publisher=None) as c:
            await c.fetch(tmp_path / "out.bin", 1)

    with pytest.raises(PublisherRequired):
        run(main())
    out = subprocess.run([sys.executable, "-m", "meshrl.cli", "shardcast", "fetch", "--out",
                          str(tmp_path / "out.bin"), "--server.urls", json.dumps([ourl])],
                         env=ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "meshrl shardcast fetch: shardcast: no publisher address is configured: no manifest "
        "can be authenticated (set the policy signer)")
    assert not (tmp_path / "out.bin").exists()
