"""`meshrl chain ...`: run a local chain, deploy, and the main protocol actions from a shell."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.config import ChainConfig, ProtocolParams, hex_address

__all__ = ["register"]


class NodeConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    params: ProtocolParams = Field(default_factory=ProtocolParams)
    port: int = Field(8545, description="port of the local anvil on 127.0.0.1")
    anvil: str = Field("", description="anvil binary (default: node_modules/.bin, then PATH)")
    run_seconds: float = Field(0.0, description="stop after this long (0: until interrupted)")


class DeployConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    params: ProtocolParams = Field(default_factory=ProtocolParams)


class ChainOnly(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)


class AmountConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    tokens: Decimal = Field(Decimal("100"), ge=0, description="amount in whole tokens")


class MintConfig(AmountConfig):
    to: str = Field("", description="recipient address (federator/minter only)")

    _to = field_validator("to", mode="before")(hex_address)


class PoolConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    domain: str = Field("default", description="domain name (created if new)")
    manager: str = Field("", description="pool manager address (default: the signer)")
    reward_rate: Decimal = Field(Decimal("0.001"), ge=0, description="tokens per work unit")
    max_units: int = Field(1_000_000, ge=1, le=2**64, description="work units a file may claim")
    min_interval: int = Field(
        0, ge=0, le=86400, description="seconds between two submissions of a node (0: none)"
    )
    start: bool = Field(True, description="activate the pool right away")

    _manager = field_validator("manager", mode="before")(hex_address)


class FederatorConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    to: str = Field("", description="proposed federator (empty: cancel a proposal)")

    _to = field_validator("to", mode="before")(hex_address)


class BalancesConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    addresses: list[str] = Field(default_factory=list, description="addresses (default: signer)")

    _addresses = field_validator("addresses", mode="before")(hex_address)


class WorksConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="the pool whose work to list")


def _print(obj: Any) -> None:
    print(json.dumps(obj, default=str))


def _handled(name: str, fn: Callable[[Any], int]) -> Callable[[Any], int]:
    """Chain errors (reverts included) become one clear line on stderr and exit status 1."""

    def run(cfg: Any) -> int:
        from meshrl.protocol.errors import ChainError

        try:
            return fn(cfg)
        except ChainError as e:
            print(f"meshrl chain {name}: {e}", file=sys.stderr)
            return 1

    return run


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """While the block runs, SIGTERM (e.g. from a supervisor) is a normal exit, so `finally`
    clauses (stopping anvil) run; then the caller's handler is back. A command called in-process
    must not change its host's signal handling for good. Off the main thread Python cannot
    handle signals: nothing is installed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        yield
    finally:  # None: the handler was not set from Python; the default is the closest
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _node(cfg: NodeConfig) -> int:
    import time

    from meshrl.log import get_logger, log_event
    from meshrl.protocol.local import start_local_chain

    log = get_logger("meshrl.protocol.node")
    with _sigterm_exits():
        node, dep = start_local_chain(
            cfg.port, cfg.params, cfg.chain.deployment, cfg.anvil, cfg.chain.private_key
        )
        start = time.monotonic()
        try:  # from here on anvil is ours to stop, whenever SIGTERM lands (even mid-print)
            log_event(log, "chain ready", url=node.url, deployment=cfg.chain.deployment,
                      protocol=dep.protocol, token=dep.token)
            _print({"url": node.url, **dep.__dict__})
            while node.proc is not None and node.proc.poll() is None:
                if cfg.run_seconds and time.monotonic() - start >= cfg.run_seconds:
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            node.stop()
            log_event(log, "chain stopped", url=node.url)
    return 0


def _deploy(cfg: DeployConfig) -> int:
    from meshrl.protocol.chain import deploy
    from meshrl.protocol.local import connect, load_account

    dep = deploy(connect(cfg.chain), load_account(cfg.chain), cfg.params)
    dep.save(cfg.chain.deployment)
    _print(dep.__dict__)
    return 0


def _status(cfg: ChainOnly) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=False)
    f = p.contract.functions
    _print(
        {
            "chain_id": p.backend.chain_id,
            "block": p.backend.block_number(),
            "protocol": p.contract.address,
            "token": p.token.address,
            "federator": p.federator(),
            "domains": p.backend.call(f.domain_count()),
            "pools": p.backend.call(f.pool_count()),
            **p.totals(),
        }
    )
    return 0


