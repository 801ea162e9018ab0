"""All checks of rollout files, in order of cost: chain facts, rules, assignment, rewards, replay.

`verify_files` takes files read with `meshrl.wire.read_rollout_file`, what the chain says about
each submission (`ChainClaim`), the pool's published rules (`meshrl.pool.PoolRules`, the only
rules a validator judges by) with their built tasks, and the backend holding the files' policy
version, and returns every finding with the numbers behind it. The prefill runs only for files
whose rows are the node's own assigned prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from meshrl.inference import InferenceBackend, InvalidRequestError
from meshrl.inference.backend import check_score_request, eos_token_ids
from meshrl.pool import (
    Assignment,
    Check,
    Decision,
    Finding,
    PoolRules,
    Severity,
    counter_refusal,
    decide,
)
from meshrl.tasks import TaskSet, compute_reward
from meshrl.validator.checks import (
    check_header_rules,
    check_node,
    check_policy_version,
    check_prompts,
    check_rewards,
    check_sampling_seed,
    check_work_units,
)
from meshrl.validator.replay import ReplayConfig, ReplayRow, ReplaySpec, replay_files
from meshrl.wire.rollout_file import RolloutFile

__all__ = ["ChainClaim", "model_free_findings", "unscorable", "verify_file", "verify_files"]

# findings after which a file's seed and prompts mean nothing: no replay
_NOT_ITS_WORK = (Check.TOKENS, Check.PROMPTS, Check.NODE, Check.SAMPLING_SEED, Check.RULES,
                 Check.COUNTER)


@dataclass(frozen=True)
class ChainClaim:
    """The `WorkSubmitted` facts: who submitted which hash for how many units."""

    sha256: str
    node: str
    provider: str
    units: int


def unscorable(backend: InferenceBackend, rf: RolloutFile, rules: PoolRules) -> Finding | None:
    """Rows the policy cannot score (a token id outside the vocabulary, a sequence past the
    context): checked per file before any batch is formed, so one file's bad row can never
    fail the prefill shared with other files. Hard: the worker's own claim of tokens no policy
    of the pool could have sampled."""
    rows = rf.completions
    try:
        check_score_request([r.prompt_tokens for r in rows], [r.completion_tokens for r in rows],
                            rules.sampling.temperature, backend.vocab_size, backend.max_seq_len)
    except InvalidRequestError as e:
        return Finding(Check.TOKENS, Severity.HARD, f"rows the policy cannot score: {e}")
    return None


def _counter(rf: RolloutFile) -> int | Finding:
    counters = {c.counter for c in rf.completions}
    if len(counters) != 1:
        return Finding(Check.PROMPTS, Severity.HARD, f"rows from {len(counters)} counters in "
                       "one file")
    return counters.pop()


def model_free_findings(rf: RolloutFile, claim: ChainClaim, rules: PoolRules, tasks: TaskSet,
                        tokenizer: Any) -> list[Finding]:
    """Every check that needs no model: node, units, rules, assignment, version window,
    rewards (`tokenizer` None: those that need no tokenizer either)."""
    h, rows = rf.header, rf.completions
    counter = _counter(rf)
    if isinstance(counter, Finding):
        return [counter]
    bad_counter = counter_refusal(rules, counter)
    if bad_counter is not None:  # a counter outside the granted range: problems ground for
        return [Finding(Check.COUNTER, Severity.HARD, bad_counter, {"counter": counter})]
    a = Assignment(rules, h.node, h.step, counter, h.policy_version)
    out = [check_node(h.node, h.provider, claim.node, claim.provider),
           check_work_units(h.work_units, claim.units, [len(r.prompt_tokens) for r in rows],
                            [len(r.completion_tokens) for r in rows]),
           check_header_rules(h.pool_id, h.rules_sha256, rules),
           check_policy_version(h.policy_version, h.step),
           check_sampling_seed(h.sampling_seed, a.sampler_seed())]
    if tokenizer is None:  # no policy loaded yet: only the checks above can be made
        return [x for x in out if x is not None]
    problems = a.problems(tasks)
    out.append(check_prompts([r.prompt_tokens for r in rows], a.prompt_rows(tokenizer, problems)))
    if out[-1] is None:
        g = rules.group_size
        recomputed = [compute_reward(problems[i // g], tokenizer.decode(r.completion_tokens),
                                     len(r.completion_tokens), tasks).total
                      for i, r in enumerate(rows)]
        out.append(check_rewards([r.reward for r in rows], recomputed))
    # every row's identity is the assignment's: no field of a file goes unchecked
    g = rules.group_size
    bad_seq = [i for i, r in enumerate(rows) if r.seq_id != i or r.sample_index != i % g
               or r.prompt_id != a.prompt_id(i)]
    if bad_seq:
        out.append(Finding(Check.SEQ_IDS, Severity.HARD, f"{len(bad_seq)} rows do not use "
                           "seq_id = row index, sample_index = row % group_size and "
                           f"prompt_id = step/counter/prompt, first row {bad_seq[0]}"))
    return [x for x in out if x is not None]


def _spec(rf: RolloutFile, rules: PoolRules, tokenizer: Any,
          max_seq_len: int | None) -> ReplaySpec:
    s = rules.sampling
    return ReplaySpec(seed=rf.header.sampling_seed, max_new_tokens=s.max_new_tokens,
                      temperature=s.temperature, top_p=s.top_p,
                      eos_token_ids=() if s.ignore_eos else eos_token_ids(tokenizer, None),
                      stop_token_ids=tuple(s.stop_token_ids), max_seq_len=max_seq_len)


def _rows(rf: RolloutFile) -> list[ReplayRow]:
    return [ReplayRow(r.prompt_tokens, r.completion_tokens, r.logprobs, r.finish_reason,
                      r.seq_id, r.toploc_proofs) for r in rf.completions]


def verify_files(backend: InferenceBackend, tokenizer: Any,
                 items: Sequence[tuple[RolloutFile, ChainClaim]], rules: PoolRules,
                 tasks: TaskSet, cfg: ReplayConfig | None = None,
                 prior: Sequence[list[Finding]] | None = None) -> list[Decision]:
    """Decisions on several files of one policy version; their replays share prefill batches.
    `prior[i]`: findings already made about file i (e.g. its slot claim)."""
    cfg = cfg or ReplayConfig()
    found = []
    for i, (f, c) in enumerate(items):
        bad = unscorable(backend, f, rules)  # first: decoding such a row could fail too
        mine = [bad] if bad else model_free_findings(f, c, rules, tasks, tokenizer)
        found.append([*(prior[i] if prior else []), *mine])
    todo = [i for i, fs in enumerate(found) if not any(x.check in _NOT_ITS_WORK for x in fs)]
    max_len = getattr(backend, "max_seq_len", None)
    batch = [(_rows(items[i][0]), _spec(items[i][0], rules, tokenizer, max_len)) for i in todo]
    stats: dict[int, dict[str, Any]] = {}
    for i, (more, st) in zip(todo, replay_files(backend, batch, cfg), strict=True):
        found[i] += more
        stats[i] = asdict(st)
    return [decide(fs, stats.get(i)) for i, fs in enumerate(found)]


def verify_file(backend: InferenceBackend, tokenizer: Any, rf: RolloutFile, claim: ChainClaim,
                rules: PoolRules, tasks: TaskSet, cfg: ReplayConfig | None = None) -> Decision:
    return verify_files(backend, tokenizer, [(rf, claim)], rules, tasks, cfg)[0]
