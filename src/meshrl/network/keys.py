"""The keys of a local network's roles, and which keys a pool opened to other hosts refuses.

Two sources (`[keys]` of `meshrl network up`, `select_keys` chooses):

- **dev**: every role's key derived from anvil's public test mnemonic (a loopback demo only:
  these keys are public knowledge). Workers follow `meshrl worker --keys.dev_index i`
  (provider = account 2i+1, node = 2i+2); account 0 is the federator; the first validator, the
  pool manager and the trainer come after the workers' accounts, and the other validators
  after the trainer.
- **generate**: every role's key is read from the keys directory (`runs/<name>/keys/` unless
  `keys.dir` names another), and generated there, fresh from the OS's randomness, when it is
  not there yet, so a restarted run keeps its keys. The federator, the pool manager and the
  trainer read one hex key from `<role>.key`; validators and workers read only encrypted
  keystores, so theirs are `<name>.json` and `<worker>-provider.json` / `<worker>-node.json`,
  with one password in `password`. Every file is mode 0600.

A pool opened to other hosts (`public_host`) publishes `GET /join`, and with it the trainer
(whose signature on a policy version every worker and validator believes) and a chain whose
federator, manager and validators are its roles: on keys anyone can derive, anyone could sign
policy versions, make themselves a validator or move the pool's funds. So such a pool refuses
to start when any role's key is one of the mnemonic's accounts (`WellKnownKeyError`, one line
on the command line), and `keys.source = "auto"` generates keys for it.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount

from meshrl.config import EXIT_REFUSED, CommandError
from meshrl.network.config import NetworkConfig

__all__ = ["ANVIL_MNEMONIC", "WELL_KNOWN_ADDRESSES", "DevKeys", "PoolKeyError", "PoolKeys",
           "WellKnownKeyError", "dev_account", "hexkey", "select_keys", "well_known_index",
           "write_key_file"]

ANVIL_MNEMONIC = "test test test test test test test test test test test junk"

# Accounts 0..19 of ANVIL_MNEMONIC (m/44'/60'/0'/0/i): anvil funds and prints the first 10 at
# every start, hardhat all 20; their keys are in every tutorial. Listed (not derived) so the
# check costs nothing; tests/network/test_pool_keys.py derives them again and compares.
WELL_KNOWN_ADDRESSES: tuple[str, ...] = (
    "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
    "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
    "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
    "0x90F79bf6EB2c4f870365E785982E1f101E93b906",
    "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65",
    "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc",
    "0x976EA74026E726554dB657fA54763abd0C3a0aa9",
    "0x14dC79964da2C08b23698B3D3cc7Ca32193d9955",
    "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f",
    "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720",
    "0xBcd4042DE499D14e55001CcbB24a551F3b954096",
    "0x71bE63f3384f5fb98995898A86B02Fb2426c5788",
    "0xFABB0ac9d68B0B445fB7357272Ff202C5651694a",
    "0x1CBd3b2770909D4e10f157cABC84C7264073C9Ec",
    "0xdF3e18d64BC6A983f673Ab319CCaE4f1a57C7097",
    "0xcd3B766CCDd6AE721141F452C550Ca635964ce71",
    "0x2546BcD3c84621e976D8185a91A922aE77ECEc30",
    "0xbDA5747bFD65F08deb54cb465eB87D40e51B197E",
    "0xdD2FD4581271e230360230F9337D5c0430Bf44C0",
    "0x8626f6940E2eb28930eFb4CeF49B2d1F2C9C1199",
)
_WELL_KNOWN = {a.lower(): i for i, a in enumerate(WELL_KNOWN_ADDRESSES)}
# A generated keystore's password sits next to it (the run directory is the boundary, as for
# the hex key files), so its KDF guards nothing: pbkdf2 at 2^16 rounds keeps starts fast.
KDF_ROUNDS = 1 << 16


class PoolKeyError(CommandError):
    """A role's key cannot be used: unreadable, readable by others, or refused."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_REFUSED)  # retrying with the same keys cannot help


class WellKnownKeyError(PoolKeyError):
    """A pool opened to other hosts was given a key anyone can derive."""

    def __init__(self, role: str, address: str, index: int) -> None:
        self.role, self.address, self.index = role, address, index
        super().__init__(
            f"keys: the {role} key {address} is account {index} of anvil's public test "
            "mnemonic (anyone can sign with it), and a pool opened to other hosts "
            "(public_host) refuses well-known keys: leave keys.source = \"auto\" to generate "
            "the pool's own, or give yours in keys.dir (a run first started with dev keys "
            "keeps them: open a new run name)")


