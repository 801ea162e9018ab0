"""Connecting roles to a chain, and the local development chain (anvil + deployed contracts)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from meshrl.protocol.anvil import AnvilNode
from meshrl.protocol.backend import Backend, EthTesterBackend, RpcBackend
from meshrl.protocol.chain import Protocol, deploy
from meshrl.protocol.config import ChainConfig, ProtocolParams
from meshrl.protocol.errors import ChainError
from meshrl.protocol.keystore import KeystoreError, load_key_file
from meshrl.protocol.records import Deployment

__all__ = [
    "ANVIL_DEV_KEY",
    "connect",
    "load_account",
    "open_protocol",
    "start_local_chain",
    "to_base_units",
]

# anvil's first pre-funded development account: public knowledge, for local chains only.
ANVIL_DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"


def to_base_units(tokens: Decimal | float | str, decimals: int = 18) -> int:
    """Whole tokens (as typed by a person) to integer base units, exactly."""
    return int(Decimal(str(tokens)) * (10**decimals))


def connect(cfg: ChainConfig) -> Backend:
    """The backend `cfg` names; with `cfg.chain_id` set, a node on another chain is refused."""
    if cfg.backend == "eth-tester":
        backend: Backend = EthTesterBackend()
    else:
        backend = RpcBackend(cfg.rpc_url, timeout=cfg.rpc_timeout_s)
        backend.wait_ready(timeout=cfg.ready_timeout_s)
    if cfg.chain_id and backend.chain_id != cfg.chain_id:
        raise ChainError(f"{cfg.rpc_url} is chain {backend.chain_id}, expected {cfg.chain_id}")
    return backend


def load_account(cfg: ChainConfig, default: str = "") -> LocalAccount:
    """The signing key: `cfg.key_file` (a keystore or a hex key file), `cfg.private_key` (a
    config file's), else `default`."""
    if cfg.key_file:
        try:
            return load_key_file(cfg.key_file, cfg.password_file, cfg.password_env)
        except KeystoreError as e:
            raise ChainError(str(e)) from None
    key = cfg.private_key or default
    if not key:
        raise ChainError("this command signs transactions: set --chain.key_file")
    return Account.from_key(key)


def open_protocol(cfg: ChainConfig, signer: bool = True) -> Protocol:
    """A client for the deployment named in `cfg`, signing with its key when `signer`."""
    path = Path(cfg.deployment)
    if not path.is_file():
        raise ChainError(f"no deployment file at {path}: run `meshrl chain node` or `deploy`")
    account = load_account(cfg) if signer else None
    return Protocol(connect(cfg), Deployment.load(path), account)


def start_local_chain(
    port: int,
    params: ProtocolParams,
    deployment_path: str,
    anvil_path: str = "",
    federator_key: str = "",
) -> tuple[AnvilNode, Deployment]:
    """Start anvil on 127.0.0.1:`port`, deploy the contracts and write their addresses."""
    node = AnvilNode(anvil_path or None, port=port)
    backend = node.start()
    try:
        federator = Account.from_key(federator_key or ANVIL_DEV_KEY)
        backend.fund(federator.address, 10**22)
        dep = deploy(backend, federator, params)
        dep.save(deployment_path)
    except BaseException:
        node.stop()
        raise
    return node, dep
