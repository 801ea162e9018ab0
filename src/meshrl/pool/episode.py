"""Agentic episodes: the public rules by which a worker runs, and a validator re-runs, a
multi-turn episode with tools (issue #45).

An episode of a task with tools (`Task.episode`, `meshrl.tasks.tools.EpisodeConfig`) is
model turn, tool output, model turn, ... in one row of the rollout file:

- Model turn `t` (0-based) is sampled by the pool's seeded sampler with sequence id
  `turn_seq_id(seq_id, t)` = seq_id + t x 2^16 (turn 0: the row's own seq id, so a
  single-turn row is sampled as ever) and positions from 0 within the turn, after the whole
  conversation so far, with the tools' closing tags as stop strings. Its budget is what is
  left of the row's completion budget (`max_new_tokens`, or the context) after the tokens
  before it.
- A turn ends on a call when the text of its tokens holds a tool's closing tag and the text
  without its last token does not (`call_at_end`): the call is the text between the last
  opening tag before that closing tag and it (`find_call`).
- The tool runs, and its output becomes an environment segment, exactly when the turn ended
  on a call, fewer than `max_turns` turns ran, and at least `max_tool_tokens` + 1 tokens of
  the budget are left (`tool_runs`); otherwise the episode ends there.
- The environment segment is `result_template` over the tool's output on the call with seed
  `tool_seed(sampling_seed, seq_id, turn)`, encoded by the policy's tokenizer and cut to
  `max_tool_tokens` (`environment_tokens`): a pure function of the conversation and the
  assignment, which a validator recomputes and compares token for token.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from meshrl.tasks import Problem, TaskSet
from meshrl.tasks.tools import Tool, ToolResult

__all__ = [
    "TURN_SEQ_STRIDE",
    "Call",
    "Episode",
    "call_at_end",
    "environment_tokens",
    "episode_of",
    "find_call",
    "max_segments",
    "run_episodes",
    "stop_strings",
    "tool_runs",
    "tool_seed",
    "trace_tokens",
    "turn_seq_id",
]

TURN_SEQ_STRIDE = 1 << 16  # > any file's rows (`FileLimits.max_rows`)


def turn_seq_id(seq_id: int, turn: int) -> int:
    """The sampler's sequence id of model turn `turn` of the row of `seq_id`."""
    return seq_id + turn * TURN_SEQ_STRIDE


def tool_seed(sampling_seed: int, seq_id: int, turn: int) -> int:
    """The seed a tool run after model turn `turn` gets (the python tool seeds `random`)."""
    key = f"meshrl/v1/tool|{sampling_seed}|{seq_id}|{turn}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def episode_of(tasks: TaskSet, problem: Problem) -> Any:
    """The built task of `problem` when it runs episodes with tools, else None."""
    task = tasks.tasks.get(problem.task)
    return task if task is not None and task.episode is not None else None


def max_segments(tasks: TaskSet) -> int:
    """The most segments a row of this task mix can hold (a model turn and a tool output per
    turn, the last turn's output never)."""
    return max([2 * t.episode.max_turns - 1 for t in tasks.tasks.values()
                if t.episode is not None] or [1])


def stop_strings(task: Any) -> tuple[str, ...]:
    return tuple(t.close_tag for t in task.tools)


@dataclass(frozen=True)
class Call:
    tool: Tool
    text: str


def find_call(text: str, tools: Sequence[Tool]) -> Call | None:
    """The first call in `text`: the tool whose closing tag comes first, and the text between
    its last opening tag before that and the closing tag ("" without an opening tag)."""
    first: tuple[int, Tool] | None = None
    for t in tools:
        i = text.find(t.close_tag)
        if i >= 0 and (first is None or i < first[0]):
            first = (i, t)
    if first is None:
        return None
    i, tool = first
    j = text.rfind(tool.open_tag, 0, i)
    return Call(tool, text[j + len(tool.open_tag): i] if j >= 0 else "")