def dev_account(index: int) -> LocalAccount:
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")


@cache
def _derived(index: int) -> str:
    return dev_account(index).address.lower()


def well_known_index(address: str, upto: int = len(WELL_KNOWN_ADDRESSES)) -> int | None:
    """The index of `address` among the test mnemonic's first `upto` accounts, else None."""
    found = _WELL_KNOWN.get(address.lower())
    if found is not None and found < upto:
        return found
    return next((i for i in range(len(WELL_KNOWN_ADDRESSES), upto)
                 if _derived(i) == address.lower()), None)


def hexkey(a: LocalAccount) -> str:
    return "0x" + bytes(a.key).hex()


def _private(path: Path, exclusive: bool = False) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: set it
    return fd


def write_key_file(a: LocalAccount, path: Path) -> Path:
    """The key as one hex line in a file only its owner reads (what `chain.key_file` and the
    trainer's `network.key_file` read): keys never go on a command line or in a config file."""
    with os.fdopen(_private(path), "w") as f:
        f.write(hexkey(a) + "\n")
    return path


@dataclass(frozen=True)
class DevKeys:
    workers: int

    @property
    def validator_index(self) -> int:
        return 2 * self.workers + 1

    def federator(self) -> LocalAccount:
        return dev_account(0)

    def provider(self, i: int) -> LocalAccount:
        return dev_account(2 * i + 1)

    def node(self, i: int) -> LocalAccount:
        return dev_account(2 * i + 2)

    def validator(self, j: int = 0) -> LocalAccount:
        return dev_account(self.validator_dev_index(j))

    def validator_dev_index(self, j: int) -> int:
        """Validator j's account: 2w+1 for the first (as before there were several), then
        after the trainer's."""
        return self.validator_index if j == 0 else 2 * self.workers + 3 + j

    def manager(self) -> LocalAccount:
        return dev_account(2 * self.workers + 2)

    def trainer(self) -> LocalAccount:
        return dev_account(2 * self.workers + 3)

    def last_index(self, validators: int) -> int:
        return max(self.validator_dev_index(validators - 1), 2 * self.workers + 3)


@dataclass(frozen=True)
class PoolKeys:
    """Every role's account and where the role reads it from."""

    source: str  # "dev" or "generate"
    dir: Path
    accounts: dict[str, LocalAccount]  # role file name -> account
    workers: tuple[str, ...]  # worker names, by worker index
    password_file: Path | None  # the validators' and workers' keystore password (generate)

    def federator(self) -> LocalAccount:
        return self.accounts["federator"]

    def manager(self) -> LocalAccount:
        return self.accounts["manager"]

    def trainer(self) -> LocalAccount:
        return self.accounts["trainer"]

    def validator(self, j: int = 0) -> LocalAccount:
        return self.accounts[_validator(j)]

    def provider(self, i: int) -> LocalAccount:
        return self.accounts[f"{self.workers[i]}-provider"]

    def node(self, i: int) -> LocalAccount:
        return self.accounts[f"{self.workers[i]}-node"]

    def key_file(self, role: str) -> Path:
        """The hex key file of the federator, the manager or the trainer."""
        return self.dir / f"{role}.key"

    def validator_keys(self, j: int) -> dict[str, Any]:
        """Validator j's `[keys]`."""
        if self.source == "dev":
            return {"dev_index": DevKeys(len(self.workers)).validator_dev_index(j)}
        return {"keystore": str(self.dir / f"{_validator(j)}.json"),
                "password_file": str(self.password_file)}

    def worker_keys(self, i: int) -> dict[str, Any]:
        """Worker i's `[keys]`."""
        if self.source == "dev":
            return {"dev_index": i}
        name = self.workers[i]
        return {"provider_keystore": str(self.dir / f"{name}-provider.json"),
                "node_keystore": str(self.dir / f"{name}-node.json"),
                "password_file": str(self.password_file)}

    def refuse_well_known(self, upto: int) -> None:
        """Raise `WellKnownKeyError` for the first role whose key is among the test
        mnemonic's first `upto` accounts."""
        for role, account in self.accounts.items():
            index = well_known_index(account.address, upto)
            if index is not None:
                raise WellKnownKeyError(role, account.address, index)


def _validator(j: int) -> str:
    return "validator" if j == 0 else f"validator-{j}"


