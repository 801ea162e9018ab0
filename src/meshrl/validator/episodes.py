"""The model-free half of an episode's check (issue #45): its turns, calls and limits, and
every environment segment re-run by the task's tools and compared token for token, on every
row (`meshrl.pool.episode` has the rules the worker ran them by). The model half (each model
turn the seeded sampler's pick, its log-probs and proofs, from one prefill of the whole
conversation) is the replay's (`meshrl.validator.replay`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshrl.pool import Check, Finding, Severity
from meshrl.pool.episode import (
    call_at_end,
    environment_tokens,
    episode_of,
    tool_runs,
    tool_seed,
)
from meshrl.tasks import TaskSet
from meshrl.validator.checks import row_termination
from meshrl.wire.rollout_file import Completion, RolloutFile, segments

__all__ = ["episode_error", "episode_findings", "is_episode"]


def is_episode(tasks: TaskSet, problem: Any) -> bool:
    return episode_of(tasks, problem) is not None


def episode_error(row: Completion, task: Any, tokenizer: Any, sampling_seed: int, limit: int,
                  eos: Sequence[int], stop: Sequence[int]) -> str | None:
    """Why episode `row` of `task` is not one the rules make (None: it is), every tool output
    re-run. `limit`: the row's completion tokens at most."""
    segs, ends = segments(row), set(eos) | set(stop)
    turn, tokens = 0, row.completion_tokens
    if not segs[-1].model:  # after a tool output the model always has a token to write
        return "the episode ends on a tool output"
    for k, seg in enumerate(segs):
        if not seg.model:
            continue  # judged with the turn before it
        turn += 1
        ids = tokens[seg.start:seg.end]
        if turn > task.episode.max_turns:
            return f"{turn} model turns > max_turns {task.episode.max_turns}"
        if len(ids) > limit - seg.start:
            return f"turn {turn}: {len(ids)} tokens > the {limit - seg.start} left"
        call, earlier = call_at_end(tokenizer, ids, task.tools)
        if earlier:
            return f"turn {turn}: generation went on past a complete tool call"
        if any(t in ends for t in ids[:-1]):
            return f"turn {turn}: generation continued past an EOS / stop token"
        called = call is not None and ids[-1] not in ends
        runs = called and tool_runs(task, turn, seg.end, limit)
        if k + 1 < len(segs):  # an environment segment follows
            if not called:
                return f"turn {turn}: a tool output follows a turn that made no tool call"
            if not runs:
                return f"turn {turn}: a tool ran past the episode's turn or token limits"
            env = segs[k + 1]
            want, res = environment_tokens(task, tokenizer, call,
                                           tool_seed(sampling_seed, row.seq_id, turn - 1))
            if (tokens[env.start:env.end] != want or env.tool != call.tool.name
                    or env.exit != res.exit):
                return (f"turn {turn}: the {env.tool!r} output differs from the tool's re-run "
                        f"({call.tool.name!r}, exit {res.exit})")
        elif called:
            if runs:
                return f"turn {turn}: the episode was cut short, a call the tool never answered"
            if row.finish_reason != "stop":
                return f"turn {turn}: ended on a call but claims {row.finish_reason!r}"
        else:
            why = row_termination(ids, row.finish_reason, limit - seg.start, eos, stop)
            if why is not None:
                return f"turn {turn}: {why}"
    return None


def episode_findings(rf: RolloutFile, tasks: TaskSet, problems: Sequence[Any], group: int,
                     tokenizer: Any, limit_of: Any, eos: Sequence[int],
                     stop: Sequence[int]) -> list[Finding]:
    """Episode findings of every row: a row of a task without tools holds one model segment;
    a row of a task with tools is an episode by the rules (`episode_error`). `limit_of(row)`:
    the row's completion budget."""
    bad: list[tuple[int, str]] = []
    for i, row in enumerate(rf.completions):
        task = episode_of(tasks, problems[i // group])
        if task is None:
            if len(segments(row)) != 1:
                bad.append((i, "segments in a row of a task without tools"))
            continue
        why = episode_error(row, task, tokenizer, rf.header.sampling_seed, limit_of(row), eos,
                            stop)
        if why is not None:
            bad.append((i, why))
    if not bad:
        return []
    return [Finding(Check.EPISODE, Severity.HARD, f"{len(bad)} of {len(rf.completions)} rows, "
                    f"first row {bad[0][0]}: {bad[0][1]}",
                    {"bad_rows": len(bad), "first": bad[0][0]})]
