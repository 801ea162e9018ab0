"""Shared helpers: a tiny real transformer, honest rollouts with proofs, recomputation modes, and
judging groups of rows with the validator's own replay (`meshrl.validator.replay.replay_files`,
the code a pool runs) into the pool's `Decision`s."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from meshrl.inference import Completion, InferenceBackend, ReferenceBackend, SamplingParams
from meshrl.model import CharTokenizer
from meshrl.pool import Decision, decide
from meshrl.toploc import Thresholds, build_proofs
from meshrl.toploc.recompute import recompute_mode
from meshrl.validator.replay import ReplayConfig, ReplaySpec, replay_files
from meshrl.wire.rollout_file import Completion as Row

PRESET = "qwen2-tiny"
MAX_NEW = 128
GROUP = 4  # completions per rollout


@dataclass
class Scenario:
    tok: CharTokenizer
    model: torch.nn.Module  # bf16, what honest workers run
    params: SamplingParams
    prompts: list[list[int]]


def make_prompts(n: int, seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(4, 24, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (m,), generator=g).tolist() for m in lens]


def as_row(g: Completion, proofs: list[bytes]) -> Row:
    """The file row a worker writes of generation `g` (the fields the replay reads; the
    assignment's own ids and the reward are the model-free checks')."""
    return Row(prompt_id="", counter=0, sample_index=0, seq_id=g.seq_id,
               prompt_tokens=list(g.prompt_ids), completion_tokens=list(g.token_ids),
               logprobs=list(g.logprobs), reward=0.0, finish_reason=g.finish_reason,
               toploc_proofs=proofs)


def to_rows(gens: list[Completion]) -> list[Row]:
    """What a worker submits of each completion: its tokens, log-probs, finish reason, seq id
    and the TOPLOC proofs of its hidden states (which stay with the worker)."""
    return [as_row(g, build_proofs(g.hidden_states)) for g in gens]


def run_worker(model, scenario: Scenario, prompts, max_new=MAX_NEW,
               seq_ids=None) -> list[Row]:
    params = scenario.params.model_copy(update={"max_new_tokens": max_new,
                                                "return_hidden_states": True})
    return to_rows(ReferenceBackend(model, scenario.tok).generate(prompts, params, seq_ids))


def recompute(model, rows, mode: str):
    """Honest validator recomputation of `rows` in one of the HONEST_MODES."""
    return recompute_mode(model, [r.prompt_tokens for r in rows],
                          [r.completion_tokens for r in rows], mode)


def groups(items: list, size: int = GROUP) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def spec_of(params: SamplingParams, eos_token_id: int | None,
            max_new: int | None = None) -> ReplaySpec:
    """How rows sampled with `params` had to be sampled (what a pool's rules say)."""
    eos = () if eos_token_id is None or params.ignore_eos else (eos_token_id,)
    return ReplaySpec(seed=params.seed, max_new_tokens=max_new or params.max_new_tokens,
                      temperature=params.temperature, top_p=params.top_p, eos_token_ids=eos,
                      stop_token_ids=tuple(params.stop_token_ids))


def judge(backend: InferenceBackend, rows: Sequence[Row], spec: ReplaySpec,
          thresholds: Thresholds) -> list[Decision]:
    """The validator's decision on each rollout of GROUP rows, replayed by `backend`."""
    files = [(g, spec) for g in groups(list(rows))]
    cfg = ReplayConfig(thresholds=thresholds)
    return [decide(findings, asdict(stats))
            for findings, stats in replay_files(backend, files, cfg)]


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and on a busy CPU several threads spin-wait."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