def _role_names(workers: list[str], validators: int) -> tuple[list[str], list[str]]:
    """(roles with hex key files, roles with keystores)."""
    stores = [_validator(j) for j in range(validators)]
    stores += [f"{w}-{part}" for w in workers for part in ("provider", "node")]
    return ["federator", "manager", "trainer"], stores


def select_keys(net: NetworkConfig, root: Path, workers: list[str]) -> PoolKeys:
    """The keys `meshrl network up` gives its roles (run directory `root`, workers by name, in
    order; see the module docstring); a pool opened to other hosts refuses well-known ones."""
    cfg, count, public = net.keys, net.validators.count, bool(net.public_host)
    kdir = Path(cfg.dir) if cfg.dir else root / "keys"
    password = Path(cfg.password_file) if cfg.password_file else kdir / "password"
    source = cfg.source
    if source == "auto":  # a run keeps the keys it was first given (its password file)
        source = "generate" if public or cfg.dir or password.is_file() else "dev"
    if source == "dev":
        keys = _dev_keys(kdir, workers, count)
    else:
        keys = _generated_keys(kdir, password, workers, count)
    if public:
        keys.refuse_well_known(max(len(WELL_KNOWN_ADDRESSES),
                                   DevKeys(len(workers)).last_index(count) + 1))
    return keys


def _dev_keys(kdir: Path, workers: list[str], count: int) -> PoolKeys:
    dev = DevKeys(len(workers))
    accounts = {"federator": dev.federator(), "manager": dev.manager(), "trainer": dev.trainer()}
    for role, account in accounts.items():
        path = kdir / f"{role}.key"
        if path.is_file() and _read_hex(role, path).address != account.address:
            # generated (or given) keys own this run's chain: never overwrite them
            raise PoolKeyError(f"keys: {path} holds another key than the dev {role}'s: this run "
                               "has its own keys (keys.source = \"generate\")")
        write_key_file(account, path)
    accounts |= {_validator(j): dev.validator(j) for j in range(count)}
    for i, w in enumerate(workers):
        accounts |= {f"{w}-provider": dev.provider(i), f"{w}-node": dev.node(i)}
    return PoolKeys("dev", kdir, accounts, tuple(workers), None)


def _generated_keys(kdir: Path, password_file: Path, workers: list[str],
                    count: int) -> PoolKeys:
    hexes, stores = _role_names(workers, count)
    accounts: dict[str, LocalAccount] = {}
    for role in hexes:
        path = kdir / f"{role}.key"
        if not path.exists():
            _create(path, (hexkey(Account.create()) + "\n").encode())
        accounts[role] = _read_hex(role, path)
    if not password_file.exists():
        if any((kdir / f"{r}.json").exists() for r in stores):
            raise PoolKeyError(f"keys: keystores in {kdir} but no password file {password_file}")
        _create(password_file, (secrets.token_hex(32) + "\n").encode())
    password = _read_private("keystore password", password_file).decode().rstrip("\r\n")
    for role in stores:
        path = kdir / f"{role}.json"
        if not path.exists():
            data = Account.encrypt(Account.create().key, password, kdf="pbkdf2",
                                   iterations=KDF_ROUNDS)
            _create(path, json.dumps(data).encode())
        accounts[role] = _read_keystore(role, path, password)
    return PoolKeys("generate", kdir, accounts, tuple(workers), password_file)


def _create(path: Path, data: bytes) -> None:
    """A new file only its owner reads (never replacing one: it may hold a key in use)."""
    with os.fdopen(_private(path, exclusive=True), "wb") as f:
        f.write(data)


def _read_private(what: str, path: Path) -> bytes:
    try:
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PoolKeyError(f"keys: the {what} file {path} is readable by others: "
                               "chmod 600 it")
        return path.read_bytes()
    except OSError as e:
        raise PoolKeyError(f"keys: cannot read the {what} file {path}: {e}") from None


def _read_hex(role: str, path: Path) -> LocalAccount:
    text = _read_private(f"{role} key", path)[:200].decode(errors="replace").strip()
    try:
        return Account.from_key(text)
    except (ValueError, TypeError):
        raise PoolKeyError(f"keys: the {role} key file {path} does not hold one hex key") \
            from None


def _read_keystore(role: str, path: Path, password: str) -> LocalAccount:
    raw = _read_private(f"{role} keystore", path)
    try:
        return Account.from_key(Account.decrypt(json.loads(raw[:1 << 16]), password))
    except (ValueError, KeyError, TypeError) as e:
        raise PoolKeyError(f"keys: cannot open the {role} keystore {path}: {e}") from None
