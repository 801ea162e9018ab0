"""Rollout batches: draw problems, generate groups of completions, score them.

A batch is identified by its index `k` (the trainer step meant to consume it) and carries the
policy `version` that generated it. Problems for batch `k` are a pure function of
(seed, node_id, step=k, counter), and sampling noise of (seed, k, seq_id, position), so a batch is
reproducible from its index and the generating weights alone: this is what lets a resumed run
match an uninterrupted one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from meshrl.inference import InferenceBackend, SamplingParams
from meshrl.pool import encode_prompt
from meshrl.rl.config import RolloutConfig
from meshrl.tasks import Problem, TaskSet

__all__ = [
    "RolloutBatch",
    "RolloutConfig",
    "collate",
    "draw_problems",
    "generate_batch",
]


def draw_problems(
    tasks: TaskSet,
    seed: int,
    node_id: str,
    step: int,
    n: int,
    exclude: frozenset[str] = frozenset(),
) -> list[Problem]:
    """`n` problems for `step`, skipping held-out prompts by drawing again with the next counter."""
    from meshrl.tasks import sample_problems

    out: list[Problem] = []
    counter = 0
    while len(out) < n:
        if counter > 64:
            raise RuntimeError("could not draw training problems outside the held-out set")
        fresh = sample_problems(tasks, seed, node_id, step, counter, n)
        out.extend(p for p in fresh if p.prompt not in exclude)
        counter += 1
    return out[:n]


@dataclass
class RolloutBatch:
    index: int
    version: int
    problems: list[Problem]  # one per group
    prompt_ids: list[list[int]]  # one per completion: groups * group_size rows
    completion_ids: list[list[int]]
    inference_logprobs: list[list[float]]
    rewards: torch.Tensor  # [groups, group_size] total reward
    task_rewards: torch.Tensor  # [groups, group_size] verifier score (accuracy)
    truncated: int
    gen_seconds: float
    # per completion token: whether the policy sampled it (False on tool outputs of an
    # episode); None: every completion token is the policy's
    loss_masks: list[list[bool]] | None = None

    @property
    def groups(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_completion_tokens + sum(len(p) for p in self.prompt_ids)

    @classmethod
    def concat(cls, parts: list[RolloutBatch], index: int, gen_seconds: float) -> RolloutBatch:
        """One batch of `parts`' groups in order (a step's accepted files), at `index`, of the
        oldest part's version. A part without loss masks contributes all-model ones."""
        masks = None
        if any(b.loss_masks is not None for b in parts):
            masks = [m for b in parts
                     for m in (b.loss_masks or [[True] * len(c) for c in b.completion_ids])]
        return cls(
            index=index,
            version=min(b.version for b in parts),
            problems=[p for b in parts for p in b.problems],
            prompt_ids=[r for b in parts for r in b.prompt_ids],
            completion_ids=[r for b in parts for r in b.completion_ids],
            inference_logprobs=[r for b in parts for r in b.inference_logprobs],
            rewards=torch.cat([b.rewards for b in parts]),
            task_rewards=torch.cat([b.task_rewards for b in parts]),
            truncated=sum(b.truncated for b in parts),
            gen_seconds=gen_seconds,
            loss_masks=masks,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutBatch:
        """The batch of `to_dict`'s output (a checkpoint's batches in flight)."""
        problems = [p if isinstance(p, Problem) else Problem(**p) for p in data["problems"]]
        return cls(**{**data, "problems": problems})


def batch_seed(seed: int, index: int) -> int:
    """The sampling seed of batch `index` (distinct per batch, fixed by the run seed)."""
    return (seed * 1_000_003 + index) % 2**63


def generate_batch(
    backend: InferenceBackend,
    tokenizer: Any,
    cfg: RolloutConfig,
    tasks: TaskSet,
    seed: int,
    index: int,
    version: int,
    exclude: frozenset[str] = frozenset(),
) -> RolloutBatch:
    """Draw batch `index`'s problems, sample `group_size` completions each with policy `version`
    (the one loaded into `backend`), and score them."""
    from meshrl.tasks import compute_reward

    t0 = time.perf_counter()
    problems = draw_problems(tasks, seed, cfg.node_id, index, cfg.prompts_per_step, exclude)
    g = cfg.group_size
    prompts = [encode_prompt(tokenizer, p.prompt, cfg.prompt_format)
               for p in problems for _ in range(g)]
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                            top_p=cfg.top_p, seed=batch_seed(seed, index))
    from meshrl.pool.episode import episode_of, run_episodes

    samples = run_episodes(backend, tokenizer, prompts,
                           [episode_of(tasks, problems[i // g]) for i in range(len(prompts))],
                           params, params.seed)
    made_by = {s.policy_version for s in samples}
    if made_by - {version}:
        raise RuntimeError(f"batch {index}: completions of policy versions {sorted(made_by)}, "
                           f"expected {version}")
    rewards, scores = [], []
    for i, s in enumerate(samples):
        text = tokenizer.decode(s.tokens)
        r = compute_reward(problems[i // g], text, len(s.tokens), tasks)
        rewards.append(r.total)
        scores.append(r.task)
    return RolloutBatch(
        index=index,
        version=version,
        problems=problems,
        prompt_ids=prompts,
        completion_ids=[s.tokens for s in samples],
        inference_logprobs=[s.logprobs for s in samples],
        rewards=torch.tensor(rewards, dtype=torch.float32).view(-1, g),
        task_rewards=torch.tensor(scores, dtype=torch.float32).view(-1, g),
        truncated=sum(s.finish_reason == "length" for s in samples),
        gen_seconds=time.perf_counter() - t0,
        loss_masks=[s.loss_mask for s in samples] if any(s.task for s in samples) else None,
    )


def collate(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    inference_logprobs: list[list[float]],
    pad_token_id: int,
    loss_masks: list[list[bool]] | None = None,
) -> dict[str, torch.Tensor]:
    """Right-padded [B, L] `input_ids`/`attention_mask`, and per-target tensors [B, L-1].

    Target position t holds token t+1; `loss_mask` marks completion tokens (those of
    `loss_masks`, when given: an episode's model tokens), `inference_logprobs` sits at the same
    positions (0 elsewhere).
    """
    rows = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
    n, width = len(rows), max(len(r) for r in rows)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1), dtype=torch.bool)
    inf_lp = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, (row, p, c) in enumerate(zip(rows, prompt_ids, completion_ids, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        loss_mask[i, len(p) - 1 : len(p) - 1 + len(c)] = True if loss_masks is None else \
            torch.tensor(loss_masks[i], dtype=torch.bool)
        inf_lp[i, len(p) - 1 : len(p) - 1 + len(c)] = torch.tensor(inference_logprobs[i])
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "inference_logprobs": inf_lp,
    }
