"""Reinforcement learning core: advantages, losses, and the asynchronous trainer (rollout
pipeline, warm-start, evaluation, checkpoints).

Names are resolved lazily (PEP 562) so that importing `meshrl.rl.cli` for `meshrl --help` does
not import torch. No export shares its name with a submodule: importing the submodule would
replace the exported object with the module (`meshrl.rl.evaluate.evaluate` is the function).
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "group_advantages": "advantages",
    "nonzero_groups": "advantages",
    "LossConfig": "config",
    "masked_mean": "losses",
    "policy_loss": "losses",
    "EvalCommandConfig": "config",
    "EvalConfig": "config",
    "ModelConfig": "config",
    "RLConfig": "config",
    "RolloutConfig": "config",
    "RunConfig": "config",
    "SFTConfig": "config",
    "TrainerConfig": "config",
    "SubprocessBackend": "subprocess_backend",
    "RolloutBatch": "rollouts",
    "collate": "rollouts",
    "generate_batch": "rollouts",
    "RolloutPipeline": "pipeline",
    "RolloutSource": "source",
    "PolicyPublisher": "source",
    "is_fresh": "pipeline",
    "required_version": "pipeline",
    "Trainer": "trainer",
    "lr_factor": "trainer",
    "PackCost": "packing",
    "pack_groups": "packing",
    "packed_logprobs": "packing",
    "warm_start": "sft",
    "evaluate_checkpoint": "evaluate",
    "heldout_problems": "evaluate",
    "latest_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "MetricsWriter": "metrics",
    "plot_curves": "metrics",
    "RLRun": "loop",
    "train": "loop",
    "DistributedConfig": "config",
    "FSDPTrainer": "distributed",
    "World": "distributed",
    "init_world": "distributed",
    "rank_share": "distributed",
    "shard_policy": "distributed",
    "DistributedRun": "dist_run",
    "load_sharded_state": "dcp_checkpoint",
    "save_sharded_state": "dcp_checkpoint",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr("meshrl.rl", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
