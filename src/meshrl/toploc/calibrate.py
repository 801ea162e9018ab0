"""`meshrl toploc calibrate`: measure honest noise over the honest variation, derive thresholds.

1. Every honest worker setup (`honest.HONEST_WORKERS`: meshrl's decoder, `transformers`
   generate at several batch sizes, thread counts and attention kernels) generates completions
   and proves them; its proofs are byte-identical to the reference library's.
2. Every honest validator setup (`honest.HONEST_VALIDATORS`) recomputes every completion and
   verifies its proofs: workers x validators x prompts x chunks honest ChunkResults.
3. Thresholds are fitted on the calibration half of the prompts (`calibrate_thresholds`); the
   held-out half, and all honest chunks together, measure false rejections and how close honest
   statistics come to each threshold (`threshold_ratios`), under the fitted thresholds and the
   defaults of `Thresholds`.
4. Each subtle change (weights quantized, one layer's MLP scaled, all weights noised) runs as a
   cheating worker checked by every validator setup; its rejection rate is measured under the
   defaults, the fitted thresholds and the paper's. One JSON report; progress on stderr.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from meshrl.config import Config

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
    cheat_prompts: int = Field(16, description="prompts per subtle change and worker setup")
    max_new_tokens: int = Field(128, description="tokens per completion (no EOS)")
    group: int = Field(4, description="completions per rollout")
    seed: int = Field(1234, description="sampling seed")
    fpr: float = Field(1e-4, description="false-positive budget: honest rejections per rollout")
    chunk_margin: float = Field(3.0, description="widen per-chunk thresholds from the median")
    pooled_margin: float = Field(2.0, description="widen pooled thresholds from the median")
    workers: list[str] = Field([], description="honest worker setups (empty: all)")
    validators: list[str] = Field([], description="honest validator setups (empty: all)")
    cheat_workers: list[str] = Field(["meshrl-b16", "hf-b1"],
                                     description="worker setups the cheats run in")
    scales: list[float] = Field([1.1], description="one layer's MLP output scaled by")
    noises: list[float] = Field([0.01], description="relative weight noise")
    bits: list[int] = Field([8], description="weight quantization bit widths")
    out: str = Field("runs/toploc_calibration.json", description="JSON report path")
    save_raw: bool = Field(False, description="include every ChunkResult in the report")


Rollouts = list[list["ChunkResult"]]


def _prompts(n: int, offset: int, vocab: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(offset)
    lens = torch.randint(4, 24, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (m,), generator=g).tolist() for m in lens]


def _pick(setups: tuple, names: list[str]) -> list:
    known = {s.name: s for s in setups}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown setup(s) {unknown}; known: {', '.join(known)}")
    return [known[n] for n in names] if names else list(setups)


def _prove(model, setup, prompts, cfg: CalibrateConfig, first_seq: int):
    from meshrl.toploc.honest import work_with
    from meshrl.toploc.proofs import build_proofs

    work = work_with(model, setup, prompts, cfg.max_new_tokens, cfg.seed, first_seq)
    return [(tokens, build_proofs(hidden)) for tokens, hidden in work]


def _check(model, setup, prompts, work, group: int) -> Rollouts:
    """Verify every completion of `work` in validator `setup`; rollouts of `group` completions."""
    from meshrl.toploc.honest import recompute_with
    from meshrl.toploc.proofs import verify_proofs

    hidden = recompute_with(model, setup, prompts, [w[0] for w in work])
    per = [verify_proofs(h, w[1]) for h, w in zip(hidden, work, strict=True)]
    return [[r for p in per[i : i + group] for r in p] for i in range(0, len(per), group)]


def _rates(rollouts: Rollouts, th: Thresholds) -> dict[str, Any]:
    from meshrl.toploc.thresholds import threshold_ratios, verdict

    chunks = [c for ro in rollouts for c in ro]
    alone = th.model_copy(update={"min_pooled_chunks": 10**9})
    chunk_rej = sum(not verdict([c], alone).accepted for c in chunks)
    roll_rej = sum(not verdict(ro, th).accepted for ro in rollouts)
    return {"chunk_reject": chunk_rej / len(chunks), "rollout_reject": roll_rej / len(rollouts),
            "chunks": len(chunks), "rollouts": len(rollouts),
            "max_ratio": {k: round(v, 4) for k, v in threshold_ratios(rollouts, th).items()}}


def _raw(rollouts: Rollouts) -> list[list[list[float]]]:
    return [[[c.exp_mismatches, c.mant_err_mean, c.mant_err_median, c.n_matched, c.n_exact,
              c.sign_mismatches] for c in ro] for ro in rollouts]


def _changes(cfg: CalibrateConfig) -> list[tuple[str, Callable[[Any], Any]]]:
    from meshrl.toploc import perturb

    out: list[tuple[str, Callable[[Any], Any]]] = []
    out += [(f"int{b}", lambda m, b=b: perturb.quantize_weights(m, b)) for b in cfg.bits]
    out += [(f"layer_mlp_x{s}", lambda m, s=s: perturb.scale_layer_mlp(m, s)) for s in cfg.scales]
    out += [(f"noise_{n:g}", lambda m, n=n: perturb.noise_weights(m, n)) for n in cfg.noises]
    return out


def _load_model(cfg: CalibrateConfig):
    import torch

    from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer

    if cfg.model_dir:
        return load_model(cfg.model_dir).to(torch.bfloat16).eval(), load_tokenizer(cfg.model_dir)
    tok = CharTokenizer()
    return build_model(cfg.preset, tok.vocab_size, seed=cfg.model_seed,
                       dtype=torch.bfloat16), tok


def _honest(model, cfg, workers, validators, prompts, log, t0) -> dict[str, Rollouts]:
    """Rollouts per "worker|validator" pair, prompts in order."""
    from meshrl.log import log_event

    out = {}
    for w in workers:
        work = _prove(model, w, prompts, cfg, 0)
        for v in validators:
            out[f"{w.name}|{v.name}"] = _check(model, v, prompts, work, cfg.group)
        log_event(log, "honest worker checked", worker=w.name, s=round(time.time() - t0, 1))
    return out


def run_calibration(cfg: CalibrateConfig) -> dict[str, Any]:
    """Run the whole measurement; returns (and writes to cfg.out) the JSON report."""
    from meshrl.log import get_logger, log_event
    from meshrl.toploc.honest import HONEST_VALIDATORS, HONEST_WORKERS
    from meshrl.toploc.thresholds import Thresholds, calibrate_thresholds

    log = get_logger("meshrl.toploc.calibrate")
    t0 = time.time()
    model, tok = _load_model(cfg)
    workers = _pick(HONEST_WORKERS, cfg.workers)
    validators = _pick(HONEST_VALIDATORS, cfg.validators)
    prompts = _prompts(cfg.calib_prompts + cfg.eval_prompts, 1, tok.vocab_size)
    honest = _honest(model, cfg, workers, validators, prompts, log, t0)
    n_calib = cfg.calib_prompts // cfg.group  # rollouts of the calibration half
    calib = [ro for rs in honest.values() for ro in rs[:n_calib]]
    held_out = [ro for rs in honest.values() for ro in rs[n_calib:]]
    every = [ro for rs in honest.values() for ro in rs]
    fitted = calibrate_thresholds(calib, fpr=cfg.fpr, chunk_margin=cfg.chunk_margin,
                                  pooled_margin=cfg.pooled_margin,
                                  min_pooled_chunks=Thresholds().pooled_full_chunks)
    sets = {"default": Thresholds(), "fitted": fitted, "paper": Thresholds.paper()}
    report: dict[str, Any] = {
        "model": cfg.model_dir or cfg.preset, "fpr_budget": cfg.fpr, "config": cfg.model_dump(),
        "workers": [w.name for w in workers], "validators": [v.name for v in validators],
        "thresholds": {k: th.model_dump() for k, th in sets.items()},
        "honest_all": {k: _rates(every, th) for k, th in sets.items()},
        "honest_held_out": {k: _rates(held_out, th) for k, th in sets.items()},
        "honest_pairs": {p: _rates(rs, sets["default"]) for p, rs in honest.items()},
        "changes": {},
    }
    log_event(log, "honest measured", chunks=report["honest_all"]["default"]["chunks"],
              s=round(time.time() - t0, 1))
    cheat_prompts = _prompts(cfg.cheat_prompts, 2, tok.vocab_size)
    raw_changes = {}
    for name, change in _changes(cfg):
        bad_model = change(model)
        rollouts: Rollouts = []
        for w in _pick(HONEST_WORKERS, cfg.cheat_workers):
            work = _prove(bad_model, w, cheat_prompts, cfg, 10_000)
            rollouts += [ro for v in validators
                         for ro in _check(model, v, cheat_prompts, work, cfg.group)]
        raw_changes[name] = _raw(rollouts)
        report["changes"][name] = {k: _rates(rollouts, th) for k, th in sets.items()}
        log_event(log, "change measured", change=name, s=round(time.time() - t0, 1),
                  **{k: v["rollout_reject"] for k, v in report["changes"][name].items()})
    report["seconds"] = round(time.time() - t0, 1)
    if cfg.save_raw:
        report["raw"] = {"honest": {p: _raw(rs) for p, rs in honest.items()},
                         "changes": raw_changes}
    if cfg.out:
        path = Path(cfg.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
    return report