def _register(cfg: AmountConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.register_provider(to_base_units(cfg.tokens))
    _print({"provider": p.address, "tx": r.tx_hash, "stake": p.provider().stake})
    return 0


def _stake(cfg: AmountConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.add_stake(to_base_units(cfg.tokens))
    _print({"provider": p.address, "tx": r.tx_hash, "stake": p.provider().stake})
    return 0


def _mint(cfg: MintConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.mint(cfg.to or p.address, to_base_units(cfg.tokens))
    _print({"to": cfg.to or p.address, "tx": r.tx_hash})
    return 0


def _create_pool(cfg: PoolConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    domain = p.find_domain(cfg.domain)
    if domain is None:
        domain = p.create_domain(cfg.domain)
    pool = p.create_pool(
        domain, cfg.manager or p.address, to_base_units(cfg.reward_rate), cfg.max_units
    )
    if cfg.min_interval:
        p.set_pool_limits(pool, cfg.max_units, cfg.min_interval)
    if cfg.start:
        p.start_pool(pool)
    _print({"domain": domain, "pool": pool, **p.pool(pool).__dict__})
    return 0


def _propose_federator(cfg: FederatorConfig) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    r = p.propose_federator(cfg.to or "0x" + "0" * 40)
    _print({"federator": p.federator(), "proposed": p.pending_federator(), "tx": r.tx_hash})
    return 0


def _accept_federator(cfg: ChainOnly) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    r = p.accept_federator()
    _print({"federator": p.federator(), "tx": r.tx_hash})
    return 0


def _balances(cfg: BalancesConfig) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=not cfg.addresses)
    for who in cfg.addresses or [p.address]:
        info = p.provider(who)
        _print(
            {
                "address": who,
                "eth": p.backend.w3.eth.get_balance(who),
                "tokens": p.balance(who),
                "stake": info.stake,
                "unbonding": info.unbonding,
                "compute_units": info.compute_units,
            }
        )
    return 0


def _works(cfg: WorksConfig) -> int:
    from meshrl.protocol.history import pool_history
    from meshrl.protocol.local import open_protocol

    _print(pool_history(open_protocol(cfg.chain, signer=False), cfg.pool))
    return 0


def _devnet(cfg: Any) -> int:
    from meshrl.protocol.devnet import setup_devnet

    _print(setup_devnet(cfg))
    return 0


def _compile(cfg: Config) -> int:
    from meshrl.protocol.artifacts import write_artifacts

    for path in write_artifacts():
        _print({"written": str(path)})
    return 0


class CompileConfig(Config):
    pass


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("chain", help="protocol contracts: local chain, deploy, act")
    sub = group.add_subparsers(dest="chain_command", metavar="ACTION", required=True)
    add_config_command(
        sub,
        "node",
        NodeConfig,
        _handled("node", _node),
        "start a local anvil on 127.0.0.1, deploy, write the deployment file",
    )
    from meshrl.protocol.devnet import DevnetConfig

    add_config_command(sub, "devnet", DevnetConfig, _handled("devnet", _devnet),
                       "local chain only: deploy, fund, mint, validator role, one started pool")
    add_config_command(
        sub,
        "deploy",
        DeployConfig,
        _handled("deploy", _deploy),
        "deploy token + protocol to chain.rpc_url, write the deployment file",
    )
    add_config_command(
        sub,
        "status",
        ChainOnly,
        _handled("status", _status),
        "chain, contracts and protocol totals",
    )
    add_config_command(
        sub,
        "register",
        AmountConfig,
        _handled("register", _register),
        "register the signer as a provider with a stake",
    )
    add_config_command(
        sub, "stake", AmountConfig, _handled("stake", _stake), "add stake as a provider"
    )
    add_config_command(
        sub, "mint", MintConfig, _handled("mint", _mint), "mint tokens (minters only)"
    )
    add_config_command(
        sub,
        "create-pool",
        PoolConfig,
        _handled("create-pool", _create_pool),
        "create (and start) a compute pool, federator only",
    )
    add_config_command(
        sub,
        "propose-federator",
        FederatorConfig,
        _handled("propose-federator", _propose_federator),
        "federator: propose a successor (first step of the hand-over)",
    )
    add_config_command(
        sub,
        "accept-federator",
        ChainOnly,
        _handled("accept-federator", _accept_federator),
        "the proposed account takes over the federator role and the token",
    )
    add_config_command(
        sub,
        "balances",
        BalancesConfig,
        _handled("balances", _balances),
        "ether, token, stake of addresses",
    )
    add_config_command(
        sub,
        "works",
        WorksConfig,
        _handled("works", _works),
        "a pool's work items (status, reward, claimable) and its invalidations, ejections, "
        "claims (one JSON object)",
    )
    add_config_command(
        sub,
        "compile",
        CompileConfig,
        _handled("compile", _compile),
        "recompile the Vyper contracts into contracts/compiled/*.json",
    )
