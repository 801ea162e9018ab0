"""Configuration of `meshrl validator` (torch-free, so `--help` answers fast)."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import Field, model_validator

from meshrl.config import Config
from meshrl.inference.params import ComputeDtype, DeviceName, EngineConfig, check_compute
from meshrl.pool.profiles import unmet_profile
from meshrl.pool.rules import RulesPins
from meshrl.protocol.config import ChainConfig
from meshrl.validator.policy import RetryConfig

__all__ = ["RogueConfig", "ShareConfig", "ValidatorConfig", "ValidatorKeysConfig"]


class ShareConfig(Config):
    """Which files this validator judges of its own accord: those whose work id (as a
    big-endian integer) is `index` mod `of`. Files outside its share it judges only when
    another validator accuses them (to vote on the verdict). Validators of a pool that agree
    on `of` and take distinct indices cover every file once between them."""

    index: int = Field(0, ge=0, description="this validator's share")
    of: int = Field(1, ge=1, description="how many shares the files are split into")
    audit: float = Field(0.0, ge=0, le=1, description="fraction of the other shares' files "
                         "this validator judges too, drawn by a hash of its address and the "
                         "work id (others cannot predict it): a validator that accepts bad "
                         "files of its own share is caught at that rate")

    @model_validator(mode="after")
    def _in_range(self) -> ShareConfig:
        if self.index >= self.of:
            raise ValueError(f"share: index {self.index} not below of {self.of}")
        return self

    def mine(self, work_id: bytes) -> bool:
        return int.from_bytes(work_id, "big") % self.of == self.index

    def judges(self, work_id: bytes, me: str) -> bool:
        """Whether this validator (address `me`) judges `work_id` of its own accord: its share,
        or an audit of another's."""
        if self.mine(work_id):
            return True
        draw = hashlib.sha256(work_id + bytes.fromhex(me.lower().removeprefix("0x"))).digest()
        return int.from_bytes(draw[:8], "big") < self.audit * 2**64


class RogueConfig(Config):
    """A dishonest validator, for tests and demos of disputes only (`meshrl adversary
    validator`, adversaries/validator.py): off unless set. `accuse-honest` hard-invalidates the
    first `accusations` files of its share that it judges valid (its votes on others' verdicts
    stay honest)."""

    mode: Literal["none", "accuse-honest"] = Field("none", description="none: honest")
    accusations: int = Field(2, ge=0, description="honest files to accuse")


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


class ValidatorConfig(Config):
    """`meshrl validator`: judge every file submitted to a pool; accept, or invalidate."""

    @model_validator(mode="after")
    def _compute(self) -> ValidatorConfig:
        check_compute(self.backend, self.device, self.dtype)
        # a pinned proof profile its own compute cannot honour: refused at load (the published
        # one is checked at start, `ValidatorNode._rules`), as a worker's is (issue #41)
        pinned = self.rules.proof_profile
        why = None if pinned is None else unmet_profile(pinned, self.dtype, self.backend,
                                                         "validator")
        if why is not None:
            raise ValueError(why)
        return self

    pool_id: int = Field(1, ge=1, description="compute pool to validate")
    orchestrator_url: str = Field("http://127.0.0.1:8600", description="the pool's orchestrator")
    work_dir: str = Field("runs/validator", description="state (block cursor) and policies")
    model_dir: str = Field("", description="policy version 0 when shardcast has none")
    poll_interval: float = Field(1.0, gt=0, description="seconds between chain polls")
    batch_files: int = Field(8, ge=1, description="files of one version judged together")
    max_files: int = Field(0, ge=0, description="stop after judging this many files (0: run)")
    leaf_memory: int = Field(100_000, ge=0, description="files of expanded batches remembered "
                             "past their batch's window (oldest evicted): a copy of one "
                             "submitted later is invalidated as a duplicate; 0: none")
    bond_verdicts: int = Field(8, ge=0, description="keep a bond posted for this many open "
                               "verdicts (the chain's verdict_bond each; 0: post none)")
    shardcast_servers: list[str] = Field(default_factory=list, description="where policy "
                                         "versions are fetched")
    rules_check_s: float = Field(10.0, gt=0, description="seconds between reads of the "
                                 "published rules (a change stops the validator)")
    keys: ValidatorKeysConfig = ValidatorKeysConfig(dev_index=0)
    chain: ChainConfig = ChainConfig()
    rules: RulesPins = Field(default_factory=RulesPins, description="rules this validator "
                             "expects: each one set must equal the pool's published value or "
                             "the validator refuses to start (it always judges by the "
                             "published rules)")
    share: ShareConfig = ShareConfig()
    rogue: RogueConfig = RogueConfig()
    backend: Literal["engine", "reference"] = Field(
        "engine", description="recomputation backend: meshrl's CPU engine ([engine], cpu and "
        "float32 only) or the naive Hugging Face loop on `device` in `dtype`")
    device: DeviceName = Field("cpu", description="where the recomputation (one prefill per "
                               "file, TOPLOC and the sampling replay) runs: cpu, cuda, cuda:N")
    dtype: ComputeDtype = Field("float32", description="compute dtype of the recomputation: "
                                "float32, bfloat16 or float16 (the engine: float32)")
    engine: EngineConfig = EngineConfig()
    retry: RetryConfig = RetryConfig()
    replay: dict[str, Any] = Field(default_factory=dict, description="ReplayConfig overrides "
                                   "(tolerances; `thresholds` replaces the proof profile's: "
                                   "experts only, a pool's workers cannot see it)")
