"""`meshrl chain devnet`: make a fresh local chain (anvil) ready for a whole pool, idempotently.

Deploys the contracts with the federator key (unless the deployment file already names
contracts that exist on this chain: a resumed network), gives every listed address gas, mints
stake tokens to the providers, grants the validator role, and creates and starts one pool with
the given manager; a federator with little gas (a network's generated key; anvil's account 0
has plenty) is given some first. Prints `{"pool_id", "deployment", "deployed"}` as one JSON
line. Local chains only: gas comes from `anvil_setBalance`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.config import ChainConfig, ProtocolParams, hex_address

__all__ = ["DevnetConfig", "setup_devnet"]

TOKEN = 10**18


class DevnetConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)  # private_key: the federator
    params: ProtocolParams = Field(default_factory=ProtocolParams)
    manager: str = Field("", description="the pool manager (the orchestrator's key)")
    validators: list[str] = Field(default_factory=list, description="addresses given the role")
    providers: list[str] = Field(default_factory=list, description="addresses given tokens")
    provider_tokens: int = Field(1_000, ge=0, description="whole tokens minted to each provider")
    fund: list[str] = Field(default_factory=list, description="addresses given gas")
    domain: str = Field("arithmetic", description="the pool's domain name")
    reward_rate: int = Field(10**15, ge=0, description="token base units per work unit")
    max_units: int = Field(1 << 20, ge=1, description="work units a file may claim")

    _addrs = field_validator("manager", "validators", "providers", "fund",
                             mode="before")(hex_address)


def setup_devnet(cfg: DevnetConfig) -> dict[str, object]:
    from meshrl.protocol.chain import Deployment, Protocol, deploy
    from meshrl.protocol.local import connect, load_account

    backend = connect(cfg.chain)
    fed = load_account(cfg.chain)
    path = Path(cfg.chain.deployment)
    done = path.parent / "pool.json"
    if path.is_file() and done.is_file():
        dep = Deployment.load(path)
        if backend.w3.eth.get_code(dep.protocol):  # the chain kept its state: resume
            return {**json.loads(done.read_text()), "deployed": False}
    for a in {*cfg.fund, cfg.manager, *cfg.validators, *cfg.providers} - {""}:
        backend.fund(a, 10**21)
    if backend.w3.eth.get_balance(fed.address) < 10**20:  # a generated federator: gas to deploy
        backend.fund(fed.address, 10**21)
    dep = deploy(backend, fed, cfg.params)
    path.parent.mkdir(parents=True, exist_ok=True)
    dep.save(path)
    chain = Protocol(backend, dep, fed)
    for v in cfg.validators:
        chain.set_validator(v)
        chain.mint(v, cfg.provider_tokens * TOKEN)  # enough to post a bond (`post_bond`)
    for p in cfg.providers:
        chain.mint(p, cfg.provider_tokens * TOKEN)
    pool = chain.create_pool(chain.create_domain(cfg.domain), cfg.manager, cfg.reward_rate,
                             cfg.max_units)
    chain.start_pool(pool)
    out = {"pool_id": int(pool), "deployment": str(path), "deployed": True}
    done.write_text(json.dumps(out))
    return out
