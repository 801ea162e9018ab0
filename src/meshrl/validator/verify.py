"""All checks of rollout files, in order of cost: chain facts, rules, assignment, rewards, replay.

`verify_files` takes files read with `meshrl.wire.read_rollout_file`, what the chain says about
each submission (`ChainClaim`), the pool's published rules (`meshrl.pool.PoolRules`, the only
rules a validator judges by) with their built tasks, and the backend holding the files' policy
version, and returns every finding with the numbers behind it. The prefill runs only for files
whose rows are the node's own assigned prompts, and only on the rows the pool's sampled-replay
rule picks (`meshrl.pool.replayed_rows`, from the submission's block hash and the file's
sha256); every check that needs no model covers every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from meshrl.inference import InferenceBackend, InvalidRequestError
from meshrl.inference.backend import check_score_request, eos_token_ids
from meshrl.pool import (
    LOGPROB_SLACK,
    Assignment,
    Check,
    Decision,
    Finding,
    PoolRules,
    Severity,
    bad_logprob_rows,
    counter_refusal,
    decide,
    logprob_floor,
    replayed_rows,
    unmet_profile,
)
from meshrl.tasks import TaskSet, compute_reward
from meshrl.validator.checks import (
    check_header_rules,
    check_node,
    check_prompts,
    check_rewards,
    check_sampling_seed,
    check_termination,
    check_work_units,
)
from meshrl.validator.episodes import episode_findings, is_episode
from meshrl.validator.replay import ReplayConfig, ReplaySpec, replay_files
from meshrl.wire.rollout_file import Completion, RolloutFile

__all__ = ["ChainClaim", "compute_dtype", "model_free_findings", "replay_subset", "unscorable",
           "verify_file", "verify_files"]

# findings after which a file's seed and prompts mean nothing: no replay
_NOT_ITS_WORK = (Check.TOKENS, Check.PROMPTS, Check.NODE, Check.SAMPLING_SEED, Check.RULES,
                 Check.COUNTER)


@dataclass(frozen=True)
class ChainClaim:
    """The `WorkSubmitted` facts: who submitted which hash for how many units, and the hash
    (hex) of the block that holds the event, which picks the rows replayed on the model
    (`meshrl.pool.replayed_rows`); None: not known, every row is replayed."""

    sha256: str
    node: str
    provider: str
    units: int
    block_hash: str | None = None


def compute_dtype(backend: InferenceBackend) -> str:
    """The dtype `backend` recomputes in: its model's parameters' (the reference backend), else
    float32 (the CPU engine computes in nothing else)."""
    params = getattr(getattr(backend, "model", None), "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    return str(first.dtype).removeprefix("torch.") if first is not None else "float32"


def replay_subset(rf: RolloutFile, claim: ChainClaim, rules: PoolRules) -> list[int]:
    """The rows of `rf` replayed on the model: those the pool's replay rule picks by the
    submission's block hash, or every row when the block hash is not known (more than the rule
    asks, never less)."""
    n = len(rf.completions)
    if claim.block_hash is None:
        return list(range(n))
    block = bytes.fromhex(claim.block_hash.removeprefix("0x"))
    return replayed_rows(rules.replay, n, claim.sha256, block)


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
                        tokenizer: Any, vocab_size: int | None = None) -> list[Finding]:
    """Every check that needs no model: node, units, rules, assignment,
    rewards, the log-probs' honest range (`tokenizer` None: those that need no tokenizer
    either). `vocab_size`: the policy's logits width (default the tokenizer's vocabulary)."""
    h, rows = rf.header, rf.completions
    counter = _counter(rf)
    if isinstance(counter, Finding):
        return [counter]
    bad_counter = counter_refusal(rules, counter)
    if bad_counter is not None:  # a counter outside the granted range: problems ground for
        return [Finding(Check.COUNTER, Severity.HARD, bad_counter, {"counter": counter})]
    a = Assignment(rules, h.node, counter, h.policy_version)
    out = [check_node(h.node, h.provider, claim.node, claim.provider),
           check_work_units(h.work_units, claim.units, [len(r.prompt_tokens) for r in rows],
                            [len(r.completion_tokens) for r in rows]),
           check_header_rules(h.pool_id, h.rules_sha256, rules),
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
    # log-probs no sampler gives, on every row (the replay compares the replayed rows' values):
    # an unreplayed row's value still reaches the trainer's importance ratio
    floor = logprob_floor(vocab_size or tokenizer.vocab_size, rules.sampling.temperature)
    bad_lp = bad_logprob_rows(((r.logprobs, len(r.completion_tokens)) for r in rows), floor)
    if bad_lp:
        out.append(Finding(Check.LOGPROBS, Severity.HARD, f"{len(bad_lp)} rows hold log-probs "
                           f"outside the honest sampler's [{floor:.4g}, {LOGPROB_SLACK}] (or "
                           f"not finite, or not one per token), first row {bad_lp[0]}",
                           {"bad_rows": len(bad_lp), "floor": floor}))
    # every row's identity is the assignment's: no field of a file goes unchecked
    g = rules.group_size
    bad_seq = [i for i, r in enumerate(rows) if r.seq_id != i or r.sample_index != i % g
               or r.prompt_id != a.prompt_id(i)]
    if bad_seq:
        out.append(Finding(Check.SEQ_IDS, Severity.HARD, f"{len(bad_seq)} rows do not use "
                           "seq_id = row index, sample_index = row % group_size and "
                           f"prompt_id = version/counter/prompt, first row {bad_seq[0]}"))
    return [x for x in out if x is not None]


def _spec(rf: RolloutFile, rules: PoolRules, tokenizer: Any,
          max_seq_len: int | None) -> ReplaySpec:
    s = rules.sampling
    return ReplaySpec(seed=rf.header.sampling_seed, max_new_tokens=s.max_new_tokens,
                      temperature=s.temperature, top_p=s.top_p,
                      eos_token_ids=() if s.ignore_eos else eos_token_ids(tokenizer, None),
                      stop_token_ids=tuple(s.stop_token_ids), max_seq_len=max_seq_len)


def _replayed(rf: RolloutFile, which: Sequence[int], spec: ReplaySpec,
              episodes: set[int]) -> tuple[list[Completion], ReplaySpec]:
    """The replayed rows (the file's own) and their spec naming which of them are episodes
    (judged turn by turn; their termination the episode check judged)."""
    return ([rf.completions[i] for i in which],
            replace(spec, episodes=frozenset(j for j, i in enumerate(which) if i in episodes)))


def _episode_rows(rf: RolloutFile, rules: PoolRules, tasks: TaskSet) -> set[int]:
    """The rows of `rf` whose task runs episodes with tools."""
    a = Assignment(rules, rf.header.node, rf.completions[0].counter, rf.header.policy_version)
    g = rules.group_size
    problems = a.problems(tasks)
    return {i for i in range(len(rf.completions)) if is_episode(tasks, problems[i // g])}


def _episodes(rf: RolloutFile, rules: PoolRules, tasks: TaskSet, tokenizer: Any,
              spec: ReplaySpec) -> list[Finding]:
    """Every row's episode check (turns, calls, limits, tool outputs re-run)."""
    a = Assignment(rules, rf.header.node, rf.completions[0].counter, rf.header.policy_version)

    def limit(row: Any) -> int:
        if spec.max_seq_len is None:
            return spec.max_new_tokens
        return min(spec.max_new_tokens, spec.max_seq_len - len(row.prompt_tokens))

    return episode_findings(rf, tasks, a.problems(tasks), rules.group_size, tokenizer, limit,
                            spec.eos_token_ids, spec.stop_token_ids)


def _termination_of_others(rf: RolloutFile, replayed: Sequence[int],
                           spec: ReplaySpec, episodes: set[int]) -> Finding | None:
    """Termination (needs no model) of the rows not replayed; the replay checks the others
    (an episode's: the episode check)."""
    skip = set(replayed) | episodes

    def limit(n_prompt: int) -> int:  # a row may end on "length" where the context ends
        if spec.max_seq_len is None:
            return spec.max_new_tokens
        return min(spec.max_new_tokens, spec.max_seq_len - n_prompt)

    rows = [(r.completion_tokens, r.finish_reason, limit(len(r.prompt_tokens)))
            for i, r in enumerate(rf.completions) if i not in skip]
    return check_termination(rows, spec.eos_token_ids, spec.stop_token_ids) if rows else None


def verify_files(backend: InferenceBackend, tokenizer: Any,
                 items: Sequence[tuple[RolloutFile, ChainClaim]], rules: PoolRules,
                 tasks: TaskSet, cfg: ReplayConfig | None = None,
                 prior: Sequence[list[Finding]] | None = None) -> list[Decision]:
    """Decisions on several files of one policy version; their replays share prefill batches.
    `prior[i]`: findings already made about file i (e.g. its slot claim).

    A backend whose compute dtype the rules' proof profile does not hold for (bfloat16 under
    "meshrl-cpu-engine") abstains from the replay: its tolerances would fail honest float32
    work (issue #41). The checks that need no model still decide; a file they pass is a soft
    `validator_error`, never a slash. (`meshrl validator` refuses to start in that case.)"""
    cfg = cfg or ReplayConfig()
    dtype = compute_dtype(backend)
    unmet = unmet_profile(rules.proof_profile, dtype, type(backend).__name__, "validator")
    found = []
    for i, (f, c) in enumerate(items):
        bad = unscorable(backend, f, rules)  # first: decoding such a row could fail too
        mine = [bad] if bad else model_free_findings(f, c, rules, tasks, tokenizer,
                                                     backend.vocab_size)
        found.append([*(prior[i] if prior else []), *mine])
    todo = [i for i, fs in enumerate(found) if not any(x.check in _NOT_ITS_WORK for x in fs)]
    max_len = getattr(backend, "max_seq_len", None)
    specs = {i: _spec(items[i][0], rules, tokenizer, max_len) for i in todo}
    episodes = {i: _episode_rows(items[i][0], rules, tasks) for i in todo}
    for i in todo:  # needs no model: judged even where the replay abstains
        found[i] += _episodes(items[i][0], rules, tasks, tokenizer, specs[i])
    if unmet is not None:
        for i in todo:
            found[i].append(Finding(Check.VALIDATOR_ERROR, Severity.SOFT,
                                    f"abstained from the replay: {unmet}", {"dtype": dtype}))
        todo = []
    subsets = {i: replay_subset(*items[i], rules) for i in todo}
    for i in todo:
        bad_end = _termination_of_others(items[i][0], subsets[i], specs[i], episodes[i])
        found[i] += [bad_end] if bad_end is not None else []
    batch = [_replayed(items[i][0], subsets[i], specs[i], episodes[i]) for i in todo]
    stats: dict[int, dict[str, Any]] = {}
    for i, (more, st) in zip(todo, replay_files(backend, batch, cfg), strict=True):
        found[i] += more
        file_tokens = sum(len(r.completion_tokens) for r in items[i][0].completions)
        stats[i] = {**asdict(st), "file_rows": len(items[i][0].completions),
                    "replayed_rows": subsets[i], "file_tokens": file_tokens,
                    "inexact_file_budget": inexact_file_budget(st.inexact_limit, st.tokens,
                                                               file_tokens)}
    return [decide(fs, stats.get(i)) for i, fs in enumerate(found)]


def inexact_file_budget(limit: int, replayed_tokens: int, file_tokens: int) -> float:
    """The inexact picks a cheater may expect to place over a whole file unseen: the cap
    (`limit`) counts only the replayed tokens, and a pick lands on a replayed row with
    probability replayed / file tokens, so its budget over the file is the cap scaled up by
    the inverse of that fraction (docs/roles.md, "Tolerances": issue #41 found the documented
    cap read as a file's when sampled replay made it 1 / rows_fraction of that). It cannot be
    tightened to the file's cap scaled down: the replayed tokens' own honest noise needs
    `limit` (a Poisson allowance that does not shrink in proportion)."""
    if replayed_tokens <= 0:
        return float(limit)
    return limit * file_tokens / replayed_tokens


def verify_file(backend: InferenceBackend, tokenizer: Any, rf: RolloutFile, claim: ChainClaim,
                rules: PoolRules, tasks: TaskSet, cfg: ReplayConfig | None = None) -> Decision:
    return verify_files(backend, tokenizer, [(rf, claim)], rules, tasks, cfg)[0]
