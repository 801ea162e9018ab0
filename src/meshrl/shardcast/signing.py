"""The publisher's signature on a manifest: what makes a version the trainer's.

Relays and clients never believe a server about what a version is: a manifest counts only if it
carries the publisher's EIP-191 (`personal_sign`) signature of the text

    meshrl-shardcast-manifest-v2\\n{run}\\n{version}\\n{manifest digest}

where the digest is the sha256 of the manifest's canonical JSON without its signature, so it
commits to the run, the version, every file and every shard and piece hash. The run (a pool's
`pool-<id>`, `PoolRules.policy_run`) binds the version to one run: a trainer key that signs the
versions of two runs cannot have run B's v1 taken for run A's (`WRONG_RUN`), and a relay or
client without a run believes nothing (`RunRequired`). Any Ethereum wallet can sign
it (the tests check eth-account's `recover_message` agrees); the pool's rules name the signer
(`policy_signer`). Signing and recovery run in C (coincurve, as `meshrl.wire.signing`):
importing eth-account alone costs ~0.8 s, more than publishing a small policy.
"""

from __future__ import annotations

import re
from pathlib import Path

import coincurve
from eth_utils import is_checksum_address, keccak

from meshrl.shardcast.errors import ManifestRefused, PublisherRequired, RefusalReason, RunRequired
from meshrl.shardcast.manifest import MAX_RUN_BYTES, Manifest
from meshrl.wire.signing import address_of, recover_signer

__all__ = [
    "PREFIX",
    "check_publisher",
    "check_run",
    "load_key",
    "manifest_message",
    "sign_manifest",
    "sign_message",
    "verify_manifest",
]

PREFIX = "meshrl-shardcast-manifest-v2"
_RUN = re.compile(rf"[0-9A-Za-z._:/@+-]{{1,{MAX_RUN_BYTES}}}", re.ASCII)  # manifest's RUN_PATTERN


def manifest_message(run: str, version: int, digest: str) -> bytes:
    """The text a manifest's signature covers."""
    return f"{PREFIX}\n{run}\n{version}\n{digest}".encode()


def check_run(run: str | None) -> str:
    """`run` if it is a run id; RunRequired if unset, ValueError if malformed."""
    if not run:
        raise RunRequired("shardcast: no run id is configured: a version of another run "
                          "signed by the same publisher could not be told apart (set the run, "
                          "e.g. pool-<id>)")
    if not _RUN.fullmatch(run):
        raise ValueError(f"shardcast: run {run[:140]!r} is not a run id "
                         "([0-9A-Za-z._:/@+-], at most 128)")
    return run


def check_publisher(address: str | None) -> str:
    """`address` if it is a checksummed Ethereum address; PublisherRequired if unset, ValueError
    if malformed."""
    if not address:
        raise PublisherRequired("shardcast: no publisher address is configured: no manifest "
                                "can be authenticated (set the policy signer)")
    if not is_checksum_address(address):
        raise ValueError(f"shardcast: publisher {address!r} is not a checksummed address")
    return address


def load_key(path: str | Path) -> str:
    """A private key (hex) from a file, as `network.key_file` holds it."""
    key = Path(path).read_text().strip()
    address_of(key)  # ValueError now, not at the first publish
    return key


def sign_message(message: bytes, private_key: str | bytes) -> bytes:
    """EIP-191 `personal_sign` of `message`: 65 bytes r || s || v, v in {27, 28}, low s."""
    if isinstance(private_key, str):
        private_key = bytes.fromhex(private_key.removeprefix("0x"))
    digest = keccak(b"\x19Ethereum Signed Message:\n" + str(len(message)).encode() + message)
    raw = coincurve.PrivateKey(private_key).sign_recoverable(digest, hasher=None)
    return raw[:64] + bytes([raw[64] + 27])


def sign_manifest(m: Manifest, private_key: str | bytes) -> Manifest:
    """`m` with the signature of `private_key`; RunRequired for a manifest that names no run
    (no relay or client would believe it)."""
    check_run(m.run)
    sig = sign_message(manifest_message(m.run, m.version, m.digest), private_key)
    return m.model_copy(update={"signature": "0x" + sig.hex()})


def verify_manifest(m: Manifest, publisher: str, version: int | None = None,
                    url: str = "", *, run: str) -> None:
    """Raise ManifestRefused unless `m` is signed by `publisher`, of `run` (and is
    `version`)."""
    if version is not None and m.version != version:
        raise ManifestRefused(url, RefusalReason.WRONG_VERSION,
                              f"asked for version {version}, got {m.version}")
    if not m.signature:
        raise ManifestRefused(url, RefusalReason.UNSIGNED, f"version {m.version}")
    try:
        signer = recover_signer(manifest_message(m.run, m.version, m.digest),
                                bytes.fromhex(m.signature[2:]))
    except ValueError as e:
        raise ManifestRefused(url, RefusalReason.BAD_SIGNATURE, str(e)) from None
    if signer != publisher:
        raise ManifestRefused(url, RefusalReason.WRONG_SIGNER,
                              f"version {m.version} signed by {signer}, not {publisher}")
    if m.run != run:  # the publisher's indeed, for another run: never this run's version
        raise ManifestRefused(url, RefusalReason.WRONG_RUN,
                              f"version {m.version} of run {m.run!r}, not {run!r}")
