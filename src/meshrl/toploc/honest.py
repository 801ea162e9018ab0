"""The honest variation a validator must accept: who generated, and how the validator recomputed.

A worker may decode with any engine, batch size, thread count or attention kernel, and a
validator may recompute with any of them too; each choice moves the final hidden states by real
float noise. Calibration (`calibrate.py`) proves honest completions in every `WorkerSetup` and
checks them in every `ValidatorSetup`, so thresholds are set over all of it:

- workers: meshrl's reference decoder (`meshrl.inference.ReferenceBackend.generate`, batched,
  left-padded, through the inference contract), and
  `transformers` `generate` (the usual engine of other implementations) at batch 1 to 64,
  1 or 2 threads, sdpa or eager attention. Their proofs are the reference library's proofs:
  `build_proofs` makes byte-identical ones (tests/toploc/test_vectors.py).
- validators: one prefill of prompt + completion (`ReferenceBackend.score`) at batch 1 to 64,
  right or left padding (with extra padding width), 1 or 2 threads, sdpa or eager, in the
  model's bf16 or in fp32.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from meshrl.inference import ReferenceBackend, ReferenceConfig, SamplingParams

__all__ = [
    "HONEST_VALIDATORS",
    "HONEST_WORKERS",
    "ValidatorSetup",
    "WorkerSetup",
    "hf_generate",
    "recompute_with",
    "threads",
    "work_with",
]


@dataclass(frozen=True)
class WorkerSetup:
    name: str
    engine: str  # "meshrl": ReferenceBackend.generate; "hf": transformers generate
    batch_size: int
    threads: int = 1
    attn: str = "sdpa"


@dataclass(frozen=True)
class ValidatorSetup:
    name: str
    batch_size: int
    pad_left: bool = False
    pad_to: int = 0
    threads: int = 1
    attn: str = "sdpa"
    fp32: bool = False


HONEST_WORKERS = (
    WorkerSetup("meshrl-b16", "meshrl", 16),
    WorkerSetup("hf-b1", "hf", 1),
    WorkerSetup("hf-b8-eager-t2", "hf", 8, threads=2, attn="eager"),
    WorkerSetup("hf-b64-t2", "hf", 64, threads=2),
    WorkerSetup("hf-b64-eager", "hf", 64, attn="eager"),
)

HONEST_VALIDATORS = (
    ValidatorSetup("b1", 1),
    ValidatorSetup("b8-t2", 8, threads=2),
    ValidatorSetup("b64-left", 64, pad_left=True),
    ValidatorSetup("b16-left-pad200-eager", 16, pad_left=True, pad_to=200, attn="eager"),
    ValidatorSetup("b5-eager-t2", 5, threads=2, attn="eager"),
    ValidatorSetup("fp32-b8", 8, fp32=True),
    ValidatorSetup("fp32-b32-left-eager", 32, pad_left=True, attn="eager", fp32=True),
    ValidatorSetup("fp32-b3-t2", 3, threads=2, fp32=True),
)


@contextmanager
def threads(n: int) -> Iterator[None]:
    """torch intra-op threads set to `n` for the block, restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _variant(model: torch.nn.Module, attn: str, fp32: bool = False) -> torch.nn.Module:
    """The model itself when nothing changes, else a copy in fp32 and / or with `attn`."""
    current = getattr(model.config, "_attn_implementation", None)
    if not fp32 and attn == current:
        return model
    out = copy.deepcopy(model)
    if fp32:
        out = out.float()
    if attn != current:
        out.set_attn_implementation(attn)
    return out


@torch.no_grad()
def hf_generate(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, seed: int,
    batch_size: int,
) -> list[tuple[list[int], torch.Tensor]]:
    """(completion tokens, final hidden states [n, H]) per prompt from `transformers` generate:
    left-padded batches, multinomial sampling at temperature 1 (seeded per batch), exactly
    `max_new_tokens` tokens. Hidden state j is the last position of generate step j, the one
    that predicted token j (after the final norm), as in `ReferenceBackend.generate`."""
    out = []
    for b in range(0, len(prompts), batch_size):
        batch = prompts[b : b + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(batch):
            ids[i, width - len(p) :] = torch.tensor(list(p))
            mask[i, width - len(p) :] = 1
        torch.manual_seed(seed + b)
        res = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
            output_hidden_states=True, return_dict_in_generate=True, pad_token_id=0,
        )
        hidden = torch.stack([step[-1][:, -1] for step in res.hidden_states], dim=1)
        tokens = res.sequences[:, width:]
        out += [(tokens[i].tolist(), hidden[i].clone()) for i in range(len(batch))]
    return out


def work_with(
    model: torch.nn.Module, setup: WorkerSetup, prompts: Sequence[Sequence[int]],
    max_new_tokens: int, seed: int, first_seq: int = 0,
) -> list[tuple[list[int], torch.Tensor]]:
    """(completion tokens, final hidden states) per prompt, generated as `setup` says."""
    with threads(setup.threads):
        m = _variant(model, setup.attn)
        if setup.engine == "hf":
            return hf_generate(m, prompts, max_new_tokens, seed, setup.batch_size)
        if setup.engine != "meshrl":
            raise ValueError(f"unknown worker engine {setup.engine!r}")
        backend = ReferenceBackend(m, cfg=ReferenceConfig(max_batch_size=setup.batch_size))
        params = SamplingParams(max_new_tokens=max_new_tokens, seed=seed, ignore_eos=True,
                                return_hidden_states=True)
        seq_ids = list(range(first_seq, first_seq + len(prompts)))
        gens = backend.generate([list(p) for p in prompts], params, seq_ids)
        return [(g.token_ids, g.hidden_states) for g in gens]


def recompute_with(
    model: torch.nn.Module, setup: ValidatorSetup, prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
) -> list[torch.Tensor]:
    """Final hidden states [n, H] per completion from one prefill, as validator `setup` runs it."""
    cfg = ReferenceConfig(max_batch_size=setup.batch_size,
                          score_padding="left" if setup.pad_left else "right",
                          score_pad_to=setup.pad_to)
    with threads(setup.threads):
        backend = ReferenceBackend(_variant(model, setup.attn, setup.fp32), cfg=cfg)
        res = backend.score([list(p) for p in prompts], [list(c) for c in completions])
    return [r.hidden_states for r in res]
