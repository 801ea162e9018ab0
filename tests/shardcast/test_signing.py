"""The publisher's signature on a manifest (EIP-191 over run + version + digest): any Ethereum
wallet makes it, any change to what the manifest commits to unmakes it, and each failure has a
reason."""

from __future__ import annotations

import json

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct

from meshrl.shardcast import (
    ManifestRefused,
    PublisherRequired,
    RefusalReason,
    RunRequired,
    UntrustedAnswer,
    sign_manifest,
    verify_manifest,
)
from meshrl.shardcast.answers import Have, Listing, parse
from meshrl.shardcast.manifest import Manifest, build_manifest
from meshrl.shardcast.signing import check_publisher, check_run, manifest_message
from meshrl.shardcast.store import VersionStore

from .conftest import KEY, PUBLISHER, RUN, make_file


@pytest.fixture
def manifest(tmp_path) -> Manifest:
    make_file(tmp_path / "ck" / "model.safetensors", 5000, 1)
    make_file(tmp_path / "ck" / "config.json", 30, 2)
    return build_manifest(tmp_path / "ck", 4, 1024, piece_size=512, run=RUN)


def _reason(m: Manifest, version: int | None = None) -> RefusalReason:
    with pytest.raises(ManifestRefused) as e:
        verify_manifest(m, PUBLISHER, version, "http://x", run=RUN)
    assert e.value.url == "http://x"
    return e.value.reason


def test_a_signed_manifest_verifies_and_is_an_ordinary_personal_sign(manifest):
    signed = sign_manifest(manifest, KEY)
    verify_manifest(signed, PUBLISHER, 4, run=RUN)
    verify_manifest(Manifest.from_json(signed.to_json()), PUBLISHER, 4, run=RUN)  # the wire
    text = manifest_message(RUN, 4, manifest.digest)
    assert text == f"meshrl-shardcast-manifest-v2\n{RUN}\n4\n{manifest.digest}".encode()
    # any wallet can check it: it is EIP-191 personal_sign of that text
    assert Account.recover_message(encode_defunct(primitive=text),
                                   signature=bytes.fromhex(signed.signature[2:])) == PUBLISHER


@pytest.mark.parametrize("change", [
    {"version": 5}, {"run": "pool-2"}, {"created": 1.0}, {"shard_size": 2048},
    {"files__1__name": "other.safetensors"}, {"files__0__sha256": "0" * 64},
])
def test_any_change_to_what_it_commits_to_is_another_signer(manifest, change):
    data = json.loads(sign_manifest(manifest, KEY).to_json())
    for key, value in change.items():
        node, path = data, key.split("__")
        for p in path[:-1]:
            node = node[int(p)] if p.isdigit() else node[p]
        node[path[-1]] = value
    m = Manifest.model_validate_json(json.dumps(data))  # no check(): only the signature here
    assert _reason(m) == RefusalReason.WRONG_SIGNER


def test_each_refusal_has_its_reason(manifest):
    assert _reason(manifest) == RefusalReason.UNSIGNED
    assert _reason(sign_manifest(manifest, "0x" + "66" * 32)) == RefusalReason.WRONG_SIGNER
    broken = manifest.model_copy(update={"signature": "0x" + "00" * 65})
    assert _reason(broken) == RefusalReason.BAD_SIGNATURE
    high_s = sign_manifest(manifest, KEY).signature[:66] + "f" * 64 + "1b"
    assert _reason(manifest.model_copy(update={"signature": high_s})) == (
        RefusalReason.BAD_SIGNATURE)
    assert _reason(sign_manifest(manifest, KEY), version=5) == RefusalReason.WRONG_VERSION
    other_run = sign_manifest(manifest.model_copy(update={"run": "pool-2"}), KEY)
    assert _reason(other_run) == RefusalReason.WRONG_RUN  # the publisher's, another run's
    assert issubclass(ManifestRefused, UntrustedAnswer)


def test_a_run_must_be_named_to_sign_or_to_believe(manifest):
    with pytest.raises(RunRequired):
        sign_manifest(manifest.model_copy(update={"run": ""}), KEY)
    for unset in (None, ""):
        with pytest.raises(RunRequired):
            check_run(unset)
    for bad in ("pool 1", "pool-1\n", "x" * 129, "pöol"):
        with pytest.raises(ValueError, match="not a run id"):
            check_run(bad)
    assert issubclass(RunRequired, PublisherRequired)  # followers stop on it, as without one


def test_the_publisher_must_be_set_and_checksummed():
    with pytest.raises(PublisherRequired):
        check_publisher(None)
    with pytest.raises(PublisherRequired):
        check_publisher("")
    with pytest.raises(ValueError, match="checksummed"):
        check_publisher(PUBLISHER.lower())
    assert check_publisher(PUBLISHER) == PUBLISHER


@pytest.mark.parametrize("body", [
    b"{}", b"[]", b"null", b"not json",
    b'{"latest": true, "complete": [], "partial": []}',  # a bool is not a version
    b'{"latest": "3", "complete": [], "partial": []}',
    b'{"latest": 1, "complete": [-1], "partial": []}',
    b'{"latest": 1, "complete": [9223372036854775808], "partial": []}',
    b'{"latest": 1, "complete": [1.5], "partial": []}',
    json.dumps({"latest": 1, "complete": list(range(1025)), "partial": []}).encode(),
])
def test_a_listing_that_is_not_one_is_refused_as_malformed(body):
    with pytest.raises(UntrustedAnswer) as e:
        parse(Listing, body, "http://x")
    assert e.value.reason == RefusalReason.MALFORMED


def test_listings_and_have_answers_that_are_valid_parse():
    got = parse(Listing, b'{"latest": 3, "complete": [2, 3], "partial": [], "new": 1}', "u")
    assert got.held() == {2, 3}
    assert parse(Have, b'{"complete": false, "have": [0, 4], "role": "relay"}', "u").have == [0, 4]
    for bad in (b'{"complete": 1, "have": null}', b'{"complete": false, "have": ["1"]}',
                b'{"complete": false, "have": [], "role": "boss"}'):
        with pytest.raises(UntrustedAnswer):
            parse(Have, bad, "u")


def test_a_store_with_a_publisher_takes_only_its_manifests_from_disk(tmp_path):
    src = make_file(tmp_path / "w.bin", 3000, 1)
    writer = VersionStore(tmp_path / "r", run=RUN)
    writer.publish(src, 1, 1024, key=KEY)
    writer.publish(src, 2, 1024, key="0x" + "66" * 32)
    writer.publish(src, 3, 1024)  # unsigned
    assert VersionStore(tmp_path / "r", run=RUN).complete.keys() == {1, 2, 3}
    assert VersionStore(tmp_path / "r", run=RUN, publisher=PUBLISHER).complete.keys() == {1}
    VersionStore(tmp_path / "r", run="pool-2").publish(src, 4, 1024, key=KEY)
    # another run's version in the directory, signed by the same publisher: never taken
    assert VersionStore(tmp_path / "r", run=RUN, publisher=PUBLISHER).complete.keys() == {1}
    assert VersionStore(tmp_path / "r", run=RUN).complete.keys() == {1, 2, 3}
