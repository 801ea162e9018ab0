"""TOPLOC verifiable inference: compact proofs of final hidden states, checked by one prefill.

`build_proofs` (worker) commits to each chunk's top-k activations; `verify_proofs` (validator)
compares them with its own recomputation; `verdict` turns ChunkResults into a `ProofVerdict`
(do the proofs hold) with the paper's thresholds or with thresholds from
`calibrate_thresholds`. Judging a rollout file (sampling replay, termination, log-probs and this
verdict, into a `meshrl.pool.Decision`) is the validator's, once: `meshrl.validator.replay`.

Names are imported lazily (PEP 562) so `meshrl toploc --help` does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "proofs": ["DEFAULT_CHUNK_SIZE", "DEFAULT_TOPK", "ChunkResult", "ProofError", "build_proofs",
               "build_proofs_many", "chunk_lengths", "find_moduli", "proof_from_base64",
               "proof_threads", "proof_to_base64", "to_bf16_bits", "verify_proofs",
               "verify_proofs_many"],
    "thresholds": ["HEADROOM", "ProofVerdict", "RolloutStats", "Thresholds",
                   "calibrate_thresholds", "pooled_limits", "rollout_stats", "tail_threshold",
                   "threshold_ratios", "verdict"],
    "calibrate": ["CalibrateConfig", "run_calibration"],
    "modes": ["HONEST_MODES"],
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_TOPK",
    "HEADROOM",
    "HONEST_MODES",
    "CalibrateConfig",
    "ChunkResult",
    "ProofError",
    "ProofVerdict",
    "RolloutStats",
    "Thresholds",
    "build_proofs",
    "build_proofs_many",
    "calibrate_thresholds",
    "chunk_lengths",
    "find_moduli",
    "pooled_limits",
    "proof_from_base64",
    "proof_threads",
    "proof_to_base64",
    "rollout_stats",
    "run_calibration",
    "tail_threshold",
    "threshold_ratios",
    "to_bf16_bits",
    "verdict",
    "verify_proofs",
    "verify_proofs_many",
]


__getattr__ = lazy_getattr("meshrl.toploc", _WHERE)


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from meshrl.toploc.calibrate import CalibrateConfig, run_calibration
    from meshrl.toploc.modes import HONEST_MODES
    from meshrl.toploc.proofs import (
        DEFAULT_CHUNK_SIZE,
        DEFAULT_TOPK,
        ChunkResult,
        ProofError,
        build_proofs,
        build_proofs_many,
        chunk_lengths,
        find_moduli,
        proof_from_base64,
        proof_threads,
        proof_to_base64,
        to_bf16_bits,
        verify_proofs,
        verify_proofs_many,
    )
    from meshrl.toploc.thresholds import (
        HEADROOM,
        ProofVerdict,
        RolloutStats,
        Thresholds,
        calibrate_thresholds,
        pooled_limits,
        rollout_stats,
        tail_threshold,
        threshold_ratios,
        verdict,
    )
