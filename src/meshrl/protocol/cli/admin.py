"""The federator's and the minters' commands: tokens minted, compute pools created, and the
federator role handed over in two steps (proposed, then accepted)."""

from __future__ import annotations

from decimal import Decimal

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.cli.common import AmountConfig, ChainOnly, Command, emit
from meshrl.protocol.config import ChainConfig, hex_address

__all__ = ["COMMANDS"]


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


def _mint(cfg: MintConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.mint(cfg.to or p.address, to_base_units(cfg.tokens))
    emit({"to": cfg.to or p.address, "tx": r.tx_hash})
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
    emit({"domain": domain, "pool": pool, **p.pool(pool).__dict__})
    return 0


def _propose_federator(cfg: FederatorConfig) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    r = p.propose_federator(cfg.to or "0x" + "0" * 40)
    emit({"federator": p.federator(), "proposed": p.pending_federator(), "tx": r.tx_hash})
    return 0


def _accept_federator(cfg: ChainOnly) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    r = p.accept_federator()
    emit({"federator": p.federator(), "tx": r.tx_hash})
    return 0


COMMANDS = (
    Command("mint", MintConfig, _mint, "mint tokens (minters only)"),
    Command("create-pool", PoolConfig, _create_pool,
            "create (and start) a compute pool, federator only"),
    Command("propose-federator", FederatorConfig, _propose_federator,
            "federator: propose a successor (first step of the hand-over)"),
    Command("accept-federator", ChainOnly, _accept_federator,
            "the proposed account takes over the federator role and the token"),
)
