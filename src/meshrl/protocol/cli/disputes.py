"""Disputing a validator's verdict: a pool's verdicts listed, a verdict challenged by the
accused work's provider, voted on by other bonded validators, and settled once its period is
over."""

from __future__ import annotations

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.cli.common import Command, emit
from meshrl.protocol.config import ChainConfig

__all__ = ["COMMANDS"]


def _work_id(v: object) -> object:
    """A work id on the command line: 32 bytes in hex (0x optional), else a config error."""
    if not isinstance(v, str):
        return v
    h = v.lower().removeprefix("0x")
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise ValueError(f"work_id: 32 bytes in hex, not {v!r}")
    return h


class DisputesConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="the pool whose verdicts to list")
    open: bool = Field(False, description="only verdicts not settled yet")


class WorkIdConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    work_id: str = Field("", description="the accused work (32 bytes, hex; `meshrl chain "
                         "disputes` lists them)")

    _wid = field_validator("work_id", mode="before")(_work_id)


class VoteConfig(WorkIdConfig):
    uphold: bool = Field(False, description="true: the verdict is right (your own judgment of "
                         "the file finds it invalid too); false: overturn it (also a "
                         "challenge)")


def _disputes(cfg: DisputesConfig) -> int:
    from meshrl.protocol.history import pool_disputes
    from meshrl.protocol.local import open_protocol

    for row in pool_disputes(open_protocol(cfg.chain, signer=False), cfg.pool):
        if not cfg.open or row["outcome"] == "open":
            emit(row)
    return 0


def _on_verdict(cfg: WorkIdConfig, act: str) -> int:
    """challenge / vote / settle one verdict, then print the dispute as it stands."""
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import open_protocol

    if not cfg.work_id:
        raise ChainError(f"{act}: set --work_id")
    p = open_protocol(cfg.chain)
    wid = bytes.fromhex(cfg.work_id)
    if act == "challenge":
        r = p.challenge(wid)
    elif act == "vote":
        r = p.vote(wid, bool(getattr(cfg, "uphold", False)))
    else:
        from meshrl.protocol.chain import SETTLE_GAS

        r = p.settle(wid, SETTLE_GAS)
    d = p.dispute(wid)
    emit({"work_id": cfg.work_id, "action": act, "by": p.address, "tx": r.tx_hash,
          "events": [e.name for e in r.events], "status": int(p.work(wid).status),
          "until": d.until, "challenged": d.challenged, "uphold": d.uphold,
          "overturn": d.overturn})
    return 0


def _challenge(cfg: WorkIdConfig) -> int:
    return _on_verdict(cfg, "challenge")


def _vote(cfg: VoteConfig) -> int:
    return _on_verdict(cfg, "vote")


def _settle(cfg: WorkIdConfig) -> int:
    return _on_verdict(cfg, "settle")


COMMANDS = (
    Command("disputes", DisputesConfig, _disputes,
            "a pool's verdicts, one JSON line each: accuser, hard or soft, until when "
            "disputable, challenged, votes, outcome (open, upheld, overturned)"),
    Command("challenge", WorkIdConfig, _challenge,
            "the accused work's provider disputes the verdict: it then stands only if enough "
            "other validators uphold it"),
    Command("vote", VoteConfig, _vote,
            "a bonded validator re-judges another's open verdict: --uphold true, or false to "
            "overturn it"),
    Command("settle", WorkIdConfig, _settle,
            "anyone: make a verdict final once its dispute period is over (slash, or restore "
            "the work and pay the validator's bond to the provider)"),
)
