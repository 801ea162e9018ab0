# over 400 lines: the trainer's side of a pool: the ledger's files in, policy versions out, by one
#  strategy per broadcast mode
"""The trainer on a pool: batches are accepted rollout files from the orchestrator's ledger,
every policy version goes out through a shardcast origin store.

`NetworkSource` is the `RolloutSource` and `ShardcastPublisher` the `PolicyPublisher` of this
mode (source.py), so the algorithm in loop.py is the same as with the local pipeline.

- `publish(v)` saves the live policy (HF layout), publishes it as shardcast version `v` in the
  origin's store, its manifest signed with the trainer's key (the pool's `policy_signer`: relays,
  workers and validators believe no other; a running origin serves it, relays mirror it) and
  moves the pool to step `v`,
  so workers generate with versions `v - async_level .. v`. With the move it says what it will
  take (pacing, docs/services.md): every accepted file up to the last one it took, and `ahead`
  files beyond (`ahead_files`, by default max(1, min(async_level, 2)) batches' worth of files),
  so the pool makes no file for a version that will be stale by the time the trainer reaches
  it, and a wide slack (a public pool's) does not become a queue its files age in.
- `get(s)` takes accepted files in the order they were accepted (`GET /ledger?accepted_after=`;
  the order a file was granted in says nothing of when it is judged), only rows granted to and
  uploaded by their node, each sha256 once, applying the async rule (a file of policy version v
  is used at step s only if 0 <= s - v <= async_level; older ones are dropped and counted),
  until the batch holds `prompts_per_step` groups; it waits while there are too few.
  Before that it waits until every file of steps <= s - `judge_lag` submitted on chain has a
  verdict: the trainer never runs more than `judge_lag` steps ahead of the validators, so a
  cheater is accused and ejected within that many steps of its first dishonest file (an
  invalid verdict counts when it is posted: its slash follows the dispute period, which the
  trainer does not wait for).
- Reading overlaps waiting (`load_threads`): the files a step still needs that are accepted
  now are downloaded together and read in one isolated child (`files_groups`), at most one
  batch's worth (never more files than the step would take one by one, so the same files in the same
  order); and when a step's batch is complete, the accepted files fresh for the next step are
  taken and start loading while this one trains.
- Flow, in every step's metrics (`flow()`): `validator_lag`, the files submitted on chain and
  not yet judged when the step began; `load_seconds`, the part of the step's wait spent
  waiting on downloads and reads (what overlapped with training or other waits is not counted;
  the rest of the wait is idle).
- Records: `rollouts.jsonl` in the run directory has one line per step with every file it
  used and every file it dropped. A file appears in the records at most once, so no accepted
  rollout is used twice; on resume from the checkpoint of step c the lines of steps >= c are cut
  (their update was lost with the crash) and those files are free again.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from meshrl.log import get_logger, log_event
from meshrl.pool import PoolRulesError, RulesPins, check_rules
from meshrl.rl.config import NetworkSourceConfig, RolloutConfig
from meshrl.rl.ledger_files import (
    FileGroups,
    LedgerReader,
    UnusableFile,
    files_groups,
    trainable,
)
from meshrl.rl.pipeline import is_fresh
from meshrl.rl.rollouts import RolloutBatch
from meshrl.rl.source import PolicyPublisher, RolloutSource, Weights
from meshrl.tasks import TasksConfig
from meshrl.wire.models import LedgerEntry
from meshrl.wire.signing import address_of

__all__ = ["BROADCASTS", "AdapterVersions", "DeltaVersions", "FullVersions", "NetworkSource",
           "ShardcastPublisher", "default_ahead", "read_records"]

log = get_logger("meshrl.rl.network")
# a file being loaded: its entry, the load of its group of files, its place in that group
Loading = tuple[LedgerEntry, "Future[list[FileGroups | ValueError]]", int]


# bytes per shard of a published policy: small enough to pipeline through relays
SHARD_SIZE = 1 << 20
AHEAD_BATCHES = 2  # the default pacing demand's cap, in batches (ahead_files -1)


def default_ahead(async_level: int, per_batch: int) -> int:
    """The files the trainer asks the pool to keep ahead of it (`ahead_files` -1):
    max(1, min(async_level, AHEAD_BATCHES)) batches."""
    return max(1, min(async_level, AHEAD_BATCHES)) * per_batch


def read_records(path: Path) -> list[dict[str, Any]]:
    """The trainer's per-step records of used and dropped files."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class FullVersions:
    """`network.broadcast = "full"`: every version is the whole checkpoint."""

    def __init__(self, publisher: ShardcastPublisher) -> None:
        self.publisher = publisher

    def store(self, store: Any, tmp: Path, version: int) -> Any:
        """Write `version` into the origin's `store` (through `tmp`); its manifest."""
        self.publisher.save_full(tmp / "model")
        return store.publish(tmp / "model", version, SHARD_SIZE, key=self.publisher.key)


