"""A pool's work and what it earned: every work item of a pool (`works`, which a network's stop
report runs), one provider's rewards, and the signer's claimable rewards claimed."""

from __future__ import annotations

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.cli.common import Command, emit
from meshrl.protocol.config import ChainConfig, hex_address

__all__ = ["COMMANDS"]


class WorksConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="the pool whose work to list")


class RewardsConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="the pool")
    provider: str = Field("", description="the provider (default: the signer)")

    _provider = field_validator("provider", mode="before")(hex_address)


class ClaimConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="claim the signer's claimable rewards of this pool")
    batch: int = Field(64, ge=1, le=64, description="most work items per claim transaction: "
                       "fewer when the RPC's bounds (a filter's body and gas caps) take fewer, "
                       "halved on a refusal for size (meshrl.protocol.claiming)")


def _works(cfg: WorksConfig) -> int:
    from meshrl.protocol.history import pool_history
    from meshrl.protocol.local import open_protocol

    emit(pool_history(open_protocol(cfg.chain, signer=False), cfg.pool))
    return 0


def _rewards(cfg: RewardsConfig) -> int:
    from meshrl.protocol.history import provider_rewards
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=not cfg.provider)
    emit(provider_rewards(p, cfg.pool, cfg.provider or p.address))
    return 0


def _claim(cfg: ClaimConfig) -> int:
    from meshrl.protocol.claiming import claim_all
    from meshrl.protocol.history import provider_rewards
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    view = provider_rewards(p, cfg.pool, p.address)
    ids = [bytes.fromhex(w["work_id"]) for w in view["works"] if w["claimable"]]
    before = p.balance()
    done = claim_all(p, ids, cfg.batch)  # batches sized to the endpoint's bounds
    emit({"provider": p.address, "pool": cfg.pool, "claimed_items": done.items,
          "amount": p.balance() - before, "txs": done.txs, "batch": done.batch,
          "refused_for_size": done.refusals})
    return 0


COMMANDS = (
    Command("works", WorksConfig, _works,
            "a pool's work items (status, reward, claimable) and its invalidations, ejections, "
            "claims (one JSON object)"),
    Command("rewards", RewardsConfig, _rewards,
            "one provider's work in a pool: earned, claimable, claimed per node (reads only "
            "that provider's logs, batched)"),
    Command("claim", ClaimConfig, _claim, "claim every claimable reward of the signer in a pool"),
)
