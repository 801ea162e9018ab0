"""`meshrl toploc calibrate`: measure honest noise on this hardware, derive thresholds, report.

1. Honest workers generate completions (the reference backend on bf16 weights: KV-cache
   decoding, seeded sampler, no stop at EOS) and prove them.
2. The validator recomputes them in every honest mode (`recompute.HONEST_MODES`: batch size,
   padding, threads, attention kernel, fp32) and collects ChunkResults.
3. Thresholds come from the calibration half (`calibrate_thresholds` at the chosen rate); the
   other half measures the honest false-positive rate, per chunk and per rollout.
4. Each subtle change (one layer's MLP scaled, all weights noised, weights quantized) is run as
   a cheating worker and its rejection rate is measured under the paper's defaults and under
   the calibrated thresholds. Everything goes to one JSON file; progress goes to stderr.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from meshrl.config import Config
from meshrl.toploc.modes import HONEST_MODES

if TYPE_CHECKING:
    from meshrl.toploc.proofs import ChunkResult
    from meshrl.toploc.thresholds import Thresholds

__all__ = ["CalibrateConfig", "run_calibration"]


class CalibrateConfig(Config):
    preset: str = Field("qwen2-4l-256", description="model preset (random init)")
    model_seed: int = Field(0, description="initialisation seed of the preset")
    model_dir: str = Field("", description="HF model directory instead of a preset")
    calib_prompts: int = Field(32, description="prompts whose recomputations set thresholds")
    eval_prompts: int = Field(32, description="held-out prompts measuring honest rejections")
    cheat_prompts: int = Field(16, description="prompts per subtle change")
    max_new_tokens: int = Field(128, description="tokens per completion (no EOS)")
    group: int = Field(4, description="completions per rollout")
    seed: int = Field(1234, description="sampling seed")
    fpr: float = Field(1e-3, description="target honest rejection rate per rollout")
    chunk_margin: float = Field(3.0, description="widen per-chunk thresholds from the median")
    pooled_margin: float = Field(2.0, description="widen pooled thresholds from the median")
    modes: list[str] = Field(list(HONEST_MODES), description="honest recompute modes")
    cheat_mode: str = Field("bf16-batch8", description="validator mode for the cheat rows")
    scales: list[float] = Field([1.01, 1.02, 1.05, 1.1, 1.5], description="layer MLP scales")
    noises: list[float] = Field([0.001, 0.002, 0.005, 0.01, 0.05], description="relative noise")
    bits: list[int] = Field([8, 6, 4], description="weight quantization bit widths")
    threads: int = Field(1, description="torch threads (tiny models run best on one)")
    out: str = Field("runs/toploc_calibration.json", description="JSON report path")
    save_raw: bool = Field(True, description="include every ChunkResult in the report")


Rollouts = list[list["ChunkResult"]]


def _prompts(n: int, offset: int, vocab: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(offset)
    lens = torch.randint(4, 24, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (m,), generator=g).tolist() for m in lens]


def _worker(model, prompts, cfg: CalibrateConfig, first_seq: int):
    from meshrl.inference import ReferenceBackend, SamplingParams
    from meshrl.toploc.proofs import build_proofs

    seq_ids = list(range(first_seq, first_seq + len(prompts)))
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, ignore_eos=True,
                            return_hidden_states=True)
    gens = ReferenceBackend(model).generate(prompts, params, seq_ids)
    return [(g.prompt_ids, g.token_ids, build_proofs(g.hidden_states)) for g in gens]


def _check(model, work, mode: str, group: int) -> Rollouts:
    from meshrl.toploc.proofs import verify_proofs
    from meshrl.toploc.recompute import recompute_mode

    rec = recompute_mode(model, [w[0] for w in work], [w[1] for w in work], mode)
    per = [verify_proofs(r.hidden_states, w[2]) for w, r in zip(work, rec, strict=True)]
    return [[r for p in per[i : i + group] for r in p] for i in range(0, len(per), group)]


def _rates(rollouts: Rollouts, th: Thresholds) -> dict[str, float]:
    from meshrl.toploc.thresholds import verdict

    chunks = [c for ro in rollouts for c in ro]
    chunk_rej = sum(not verdict([c], th.model_copy(update={"min_pooled_chunks": 10**9})).accepted
                    for c in chunks)
    roll_rej = sum(not verdict(ro, th).accepted for ro in rollouts)
    return {"chunk_reject": chunk_rej / len(chunks), "rollout_reject": roll_rej / len(rollouts),
            "chunks": len(chunks), "rollouts": len(rollouts)}


def _summary(rollouts: Rollouts) -> dict[str, float]:
    chunks = [c for ro in rollouts for c in ro]
    return {
        "exp_mismatches_max": max(c.exp_mismatches for c in chunks),
        "mant_err_mean_max": max(c.mant_err_mean for c in chunks),
        "mant_err_mean_avg": sum(c.mant_err_mean for c in chunks) / len(chunks),
    }


def _raw(rollouts: Rollouts) -> list[list[list[float]]]:
    return [[[c.exp_mismatches, c.mant_err_mean, c.mant_err_median, c.n_matched, c.n_exact]
             for c in ro] for ro in rollouts]


def _changes(cfg: CalibrateConfig) -> list[tuple[str, Callable[[Any], Any]]]:
    from meshrl.toploc import perturb

    out: list[tuple[str, Callable[[Any], Any]]] = []
    out += [(f"layer_mlp_x{s}", lambda m, s=s: perturb.scale_layer_mlp(m, s)) for s in cfg.scales]
    out += [(f"noise_{n:g}", lambda m, n=n: perturb.noise_weights(m, n)) for n in cfg.noises]
    out += [(f"int{b}", lambda m, b=b: perturb.quantize_weights(m, b)) for b in cfg.bits]
    return out


def _load_model(cfg: CalibrateConfig):
    import torch

    from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer

    if cfg.model_dir:
        return load_model(cfg.model_dir).to(torch.bfloat16).eval(), load_tokenizer(cfg.model_dir)
    tok = CharTokenizer()
    return build_model(cfg.preset, tok.vocab_size, seed=cfg.model_seed,
                       dtype=torch.bfloat16), tok


def run_calibration(cfg: CalibrateConfig, modes: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the whole measurement; returns (and writes to cfg.out) the JSON report."""
    import torch

    from meshrl.log import get_logger, log_event
    from meshrl.toploc.thresholds import Thresholds, calibrate_thresholds

    log = get_logger("meshrl.toploc.calibrate")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.time()
    model, tok = _load_model(cfg)
    modes = list(modes or cfg.modes)
    n_honest = cfg.calib_prompts + cfg.eval_prompts
    work = _worker(model, _prompts(n_honest, 1, tok.vocab_size), cfg, 0)
    log_event(log, "honest completions generated", n=len(work), s=round(time.time() - t0, 1))
    calib: Rollouts = []
    held_out: dict[str, Rollouts] = {}
    for mode in modes:
        calib += _check(model, work[: cfg.calib_prompts], mode, cfg.group)
        held_out[mode] = _check(model, work[cfg.calib_prompts :], mode, cfg.group)
        log_event(log, "honest mode recomputed", mode=mode, s=round(time.time() - t0, 1))
    th = calibrate_thresholds(calib, fpr=cfg.fpr, chunk_margin=cfg.chunk_margin,
                              pooled_margin=cfg.pooled_margin)
    default = Thresholds()
    report: dict[str, Any] = {
        "model": cfg.model_dir or cfg.preset, "fpr_target": cfg.fpr,
        "calibrated_thresholds": th.model_dump(), "default_thresholds": default.model_dump(),
        "honest": {m: {"default": _rates(r, default), "calibrated": _rates(r, th),
                       **_summary(r)} for m, r in held_out.items()},
        "changes": {},
        "raw": {"calib": _raw(calib), "honest": {m: _raw(r) for m, r in held_out.items()},
                "changes": {}},
    }
    cheat_prompts = _prompts(cfg.cheat_prompts, 2, tok.vocab_size)
    for name, change in _changes(cfg):
        bad = _worker(change(model), cheat_prompts, cfg, 10_000)
        rollouts = _check(model, bad, cfg.cheat_mode, cfg.group)
        report["raw"]["changes"][name] = _raw(rollouts)
        report["changes"][name] = {"default": _rates(rollouts, default),
                                   "calibrated": _rates(rollouts, th), **_summary(rollouts)}
        log_event(log, "change measured", change=name, s=round(time.time() - t0, 1),
                  **{k: v["rollout_reject"] for k, v in report["changes"][name].items()
                     if isinstance(v, dict)})
    report["seconds"] = round(time.time() - t0, 1)
    if not cfg.save_raw:
        del report["raw"]
    if cfg.out:
        path = Path(cfg.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
    return report