class DeltaVersions(FullVersions):
    """`network.broadcast = "delta"`: each version against the newest one stored before it
    (the first one in full)."""

    def store(self, store: Any, tmp: Path, version: int) -> Any:
        older = [v for v in store.complete if v < version]
        if not older:
            return super().store(store, tmp, version)
        self.publisher.save_full(tmp / "model")
        return store.publish_delta(tmp / "model", version, max(older), SHARD_SIZE,
                                   key=self.publisher.key)


class AdapterVersions(FullVersions):
    """`network.broadcast = "adapter"`: the LoRA base goes out once in full (version 0), each
    later version as its adapter on that base. The base's files are hashed once, here: it is
    frozen for the run."""

    def __init__(self, publisher: ShardcastPublisher) -> None:
        from meshrl.shardcast.adapter import ADAPTER_WEIGHTS
        from meshrl.shardcast.manifest import sha256_file

        super().__init__(publisher)
        if publisher.lora is None:
            raise ValueError("network.broadcast = 'adapter' needs lora.enabled")
        self.base_dir = Path(publisher.lora.base_dir)
        self.base_files = {p.name: sha256_file(p)
                           for p in sorted(self.base_dir.glob("*.safetensors"))
                           if p.name != ADAPTER_WEIGHTS}

    def base_version(self, store: Any) -> int | None:
        """The version in `store` that is this run's LoRA base (a full version whose weights
        files are the base's), or None."""
        for v, m in sorted(store.complete.items()):
            if m.payload == "full" and {f.name: f.sha256 for f in m.files
                                        if f.name in self.base_files} == self.base_files:
                return v
        return None

    def store(self, store: Any, tmp: Path, version: int) -> Any:
        key = self.publisher.key
        base = self.base_version(store)
        if base is not None and base < version:
            digest = self.publisher.lora.save_version(tmp / "adapter")
            m = store.publish_adapter(tmp / "adapter", version, base, SHARD_SIZE, key=key)
            log_event(log, "adapter published", version=version, base=base,
                      effective_sha256=digest)
            return m
        if version == 0:
            shutil.copytree(self.base_dir, tmp / "model")  # the base itself
            return store.publish(tmp / "model", version, SHARD_SIZE, key=key)
        log_event(log, "adapter broadcast needs the base version in the origin store; "
                  "publishing the full checkpoint", level=logging.WARNING, version=version)
        return super().store(store, tmp, version)


BROADCASTS: dict[str, type[FullVersions]] = {
    "full": FullVersions, "delta": DeltaVersions, "adapter": AdapterVersions}


class ShardcastPublisher(PolicyPublisher):
    """Each version of the live policy `model` into the shardcast origin's store, its manifest
    signed with `key` (the trainer's), then the pool moved to it (through `reader`, the
    trainer's signed client of the orchestrator). How a version is written (whole, a delta, an
    adapter) is the broadcast mode's class, chosen once here."""

    def __init__(self, origin_root: str | Path, reader: LedgerReader, model: Any,
                 tokenizer: Any, key: str, broadcast: str = "full",
                 demand: Callable[[], tuple[int, int | None]] = lambda: (0, None),
                 lora: Any = None, dtype: str = "float32", *, run: str) -> None:
        self.origin_root, self.reader = Path(origin_root), reader
        self.model, self.tokenizer, self.key = model, tokenizer, key
        self.lora = lora  # LoraPolicy: what leaves is its effective weights (rl/lora.py)
        self.demand = demand  # (taken through, ahead) restated with every move
        self.dtype = dtype  # network.publish_dtype: the checkpoint's float precision
        self.run = run  # the pool's run id, named in every manifest it signs
        if broadcast not in BROADCASTS:
            raise ValueError(f"network.broadcast must be one of {sorted(BROADCASTS)}")
        self.versions = BROADCASTS[broadcast](self)

    def save_full(self, out: Path) -> None:
        """The live policy's whole checkpoint (HF layout) at `out`: LoRA's effective weights,
        else the model in `dtype`."""
        from meshrl.model import save_model

        if self.lora is not None:
            self.lora.save_effective(out)
        else:
            save_model(self.model, self.tokenizer, out,
                       dtype=None if self.dtype == "float32" else torch.bfloat16)

    def publish(self, version: int, weights: Weights) -> None:
        """Publish `model`, whose weights are `weights`, as `version`; move the pool."""
        from meshrl.shardcast.store import VersionStore

        t0 = time.perf_counter()
        store = VersionStore(self.origin_root, keep=1 << 30, run=self.run)  # the origin prunes
        if store.manifest(version) is None:
            tmp = Path(tempfile.mkdtemp(prefix=f".publish-{version}-",
                                        dir=store.root.parent))
            try:
                m = self.versions.store(store, tmp, version)
                log_event(log, "version stored", version=version, payload=m.payload,
                          base=m.base, bytes=m.total_size, fetch_bytes=m.fetch_size)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:  # published before a crash: workers may already hold it, keep theirs
            log_event(log, "version already published", version=version)
        self._move(version, t0)

    def _move(self, version: int, t0: float) -> None:
        pool_step = self.reader.set_step(version, *self.demand())
        log_event(log, "published", version=version, pool_step=pool_step,
                  seconds=round(time.perf_counter() - t0, 3))


