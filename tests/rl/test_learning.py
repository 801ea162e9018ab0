"""The whole job, shortened: warm-start to a capped accuracy, then async RL must improve on it.

Single-digit addition keeps it to about a minute on 2 cores: 100 distinct problems, 40 of them
held out (never trained on). Each sum is an independent fact, so nothing learned on the 60
training problems transfers to the held-out ones: held-out accuracy after RL is a coin toss
(seed and CPU kernel set decide it; see benchmarks/README.md, "test_learning"). What RL must
do here is raise the reward on the problems it trains on; held-out learning is what `make demo`
shows on 2-digit addition, where there is structure to generalise.
"""

from __future__ import annotations

import json

import pytest

from meshrl.rl.loop import train


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["engine", "reference"])
def test_rl_improves_on_the_warm_start(tiny_cfg, tmp_path, backend):
    cfg = tiny_cfg(**{
        "rollout.backend": backend,
        "tasks.mix": '[{type="arithmetic", digits=1}]',
        "eval.num_problems": 40, "eval.every": 20,
        "sft.max_steps": 300, "sft.batch_size": 32, "sft.lr": 3e-3, "sft.eval_every": 10,
        "sft.target_accuracy": 0.15, "sft.max_accuracy": 0.4,
        "steps": 100, "async_level": 2, "trainer.lr": 1e-3, "trainer.warmup_steps": 10,
        "rollout.prompts_per_step": 16, "rollout.group_size": 8,
        "run.plot": True,
    })
    summary = train(cfg)
    records = [json.loads(x) for x in (tmp_path / "runs" / "arithmetic" / "metrics.jsonl")
               .read_text().splitlines()]
    warm = next(r for r in records if r["kind"] == "warm_start")
    rl_evals = [r["accuracy"] for r in records if r["kind"] == "eval" and r["phase"] == "rl"]
    steps = [r for r in records if r["kind"] == "step"]
    assert 0.15 <= warm["accuracy"] <= 0.4  # the warm-start stops inside its window
    assert rl_evals[0] == warm["accuracy"]  # RL starts from the warm-start snapshot
    # the batch accuracy (mean verifier score of 16 x 8 sampled completions) over the last 20
    # steps must beat the first 20 by 5 points: ~2,500 samples each side, so the difference has a
    # standard error of ~0.014 (measured: +8 to +10 points)
    acc = [r["accuracy"] for r in steps]
    first, last = sum(acc[:20]) / 20, sum(acc[-20:]) / 20
    assert last >= first + 0.05, (first, last)
    assert summary["accuracy"] == rl_evals[-1]  # the summary reports the final held-out eval
    assert max(r["staleness"] for r in steps) == 2 and min(r["staleness"] for r in steps) == 0
    assert (tmp_path / "runs" / "arithmetic" / "curves.png").is_file()
