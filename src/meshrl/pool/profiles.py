"""Proof profiles: which TOPLOC thresholds a pool's validators apply, and which compute meets them.

A profile is a public rule of the pool. Its thresholds are given here as overrides of the
calibrated defaults of `meshrl.toploc.Thresholds` (docs/toploc.md), so this package stays
torch-free and the calibration stays in `toploc`.

- "any-hardware": the calibrated `Thresholds()`, honest on any engine, kernel and precision the
  calibration covered (float32, bfloat16 and float16 compute, CPU engine and reference backend,
  small last chunks judged apart: benchmarks/bench_calibration.py); replay tolerances wide
  enough for bfloat16 workers on trained policies (sampling margin 0.5, top_p slack 0.04,
  log-probs 0.5 per token, mean log-prob bias 0.002 + 0.2 / sqrt(tokens); a near-tie choice is
  capped by the inexact-token rate), pooled TOPLOC tests from 1 chunk on,
  widened by sqrt(16 / n) below 16 chunks; for a model deeper than 4 layers the noise-driven
  bounds x (layers / 4) (`Thresholds.for_depth`, issue #40: x7.5 for SmolLM2-135M).
- "meshrl-cpu-engine": the same per-chunk tests, much tighter pooled tests from 1 chunk on (not
  widened with depth) and replay tolerances of 1e-4 (log-probs 1e-3). fp32 compute rounded
  to bf16 hidden states is nearly bit-exact across engines, decode kernels, batch sizes and
  thread counts (honest: sampling margin 0, log-probs within 4e-6), so honest CPU-engine files
  sit 25-250x inside them while int8 weights or one layer scaled by 1.1 do not, even in 1-chunk
  files, and neither does a single token chosen among near-ties (docs/roles.md, "Tolerances";
  benchmarks/bench_honest_margin.py); on SmolLM2 one layer x1.01 neither (issue #40). Honest
  bfloat16 files fail it, so it is honest only when
  every worker computes in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["PROFILES", "PROFILE_FIELD", "PROOF_PROFILES", "ProfileSpec", "ProofProfile",
           "profile", "unmet_profile"]

ProofProfile = Literal["any-hardware", "meshrl-cpu-engine"]
PROOF_PROFILES: tuple[str, ...] = ProofProfile.__args__  # type: ignore[attr-defined]
PROFILE_FIELD = "TOPLOC proof profile: " + " | ".join(PROOF_PROFILES)


@dataclass(frozen=True)
class ProfileSpec:
    """One proof profile: its threshold overrides and the compute dtypes it is honest for."""

    name: str
    thresholds: dict[str, float | int] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")  # compute it judges fairly


PROFILES: dict[str, ProfileSpec] = {
    "any-hardware": ProfileSpec("any-hardware"),
    "meshrl-cpu-engine": ProfileSpec(
        "meshrl-cpu-engine",
        # float32 recomputation is nearly bit-exact (docs/roles.md, "Tolerances"): every test
        # from one chunk / one token on, at 25-250x the largest honest value measured (log-probs
        # 1e-3: a policy with 8x sharper logits already differs by 3.8e-6)
        # pooled mantissa mean and inexact rate 0.05 (0.25 before issue #40): on SmolLM2 one
        # layer's MLP x1.01 gives 0.175 / 0.171 in a 48-chunk file, honest float32 <= 0.0003
        # (tiny models: 0.001, one chunk at most 0.008)
        {"max_pooled_exp_mismatch_rate": 0.005, "max_pooled_mant_err_mean": 0.05,
         "max_pooled_mant_inexact_rate": 0.05, "min_pooled_chunks": 1, "pooled_full_chunks": 1,
         "max_sampling_margin": 1e-4, "top_p_slack": 1e-4, "max_inexact_token_rate": 0.0,
         "max_logprob_diff": 1e-3, "max_logprob_bias": 1e-5, "logprob_bias_noise": 1e-3,
         "max_logprob_abs_mean": 1e-5,
         # no chunk is set apart as small: with the same engine a small chunk's values are as
         # exact as a full one's, and pooling every chunk keeps the pooled tests' strength (a
         # tiny pool's short completions are mostly small chunks; pooled over the one full
         # chunk left, a single exponent flip failed the 0.005 bound)
         "small_chunk_ratio": 0.0,
         # float32 noise does not grow with depth the way bf16 rounding does (SmolLM2's 30
         # layers: 0.003 of the chunk bound, issue #40): the bounds stay as measured
         "depth_exponent": 0.0},
        dtypes=("float32",)),
}


def profile(name: str) -> ProfileSpec:
    """The profile called `name` (KeyError names the known ones)."""
    if name not in PROFILES:
        raise KeyError(f"unknown proof profile {name!r} (known: {', '.join(PROFILES)})")
    return PROFILES[name]


def unmet_profile(name: str, dtype: str, backend: str, role: str = "worker") -> str | None:
    """Why a `role` computing in `dtype` (with `backend`) cannot work under profile `name`, or
    None when it can. "meshrl-cpu-engine" needs float32 compute: honest bfloat16 files fail its
    pooled tests (pooled exponent mismatch rate 0.012-0.024 > 0.005,
    tests/worker/test_worker_profile.py), and a validator recomputing in bfloat16 or float16
    fails honest float32 files the same way (issue #41: 80 of 80 files with bfloat16, 60 of 80
    with float16), so the rule binds the worker and the validator alike."""
    spec = profile(name)
    if dtype in spec.dtypes:
        return None
    harm = ("its honest files would be slashed" if role == "worker" else
            "it would slash honest float32 work")
    return (f"the pool's proof profile {name!r} holds only for {' or '.join(spec.dtypes)} "
            f"compute, and this {role} computes in {dtype} (backend {backend!r}): {harm}; set "
            f"dtype = \"float32\", or {'work' if role == 'worker' else 'judge'} for a pool "
            f"with proof profile 'any-hardware'")