def _text(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def call_at_end(tokenizer: Any, ids: Sequence[int], tools: Sequence[Tool]) -> tuple[
        Call | None, bool]:
    """(the call model turn `ids` ended on, or None; whether a call was complete before its
    last token: generation stops at a call, so an honest turn never holds one there)."""
    earlier = bool(ids) and find_call(_text(tokenizer, ids[:-1]), tools) is not None
    if earlier:
        return None, True
    return find_call(_text(tokenizer, ids), tools), False


def tool_runs(task: Any, turns_done: int, used: int, limit: int) -> bool:
    """Whether the tool runs after a turn that ended on a call: `turns_done` model turns so
    far, `used` of the row's `limit` completion tokens taken."""
    return turns_done < task.episode.max_turns and limit - used >= task.episode.max_tool_tokens + 1


def environment_tokens(task: Any, tokenizer: Any, call: Call, seed: int) -> tuple[
        list[int], ToolResult]:
    """The environment segment of `call`: the tool's output in the task's template, as token
    ids cut to `max_tool_tokens` (never empty: a template of no tokens is the task's error)."""
    res = call.tool.run(call.text, seed)
    ep = task.episode
    ids = list(tokenizer.encode(ep.result_template.format(output=res.output)))
    if not ids:
        raise ValueError("episode: the result template encodes to no tokens")
    return ids[: ep.max_tool_tokens], res


def trace_tokens(task: Any, tokenizer: Any, turns: Sequence[str]) -> tuple[list[int],
                                                                           list[bool]]:
    """A warm-start episode of model turns `turns` (each but the last ending on a call): its
    completion token ids, each turn followed by its call's real tool output, EOS last; and
    its loss mask (the model's tokens)."""
    ids: list[int] = []
    mask: list[bool] = []
    for k, text in enumerate(turns):
        own = list(tokenizer.encode(text))
        if k + 1 == len(turns):
            own.append(tokenizer.eos_token_id)
        ids += own
        mask += [True] * len(own)
        if k + 1 < len(turns):
            call = find_call(text, task.tools)
            if call is None:
                raise ValueError(f"trace turn {k} makes no call: {text!r}")
            env, _ = environment_tokens(task, tokenizer, call, 0)
            ids += env
            mask += [False] * len(env)
    return ids, mask


@dataclass
class Episode:
    """One row's episode so far: its segments (kind, tokens, log-probs, tool, exit, hidden)."""

    task: Any  # the built task when it runs tools, else None
    prompt: list[int]
    limit: int  # completion tokens at most (max_new_tokens, or the context)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    hidden: list[Any] = field(default_factory=list)  # per model segment
    finish_reason: str = "length"
    policy_version: int = -1

    @property
    def loss_mask(self) -> list[bool]:
        return [k == 0 for k, n in zip(self.kinds, self.lengths, strict=True) for _ in range(n)]

    def add(self, kind: int, ids: list[int], lps: list[float], tool: str = "",
            code: int = 0) -> None:
        self.tokens += ids
        self.logprobs += lps
        self.kinds.append(kind)
        self.lengths.append(len(ids))
        self.tools.append(tool)
        self.exits.append(code)


def run_episodes(engine: Any, tokenizer: Any, prompts: list[list[int]], tasks: list[Any],
                 base: Any, sampling_seed: int, seq_ids: list[int] | None = None,
                 ) -> list[Episode]:
    """Every row's episode (`tasks[r]`: the built task of row r when it runs tools, else
    None), its turns batched across rows: one `generate` of `engine` per distinct token
    budget, rows that ended on a call get the tool's output and go on, the others are done (a
    single-turn row is an episode of one turn, generated exactly as before). `base`: the
    `SamplingParams` of the rows; `seq_ids`: the rows' sequence ids (default 0, 1, ...)."""
    seq_ids = list(range(len(prompts))) if seq_ids is None else seq_ids
    context = getattr(engine, "max_seq_len", None)
    eps = []
    for p, task in zip(prompts, tasks, strict=True):
        limit = base.max_new_tokens if context is None else min(base.max_new_tokens,
                                                                   context - len(p))
        eps.append(Episode(task, p, limit))
    active, turn = list(range(len(eps))), 0
    while active:
        batches: dict[tuple[int, tuple[str, ...]], list[int]] = defaultdict(list)
        for r in active:
            e = eps[r]
            # the engine clamps a budget to the context itself: rows of one turn share a batch
            batches[(base.max_new_tokens - len(e.tokens),
                     stop_strings(e.task) if e.task else ())].append(r)
        still = []
        for (budget, stops), rows in batches.items():
            params = base.model_copy(update={"max_new_tokens": budget, "stop_strings": stops})
            comps = engine.generate([eps[r].prompt + eps[r].tokens for r in rows], params,
                                    seq_ids=[turn_seq_id(seq_ids[r], turn) for r in rows])
            for r, c in zip(rows, comps, strict=True):
                e = eps[r]
                e.add(0, c.token_ids, c.logprobs)
                e.hidden.append(c.hidden_states)
                e.finish_reason, e.policy_version = c.finish_reason, c.policy_version
                if e.task is None or c.finish_reason != "stop":
                    continue
                call, _ = call_at_end(tokenizer, c.token_ids, e.task.tools)
                if call is None or not tool_runs(e.task, turn + 1, len(e.tokens), e.limit):
                    continue
                ids, res = environment_tokens(e.task, tokenizer, call,
                                              tool_seed(sampling_seed, seq_ids[r], turn))
                e.add(1, ids, [0.0] * len(ids), call.tool.name, res.exit)
                still.append(r)
        active, turn = sorted(still), turn + 1
    return eps
