"""Shared helpers: a tiny real transformer, honest rollouts with proofs, recomputation modes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from meshrl.inference import Completion, ReferenceBackend, SamplingParams
from meshrl.model import CharTokenizer
from meshrl.toploc import build_proofs
from meshrl.toploc.recompute import recompute_mode
from meshrl.toploc.validate import Claim

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


def to_claims(gens: list[Completion]) -> list[Claim]:
    return [Claim.of(g, build_proofs(g.hidden_states)) for g in gens]


def run_worker(model, scenario: Scenario, prompts, max_new=MAX_NEW, seq_ids=None) -> list[Claim]:
    params = scenario.params.model_copy(update={"max_new_tokens": max_new,
                                                "return_hidden_states": True})
    return to_claims(ReferenceBackend(model, scenario.tok).generate(prompts, params, seq_ids))


def recompute(model, claims, mode: str):
    """Honest validator recomputation of `claims` in one of the HONEST_MODES."""
    return recompute_mode(model, [c.prompt_ids for c in claims], [c.token_ids for c in claims],
                          mode)


def groups(items: list, size: int = GROUP) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and on a busy CPU several threads spin-wait."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
