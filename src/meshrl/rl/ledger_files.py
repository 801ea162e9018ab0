"""Accepted rollout files, as the trainer takes them: read from the orchestrator's ledger,
downloaded, checked and turned into groups of completions.

A file's rows are `prompts_per_file x group_size` completions, row r belonging to prompt
r // group_size (`meshrl.pool.assignment`, docs/roles.md). The trainer re-derives each prompt's
problem by the pool's published rules exactly as the validator does (`Assignment(rules, node,
counter, version).problems(tasks)`), never from the file's header (a worker wrote it), to drop
prompts of the held-out set; rewards it trains on are the file's own, which the validator
recomputed for every row, and its accuracy metric is their task part (`task_score_of`: the
length term taken back out), never a third run of the scorer.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import torch

from meshrl.log import get_logger, log_event
from meshrl.pool import (
    LOGPROB_SLACK,
    Assignment,
    PoolRules,
    bad_logprob_rows,
    counter_refusal,
    file_limits,
    logprob_floor,
    read_rules,
)
from meshrl.rl.rollouts import RolloutBatch
from meshrl.tasks import TaskSet
from meshrl.wire import SignedClient, StepGoesBack, Transient, WireHTTPError
from meshrl.wire.errors import RolloutFileError
from meshrl.wire.isolated import iter_rollout_files_isolated
from meshrl.wire.models import FileStatus, LedgerEntry, LedgerPage
from meshrl.wire.rollout_file import RolloutFile, loss_mask

__all__ = ["FileGroups", "LedgerReader", "UnusableFile", "file_groups", "files_groups",
           "trainable"]

log = get_logger("meshrl.rl.network")
T = TypeVar("T")


class UnusableFile(ValueError):
    """An accepted file the trainer cannot use (wrong group size, wrong hash, bad rows)."""


@dataclass
class FileGroups:
    """The groups of one accepted file: its ledger entry and its usable groups as a batch
    (`RolloutBatch`, indexed by the file's step and version; `RolloutBatch.concat` joins a
    step's files into the trainer's batch)."""

    entry: LedgerEntry
    rows: RolloutBatch
    excluded: int = 0  # groups dropped because their prompt is held out

    @property
    def groups(self) -> int:
        return self.rows.groups


def trainable(e: LedgerEntry) -> bool:
    """Only a file accepted on the row of the node it was granted to, and uploaded by that
    node, may be trained on (never a node's submission of a file it was not granted)."""
    return e.status is FileStatus.ACCEPTED and e.granted and e.uploaded


def file_groups(entry: LedgerEntry, data: bytes, tokenizer: Any, rules: PoolRules,
                tasks: TaskSet, exclude: frozenset[str] = frozenset(),
                vocab_size: int | None = None) -> FileGroups:
    """Check an accepted file's bytes against its ledger entry and split it into groups, by the
    pool's rules (`tasks` is `rules.task.build()`, built once). `vocab_size`: the policy's
    logits width, which bounds an honest log-prob (default: the tokenizer's vocabulary)."""
    (out,) = files_groups([entry], [data], tokenizer, rules, tasks, exclude, vocab_size)
    if isinstance(out, Exception):
        raise out
    return out


def files_groups(entries: list[LedgerEntry], datas: list[bytes], tokenizer: Any,
                 rules: PoolRules, tasks: TaskSet, exclude: frozenset[str] = frozenset(),
                 vocab_size: int | None = None,
                 ) -> list[FileGroups | UnusableFile | RolloutFileError]:
    """`file_groups` of several files, each result the file's groups or why it is unusable;
    their bytes are read in one isolated child (a child that dies falls back to one a file,
    `iter_rollout_files_isolated`), so a step's files cost one fork, not one each."""
    out: list[FileGroups | UnusableFile | RolloutFileError] = []
    hashed = [hashlib.sha256(d).hexdigest() == e.sha256 for e, d in zip(entries, datas,
                                                                         strict=True)]
    # one parsed file at a time: each becomes its groups before the next is received
    read = iter_rollout_files_isolated([d for d, ok in zip(datas, hashed, strict=True) if ok],
                                       file_limits(rules))
    for entry, ok in zip(entries, hashed, strict=True):
        if not ok:
            out.append(UnusableFile(f"{entry.sha256[:12]}: downloaded bytes do not hash to "
                                    "the ledger's"))
            continue
        rf = next(read)
        if isinstance(rf, RolloutFileError):
            out.append(rf)
            continue
        try:
            out.append(_groups(entry, rf, tokenizer, rules, tasks, exclude,
                               vocab_size or tokenizer.vocab_size))
        except UnusableFile as e:
            out.append(e)
    return out


def _groups(entry: LedgerEntry, rf: RolloutFile, tokenizer: Any, rules: PoolRules,
            tasks: TaskSet, exclude: frozenset[str], vocab_size: int) -> FileGroups:
    from meshrl.tasks import task_score_of

    h = rf.header
    if h.policy_version != entry.policy_version or h.node.lower() != entry.node.lower():
        raise UnusableFile(f"{entry.sha256[:12]}: header (node {h.node}, version "
                           f"{h.policy_version}) differs from the ledger entry")
    g, rows = rules.group_size, rf.completions
    counters = {r.counter for r in rows}
    if len(rows) != rules.rows_per_file() or len(counters) != 1:
        raise UnusableFile(f"{entry.sha256[:12]}: {len(rows)} rows of {len(counters)} "
                           f"counters, the pool's files have {rules.rows_per_file()} rows "
                           f"({rules.prompts_per_file} prompts x {g}) of one counter")
    counter = counters.pop()
    bad = _unusable_rows(rf, entry, counter, tokenizer, rules, vocab_size)
    if bad:
        raise UnusableFile(f"{entry.sha256[:12]}: {bad}")
    a = Assignment(rules, h.node, counter, h.policy_version)
    problems = a.problems(tasks)
    if [list(r.prompt_tokens) for r in rows] != a.prompt_rows(tokenizer, problems):
        raise UnusableFile(f"{entry.sha256[:12]}: rows hold prompts other than the assignment "
                           f"of (node, counter {counter}, version {h.policy_version}) by "
                           "the pool's rules")
    kept = [(k, p) for k, p in enumerate(problems) if p.prompt not in exclude]
    used = [r for k, _ in kept for r in rows[k * g:(k + 1) * g]]
    # the validator recomputed every row's reward: its task part is the accuracy (no third
    # run of the scorer, a sandboxed program per row for code tasks)
    scores = [task_score_of(p, r.reward, len(r.completion_tokens), tasks)
              for k, p in kept for r in rows[k * g:(k + 1) * g]]
    batch = RolloutBatch(
        index=h.policy_version,
        version=h.policy_version,
        problems=[p for _, p in kept],
        prompt_ids=[list(r.prompt_tokens) for r in used],
        completion_ids=[list(r.completion_tokens) for r in used],
        inference_logprobs=[list(r.logprobs) for r in used],
        rewards=torch.tensor([r.reward for r in used], dtype=torch.float32).view(-1, g),
        task_rewards=torch.tensor(scores, dtype=torch.float32).view(-1, g),
        truncated=sum(r.finish_reason == "length" for r in used),
        gen_seconds=0.0,
        loss_masks=[loss_mask(r) for r in used],
    )
    return FileGroups(entry, batch, excluded=len(problems) - len(kept))


def _unusable_rows(rf: Any, entry: LedgerEntry, counter: int, tokenizer: Any,
                   rules: PoolRules, vocab_size: int) -> str:
    """Why the file's rows cannot be trained on ("" if they can): a counter the pool's rules
    (or the grant) do not allow, a token id outside the vocabulary, a reward that is not a
    finite number, a log-prob outside what an honest sampler reports (`logprob_floor`: the
    validator replays only some rows, and a -100 on another one is an importance ratio of
    e^100). Checked before any row is decoded or trained on, so such a file is a typed
    refusal, never a crash or a NaN in a batch. (The header's other fields are ignored:
    problems come from the rules.)"""
    bad_counter = counter_refusal(rules, counter)
    if bad_counter is not None or (entry.counter >= 0 and counter != entry.counter):
        return bad_counter or f"counter {counter}, granted {entry.counter}"
    vocab = tokenizer.vocab_size
    for r in rf.completions:
        if any(not 0 <= t < vocab for t in (*r.prompt_tokens, *r.completion_tokens)):
            return f"a token id outside the vocabulary (size {vocab})"
        if not math.isfinite(r.reward):
            return "a reward that is not a finite number"
    floor = logprob_floor(vocab_size, rules.sampling.temperature)
    bad = bad_logprob_rows(((r.logprobs, len(r.completion_tokens)) for r in rf.completions),
                           floor)
    if bad:
        return (f"{len(bad)} rows hold log-probs no honest sampler reports (outside "
                f"[{floor:.4g}, {LOGPROB_SLACK}], not finite or not one per token), first row "
                f"{bad[0]}")
    return ""


class LedgerReader:
    """Signed reads of the orchestrator's ledger and file store (the trainer is a `reader`)."""

    def __init__(self, url: str, private_key: str, page: int = 1000,
                 retry_s: float = 1.0) -> None:
        self.url, self.key, self.page, self.retry_s = url, private_key, page, retry_s
        self.after = 0  # acceptance number read up to

    def _run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run one exchange; while the orchestrator is unreachable or answers 5xx (restarting),
        wait and try again: its state survives restarts, so waiting loses nothing."""
        while True:
            try:
                return asyncio.run(make())
            except (OSError, aiohttp.ClientError, TimeoutError) as e:
                reason = f"{type(e).__name__}: {e}"
            except WireHTTPError as e:
                if not isinstance(e, Transient):
                    raise
                reason = str(e)
            log_event(log, "orchestrator unreachable, retrying", error=reason)
            time.sleep(self.retry_s)

    def rules(self) -> PoolRules:
        """The pool's published rules (the one rules client; waits for the orchestrator)."""
        async def go() -> PoolRules:
            async with SignedClient(self.url, self.key) as c:
                rules = await read_rules(c, asyncio.Event(), self.retry_s)
            assert rules is not None  # never stopped: it waits until the pool answers
            return rules
        return self._run(go)

    def accepted(self, wait_s: float = 0.0) -> list[LedgerEntry]:
        """Entries accepted since the last call's, in acceptance order (every row, a node's
        submission of a file it was not granted included: the caller decides what it uses).
        With `wait_s`, the orchestrator holds the read up to that long until there is one."""
        out, self.after = self._run(lambda: self._feed(wait_s))
        return out

    def awaiting_verdict(self) -> list[LedgerEntry]:
        """Submissions on chain that no validator has judged yet. A submission a validator
        judged invalid (its verdict posted, status still `submitted` while the accusation can
        be disputed) is not awaited: its node is ejected at the accusation and the file is
        trainable only if another validator's accept overturns it."""
        rows = self._run(lambda: self._entries(FileStatus.SUBMITTED, 0))[0]
        return [e for e in rows if e.verdict is None]

    async def _feed(self, wait_s: float = 0.0) -> tuple[list[LedgerEntry], int]:
        return await self._pages({"accepted_after": self.after}, wait_s)

    async def _entries(self, status: FileStatus, after: int) -> tuple[list[LedgerEntry], int]:
        return await self._pages({"status": status.value, "after": after})

    async def _pages(self, query: dict[str, Any], wait_s: float = 0.0
                     ) -> tuple[list[LedgerEntry], int]:
        """Every entry of `query` from its cursor on (`accepted_after` or `after`), page by page
        until a page is not full; the first read held up to `wait_s` for an entry."""
        out: list[LedgerEntry] = []
        cursor = "accepted_after" if "accepted_after" in query else "after"
        async with SignedClient(self.url, self.key) as c:
            while True:
                q = {**query, "limit": self.page}
                if wait_s > 0 and not out:
                    q["wait"] = wait_s
                page = await c.call("GET", "/ledger", response=LedgerPage, query=q)
                out.extend(page.entries)
                query[cursor] = page.next_after
                if len(page.entries) < self.page:
                    return out, page.next_after

    def download(self, entries: list[LedgerEntry]) -> list[bytes]:
        async def go() -> list[bytes]:
            async with SignedClient(self.url, self.key) as c:
                return [await c.get_bytes(e.download) for e in entries]
        return self._run(go)

    def set_step(self, step: int, taken_through: int | None = None,
                 ahead: int | None = None) -> int:
        """Move the pool to `step` (monotone) and restate what the trainer will take (`ahead`
        files beyond acceptance number `taken_through`; None: no pacing); returns the pool's
        step after the call."""
        from meshrl.wire.models import HeartbeatAck, StepUpdate

        update = StepUpdate(step=step, taken_through=taken_through, ahead=ahead)

        async def go() -> int:
            async with SignedClient(self.url, self.key) as c:
                try:
                    ack = await c.call("POST", "/step", update, response=HeartbeatAck)
                    return ack.step
                except StepGoesBack:  # the pool is already past it (a resumed run)
                    return step
        return self._run(go)
