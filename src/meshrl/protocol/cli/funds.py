"""An account's money: a provider registered with a stake and adding to it, ether and tokens
sent, and the balances (ether, tokens, stake, validator bond) of addresses."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.cli.common import AmountConfig, Command, emit
from meshrl.protocol.config import ChainConfig, hex_address

__all__ = ["COMMANDS"]


class SendConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    to: str = Field("", description="recipient address")
    ether: Decimal = Field(Decimal("0"), ge=0, description="ether to send (gas for a key that "
                           "signs transactions: a provider and its node both need some)")
    tokens: Decimal = Field(Decimal("0"), ge=0, description="stake tokens to send")

    _to = field_validator("to", mode="before")(hex_address)


class BalancesConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    addresses: list[str] = Field(default_factory=list, description="addresses (default: signer)")

    _addresses = field_validator("addresses", mode="before")(hex_address)


def _register(cfg: AmountConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.register_provider(to_base_units(cfg.tokens))
    emit({"provider": p.address, "tx": r.tx_hash, "stake": p.provider().stake})
    return 0


def _stake(cfg: AmountConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.add_stake(to_base_units(cfg.tokens))
    emit({"provider": p.address, "tx": r.tx_hash, "stake": p.provider().stake})
    return 0


def _send(cfg: SendConfig) -> int:
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import open_protocol, to_base_units

    if not cfg.to:
        raise ChainError("send: set --to")
    if not cfg.ether and not cfg.tokens:
        raise ChainError("send: set --ether and/or --tokens")
    p = open_protocol(cfg.chain)
    out: dict[str, Any] = {"from": p.address, "to": cfg.to}
    if cfg.ether:
        out["ether_tx"] = p.send_ether(cfg.to, to_base_units(cfg.ether))
    if cfg.tokens:
        out["tokens_tx"] = p.transfer(cfg.to, to_base_units(cfg.tokens)).tx_hash
    out["eth"] = p.backend.w3.eth.get_balance(cfg.to)
    out["token_balance"] = p.balance(cfg.to)
    emit(out)
    return 0


def _balances(cfg: BalancesConfig) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=not cfg.addresses)
    for who in cfg.addresses or [p.address]:
        info = p.provider(who)
        bond, locked = p.bond(who)
        emit(
            {
                "address": who,
                "eth": p.backend.w3.eth.get_balance(who),
                "tokens": p.balance(who),
                "stake": info.stake,
                "unbonding": info.unbonding,
                "compute_units": info.compute_units,
                "bond": bond,
                "bond_locked": locked,
            }
        )
    return 0


COMMANDS = (
    Command("register", AmountConfig, _register,
            "register the signer as a provider with a stake"),
    Command("stake", AmountConfig, _stake, "add stake as a provider"),
    Command("send", SendConfig, _send,
            "send ether (gas) and/or stake tokens from the signer to --to"),
    Command("balances", BalancesConfig, _balances,
            "ether, token, stake, validator bond (and its locked part) of addresses"),
)
