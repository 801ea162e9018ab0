"""Configuration of `meshrl validator` (torch-free, so `--help` answers fast)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from meshrl.config import Config
from meshrl.inference.params import EngineConfig
from meshrl.protocol.config import ChainConfig
from meshrl.validator.policy import RetryConfig
from meshrl.wire.models import PROFILE_FIELD, ProofProfile

__all__ = ["PoolRulesConfig", "ValidatorConfig", "ValidatorKeysConfig"]


class ValidatorKeysConfig(Config):
    """The validator's key: a keystore file (password from env or file) or a dev account."""

    keystore: str = Field("", description="eth-account keystore file")
    password_env: str = Field("MESHRL_KEYSTORE_PASSWORD", description="variable with the password")
    password_file: str = Field("", description="file holding the password (instead of the env)")
    dev_index: int | None = Field(None, ge=0, description="local chains only: anvil's test "
                                  "mnemonic account of this index")

    @model_validator(mode="after")
    def _one(self) -> ValidatorKeysConfig:
        if (self.dev_index is None) == (not self.keystore):
            raise ValueError("validator keys: give exactly one of keystore or dev_index")
        return self


class PoolRulesConfig(Config):
    """The pool's public rules (the same values as the orchestrator's [work] section)."""

    async_level: int = Field(2, ge=0, description="policy versions a file may lag its step")
    task: dict[str, Any] = Field(default_factory=lambda: {"type": "arithmetic"},
                                 description="task config (one task or a whole tasks mix)")
    sampling: dict[str, Any] = Field(default_factory=lambda: {"max_new_tokens": 64,
                                     "temperature": 1.0}, description="sampling parameters")
    seed: int = Field(0, ge=0, description="base seed prompts are derived from")
    prompts_per_file: int = Field(8, ge=1, description="prompts per rollout file")
    shardcast_servers: list[str] = Field(default_factory=list, description="policy sources")
    proof_profile: ProofProfile = Field(
        "any-hardware", description=PROFILE_FIELD + " (the validator refuses to start when the "
        "orchestrator publishes another)")


class ValidatorConfig(Config):
    """`meshrl validator`: judge every file submitted to a pool; accept, or invalidate."""

    pool_id: int = Field(1, ge=1, description="compute pool to validate")
    orchestrator_url: str = Field("http://127.0.0.1:8600", description="the pool's orchestrator")
    work_dir: str = Field("runs/validator", description="state (block cursor) and policies")
    model_dir: str = Field("", description="policy version 0 when shardcast has none")
    poll_interval: float = Field(1.0, gt=0, description="seconds between chain polls")
    batch_files: int = Field(8, ge=1, description="files of one version judged together")
    max_files: int = Field(0, ge=0, description="stop after judging this many files (0: run)")
    keys: ValidatorKeysConfig = ValidatorKeysConfig(dev_index=0)
    chain: ChainConfig = ChainConfig()
    pool: PoolRulesConfig = PoolRulesConfig()
    engine: EngineConfig = EngineConfig()
    retry: RetryConfig = RetryConfig()
    replay: dict[str, Any] = Field(default_factory=dict, description="ReplayConfig overrides "
                                   "(tolerances; `thresholds` replaces the proof profile's: "
                                   "experts only, a pool's workers cannot see it)")
