"""TOPLOC verifiable inference: compact proofs of final hidden states, checked by one prefill.

`build_proofs` (worker) commits to each chunk's top-k activations; `verify_proofs` (validator)
compares them with its own recomputation; `verdict` turns ChunkResults into accept / reject with
the paper's thresholds or with thresholds from `calibrate_thresholds`. `checks` holds the
sampling, termination, log-prob and reward checks that run beside it.
"""

from meshrl.toploc.checks import (
    CheckResult,
    check_logprobs,
    check_rewards,
    check_sampling,
    check_termination,
    recompute_logprobs,
)
from meshrl.toploc.proofs import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_TOPK,
    ChunkResult,
    ProofError,
    build_proofs,
    find_moduli,
    proof_from_base64,
    proof_to_base64,
    to_bf16_bits,
    verify_proofs,
)
from meshrl.toploc.verdict import (
    RolloutStats,
    Thresholds,
    Verdict,
    calibrate_thresholds,
    rollout_stats,
    tail_threshold,
    verdict,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_TOPK",
    "CheckResult",
    "ChunkResult",
    "ProofError",
    "RolloutStats",
    "Thresholds",
    "Verdict",
    "build_proofs",
    "calibrate_thresholds",
    "check_logprobs",
    "check_rewards",
    "check_sampling",
    "check_termination",
    "find_moduli",
    "proof_from_base64",
    "proof_to_base64",
    "recompute_logprobs",
    "rollout_stats",
    "tail_threshold",
    "to_bf16_bits",
    "verdict",
    "verify_proofs",
]