class NetworkSource(RolloutSource):
    """Batches of accepted ledger files (module docstring); `policy` is (the live model, its
    tokenizer)."""

    def __init__(self, cfg: NetworkSourceConfig, rollout: RolloutConfig, async_level: int,
                 start_step: int, run_dir: Path, policy: tuple[Any, Any],
                 exclude: frozenset[str] = frozenset(),
                 tasks: TasksConfig | None = None, lora: Any = None) -> None:
        if not cfg.key_file:
            raise ValueError("network.key_file: the trainer needs its key to read the ledger")
        key = Path(cfg.key_file).read_text().strip()
        self.cfg, self.rollout, self.async_level = cfg, rollout, async_level
        self.model, self.tokenizer = policy
        self.lora = lora
        self.exclude = exclude
        self.reader = LedgerReader(cfg.orchestrator_url, key)
        # files are read by the pool's published rules; the trainer's own shape (and the task
        # its held-out set is drawn from) must be theirs, or it refuses to start
        self.rules = self.reader.rules()
        pins = RulesPins(task=tasks, group_size=rollout.group_size, async_level=async_level,
                         prompt_format=rollout.prompt_format)
        check_rules(self.rules, None, pins, "trainer")
        self.key, signer = key, self.rules.policy_signer
        if signer is not None and signer != address_of(key):  # else every version it
            raise PoolRulesError(  # publishes is refused by every relay, worker and validator
                f"refusing to start, the pool's rules name policy_signer {signer}, this "
                f"trainer's key is {address_of(key)}")
        if signer is None:
            log_event(log, "the pool's rules name no policy_signer: workers and validators "
                      "refuse to fetch the versions this trainer publishes", level=logging.WARNING)
        self.tasks = self.rules.task.build()
        self.records_path = run_dir / "rollouts.jsonl"
        self.seen = self._resume_records(start_step)  # sha256 of every file used or dropped
        self.queue: list[LedgerEntry] = []  # trainable, not yet taken, in acceptance order
        self.dropped_stale = 0
        per_batch = -(-rollout.prompts_per_step // self.rules.prompts_per_file)
        # a wide slack is for far members' lag, not for a queue: files waiting to be taken
        # age by a step a batch, so the default queue is at most AHEAD_BATCHES batches
        self.ahead: int | None = (cfg.ahead_files if cfg.ahead_files >= 0
                                  else default_ahead(async_level, per_batch)) or None
        self.per_batch = per_batch
        self.taken_through = 0  # acceptance number of the last accepted file taken
        self._loads = ThreadPoolExecutor(cfg.load_threads, thread_name_prefix="load")
        # taken for step `_next_step` while the step before it trained: (entry, its load)
        self._next: list[Loading] = []
        self._next_step = -1
        self._next_dropped: list[dict[str, Any]] = []
        self._said = (-1, 0)  # (step, taken_through) last restated to the pool
        self._flow: dict[str, float] = {}
        one_member = self.rules.files_per_step * self.rules.prompts_per_file
        if one_member < rollout.prompts_per_step + self.rules.prompts_per_file:
            log_event(log, "one member cannot fill a step alone", level=logging.WARNING,
                      files_per_step=self.rules.files_per_step,
                      prompts_per_file=self.rules.prompts_per_file,
                      prompts_per_step=rollout.prompts_per_step,
                      why=f"a member makes at most {one_member} prompts of one policy version, "
                      f"the trainer takes {rollout.prompts_per_step} and a file's held-out "
                      "prompts are dropped: with few members a step may wait for the next")

    def _resume_records(self, start_step: int) -> set[str]:
        kept = [r for r in read_records(self.records_path) if r["step"] < start_step]
        self.records_path.parent.mkdir(parents=True, exist_ok=True)
        self.records_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return {f["sha256"] for r in kept for f in [*r["used"], *r["dropped"]]}

    def publisher(self) -> ShardcastPublisher:
        """The publisher of this pool: it moves the pool through this source's reader."""
        return ShardcastPublisher(self.cfg.origin_root, self.reader, self.model, self.tokenizer,
                                  self.key, self.cfg.broadcast,
                                  lambda: (self.taken_through, self.ahead), self.lora,
                                  self.cfg.publish_dtype, run=self.rules.policy_run())

    # ---- RolloutSource -----------------------------------------------------------------------
    def get(self, step: int) -> RolloutBatch:
        """The batch of `step`: accepted groups of fresh files, at least `prompts_per_step`."""
        t0 = time.perf_counter()
        self._said = (step, self.taken_through)  # the publish of `step` restated it
        self._flow = {"validator_lag": self._validator_lag(), "load_seconds": 0.0}
        if self.cfg.judge_lag is not None:
            self._wait_judged(step - self.cfg.judge_lag)
        taken: list[FileGroups] = []
        dropped: list[dict[str, Any]] = []
        loading = self._prefetched(step, dropped)
        while (need := self.rollout.prompts_per_step - sum(f.groups for f in taken)) > 0:
            if not loading:  # a file holds at most prompts_per_file groups: all are needed
                want = -(-need // self.rules.prompts_per_file)
                loading = self._start(self._fresh(step, want, taken, dropped, wait=True))
            entry, load, i = loading.pop(0)
            t_load = time.perf_counter()
            try:
                got = load.result()[i]
                if isinstance(got, ValueError):
                    raise got
                taken.append(got)
            except (UnusableFile, ValueError) as e:
                log_event(log, "file unusable", sha256=entry.sha256, reason=str(e))
                dropped.append(_ref(entry, f"unusable: {e}"))
            finally:
                self._flow["load_seconds"] += time.perf_counter() - t_load
        self._record(step, taken, dropped, time.perf_counter() - t0)
        # what is accepted now for the next step loads while this one trains
        self._next_step, self._next_dropped = step + 1, []
        self._next = self._start(self._fresh(step + 1, self.per_batch, [],
                                             self._next_dropped, wait=False))
        return RolloutBatch.concat([f.rows for f in taken], step, time.perf_counter() - t0)

    def flow(self) -> dict[str, float]:
        return dict(self._flow)

    def pending(self, upto: int) -> list[RolloutBatch]:
        return []  # nothing in flight belongs to the trainer: the ledger keeps it

    def close(self) -> None:
        # the ledger, not the trainer, holds what is in flight: files taken ahead and not
        # recorded are free again on the next start
        self._loads.shutdown(wait=False, cancel_futures=True)

    # ---- plumbing --------------------------------------------------------------------------
    def _prefetched(self, step: int,
                    dropped: list[dict[str, Any]]) -> list[Loading]:
        """The loads started for `step` while the step before trained (their drops go to this
        step's record); any taken for another step are checked for freshness again here."""
        loading, self._next = self._next, []
        dropped.extend(self._next_dropped)
        self._next_dropped = []
        if self._next_step == step:
            return loading
        kept = []
        for entry, load, i in loading:
            if is_fresh(step, entry.policy_version, self.async_level):
                kept.append((entry, load, i))
            else:
                self.dropped_stale += 1
                dropped.append(_ref(entry, "stale"))
        return kept

    def _fresh(self, step: int, want: int, taken: list[FileGroups],
               dropped: list[dict[str, Any]], wait: bool) -> list[LedgerEntry]:
        """Up to `want` fresh files for `step`, in acceptance order (stale ones dropped and
        counted on the way); with `wait`, at least one, polling the ledger until there is."""
        out: list[LedgerEntry] = []
        t0 = last = time.monotonic()
        held = 0.0  # how long the orchestrator may hold the next read for an accepted file
        while len(out) < want:
            asked = time.monotonic()
            entry = self.take(held)
            if entry is None:
                if out or not wait:
                    break
                self._restate_demand(step)
                if time.monotonic() - last >= self.cfg.stall_log_s:
                    last = time.monotonic()
                    self._say_waiting(step, taken, dropped, last - t0)
                # reads start at most every poll_s (a held one has waited its part already);
                # the first empty read is followed at once by a held one
                pause = self.cfg.poll_s if held or not self.cfg.hold_s else 0.0
                time.sleep(max(0.0, pause - (time.monotonic() - asked)))
                held = self.cfg.hold_s
            elif is_fresh(step, entry.policy_version, self.async_level):
                out.append(entry)
            else:
                self.dropped_stale += 1
                dropped.append(_ref(entry, "stale"))
        return out

    def _start(self, entries: list[LedgerEntry]) -> list[Loading]:
        """One load of `entries` together: one download session, one isolated child."""
        if not entries:
            return []
        load = self._loads.submit(self._load, entries)
        return [(e, load, i) for i, e in enumerate(entries)]

    def _say_waiting(self, step: int, taken: list[FileGroups], dropped: list[dict[str, Any]],
                     waited: float) -> None:
        """One line of what step `step` has and lacks (a stall is never silent)."""
        have, need = sum(f.groups for f in taken), self.rollout.prompts_per_step
        excluded = sum(f.excluded for f in taken)
        reasons = [f"{need - have} more accepted groups (of {self.rules.prompts_per_file} per "
                   "file)"]
        if excluded:
            reasons.append(f"{excluded} groups of held-out prompts were dropped from the files "
                           "taken")
        if dropped:
            reasons.append(f"{len(dropped)} files dropped (stale or unusable)")
        if self.rules.files_per_step:
            reasons.append(f"members make at most {self.rules.files_per_step} files per step")
        if self.ahead is not None:
            reasons.append(f"the pool is paced to {self.ahead} files beyond those taken "
                           f"(through acceptance {self.taken_through})")
        log_event(log, "step waiting for accepted files", step=step, groups=have, need=need,
                  files=len(taken), excluded_groups=excluded, dropped=len(dropped),
                  waited_s=round(waited, 1), why="; ".join(reasons))

    def _restate_demand(self, step: int) -> None:
        """While a step waits, tell the pool what was taken since the last move, so files
        taken for this very step free their places at once (never twice for the same)."""
        if self.ahead is None or self._said == (step, self.taken_through):
            return
        self._said = (step, self.taken_through)
        self.reader.set_step(step, self.taken_through, self.ahead)

    def _validator_lag(self) -> int:
        """Files submitted on chain and not yet judged (those the pool stored: version >= 0)."""
        return sum(e.policy_version >= 0 for e in self.reader.awaiting_verdict())

    def take(self, wait_s: float = 0.0) -> LedgerEntry | None:
        """The next trainable accepted file in acceptance order, never one taken before (the
        ledger is read when the queue is empty, held up to `wait_s` for an acceptance); None
        when there is none now."""
        if not self.queue:
            self.queue.extend(e for e in self.reader.accepted(wait_s) if trainable(e))
        while self.queue:
            entry = self.queue.pop(0)
            self.taken_through = max(self.taken_through, entry.accepted_seq)
            if entry.sha256 not in self.seen:
                self.seen.add(entry.sha256)
                return entry
        return None

    def _wait_judged(self, upto: int) -> None:
        """Until no file of policy versions <= `upto` awaits its verdict: the trainer never
        runs more than `judge_lag` steps ahead of the validators, so a cheat is slashed and
        ejected within that many steps however fast honest files arrive. Submissions of a file
        the pool never stored (version -1) are not waited for: nothing of them can be trained
        on, and the validator settles them only after its retries."""
        t0 = last = time.monotonic()
        while upto >= 0:
            waiting = [e for e in self.reader.awaiting_verdict()
                       if 0 <= e.policy_version <= upto]
            if not waiting:
                return
            if time.monotonic() - last >= self.cfg.stall_log_s:
                last = time.monotonic()
                log_event(log, "step waiting for verdicts", files=len(waiting), upto_step=upto,
                          waited_s=round(last - t0, 1), why=f"{len(waiting)} submitted files "
                          f"of steps <= {upto} have no verdict yet (judge_lag "
                          f"{self.cfg.judge_lag}): is a validator running?")
            time.sleep(self.cfg.poll_s)

    def _load(self, entries: list[LedgerEntry]) -> list[FileGroups | ValueError]:
        datas = self.reader.download(entries)
        return list(files_groups(entries, datas, self.tokenizer, self.rules, self.tasks,
                                 self.exclude, int(self.model.config.vocab_size)))

    def _record(self, step: int, taken: list[FileGroups], dropped: list[dict[str, Any]],
                wait: float) -> None:
        used = [{**_ref(f.entry), "groups": f.groups, "excluded": f.excluded} for f in taken]
        line = {"step": step, "t": time.time(), "used": used, "dropped": dropped,
                "wait_s": round(wait, 3)}
        with self.records_path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def _ref(e: LedgerEntry, reason: str | None = None) -> dict[str, Any]:
    out = {"sha256": e.sha256, "node": e.node, "version": e.policy_version}
    return out if reason is None else {**out, "reason": reason}
