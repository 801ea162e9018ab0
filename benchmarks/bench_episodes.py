"""Validator CPU per agentic episode against the worker's (issue #45's target: <= 0.2).

The worker generates a file of episodes (`generate_rollouts`: turns, tool runs, proofs); the
validator judges it (`verify_file`: every row's episode check with its tool re-runs, the
model checks on the rows the pool's sampled-replay rule picks). Both on one thread, CPU time
of this process (`time.process_time`). The policy is tests/validator/episodes.py's caller
model (a real Qwen2 that writes calculator calls); the validator's share depends on the
replayed fraction, here the default rule (a quarter of the rows, at least `min_rows`).

    PYTHONPATH=src python benchmarks/bench_episodes.py [--files 4] [--max-new 96]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / "validator"),
                str(Path(__file__).resolve().parents[1] / "tests")]

from episodes import caller_model, episode_rules  # noqa: E402
from helpers import PROVIDER, assignment, claim, roundtrip  # noqa: E402

from meshrl.inference import CPUEngine, EngineConfig  # noqa: E402
from meshrl.model import CharTokenizer  # noqa: E402
from meshrl.validator.replay import ReplayConfig, profile_thresholds  # noqa: E402
from meshrl.validator.verify import verify_file  # noqa: E402
from meshrl.wire.rollout_file import segments  # noqa: E402
from meshrl.worker.rollouts import generate_rollouts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=96)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = CharTokenizer()
    engine = CPUEngine(caller_model(tok), tok, EngineConfig(num_threads=1))
    rules = episode_rules(max_new=args.max_new, max_tool_tokens=56, prompts=8, group=4)
    tasks = rules.task.build()
    cfg = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))
    work = check = 0.0
    env = rows = 0
    for counter in range(args.files):
        t0 = time.process_time()
        rf = generate_rollouts(engine, tok, assignment(rules, counter=counter), tasks, PROVIDER)
        work += time.process_time() - t0
        rf, sha = roundtrip(rf)
        block = "0x" + hashlib.sha256(b"block %d" % counter).hexdigest()
        t0 = time.process_time()
        d = verify_file(engine, tok, rf, replace(claim(rf, sha), block_hash=block), rules,
                        tasks, cfg)
        check += time.process_time() - t0
        assert d.accepted, d.reason
        rows += len(rf.completions)
        env += sum(1 for c in rf.completions for s in segments(c) if not s.model)
    print(f"{args.files} files, {rows} episodes, {env} tool outputs: worker "
          f"{work / rows * 1e3:.1f} ms CPU/episode, validator {check / rows * 1e3:.1f} ms "
          f"CPU/episode (tool re-runs included), ratio {check / work:.3f}")


if __name__ == "__main__":
    main()
