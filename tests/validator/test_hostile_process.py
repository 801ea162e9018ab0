"""Hostile rollout files against a real `meshrl validator` process and the trainer's reader
(issue #22, "what it must reach"): every kind of file a dishonest worker can upload, sent as a
cheater node would send it (an upload slot granted by the orchestrator with the node's key, the
bytes uploaded through it, the sha256 submitted on chain with the provider's key), alongside
the files of an honest `meshrl worker` process.

What must hold: the validator neither dies nor restarts (one process, one start, exit status 0
when stopped), its peak RSS (VmHWM) stays within `RSS_HEADROOM` of its peak after judging an
honest file, every hostile submission ends HARD_INVALIDATED on chain with the check that caught
it named first in the ledger's verdict (one cheater node per file: a slash ejects the node),
and the honest files around them are accepted. The validator is held (SIGSTOP) while the files
go on chain, so it queues them in one poll and judges them in one batch: the honest files share
their prefill batch with every hostile file that parses (a bad row must sink only its own file).

The trainer's reader (`file_groups`, which reads through `read_rollout_file_isolated`), given a
ledger entry that agrees with the file (as if a validator had accepted it), refuses every
hostile file with a typed error (`UnusableFile` / `RolloutFileError`) within `READ_SECONDS`,
its process's peak RSS growing by less than `READER_HEADROOM`; except the kinds whose only
defect is a field no reader of the trainer uses (proofs, finish reason, sample_index,
prompt_id, the header's pool and rules digest): those it reads into exactly the honest file's
groups, so nothing of them steers training.

A file whose counter is outside 0..files_per_step-1 is refused its upload slot
(`CounterOutOfRange`); submitted on chain anyway, it names bytes the pool never stored, so the
validator cannot download it: after its retries that is a soft invalidation (the validator's
download failing is never the worker's proven fault), nothing slashed, nothing trainable, the
node still in the pool. The same rows through a slot granted for counter 0 are a hard
`slot_claim`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer
from meshrl.pool import Assignment, PoolRules
from meshrl.protocol import WorkStatus
from meshrl.rl.ledger_files import UnusableFile, file_groups, trainable
from meshrl.wire import CounterOutOfRange, RolloutFileError, SignedClient, WireHTTPError
from meshrl.wire.models import (
    FileStatus,
    Hardware,
    Invite,
    LedgerEntry,
    NodeAnnouncement,
    SlotRequest,
    UploadSlot,
    VerdictKind,
)
from meshrl.wire.rollout_file import COLUMNS, RolloutFile, rollout_file_bytes
from meshrl.worker.rollouts import generate_rollouts
from network import (
    PARAMS,
    RULES,
    Net,
    _accepted,
    _rows,
    _set_step,
    _status,
    fund_provider,
    hexkey,
    start_net,
    validator,
    wait_until,
    worker,
)
from wire.hostile import (  # the wire tests' builders (tests/ is on sys.path)
    columns,
    deep_header,
    footer_understates,
    header_bytes,
    invalid_utf8,
    million_rows,
    nested_header,
    proof_bomb,
    random_framed,
    string_bomb,
    write_parquet,
)

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

MB = 1 << 20
# the validator's peak RSS may grow past its peak after judging an honest file by at most this
# much while it judges every hostile file (measured: +12 to +24 MB over a ~475 MB baseline; the
# bombs are read in a child)
RSS_HEADROOM = 300 * MB
# any child the validator reads a file in (sampled every 50 ms while it judges: a child's VmHWM
# when last seen; measured: at most 83 MB); the wire tests bound each bomb's reader at 250 MB
CHILD_RSS = 400 * MB
# the trainer's reader: each hostile file refused within this time, the reading process's peak
# RSS growing by less than this over all of them (measured: well under a second each, ~0 MB)
READ_SECONDS = 10.0
READER_HEADROOM = 100 * MB
# every hostile file and the honest ones around them judged (measured: 9 to 27 s)
JUDGE_SECONDS = 180.0
STEP = 1  # the pool's step: versions 0 and 1 allowed, so a version-0 generation can be claimed as 1


# ---- the hostile files -----------------------------------------------------------------------
@dataclass(frozen=True)
class Hostile:
    """One kind: the bytes a cheater builds from its honest file, what its slot request
    claims, and the check that must catch it (first in the verdict)."""

    build: Callable[[RolloutFile, PoolRules], bytes]
    check: str
    slot: dict[str, int] | None = None  # slot-request fields other than the header's
    # the trainer's reader: "refused" (a typed error), or "ignored" (a field the trainer never
    # reads: it takes problems from the pool's rules, so its groups are the honest file's)
    reader: str = "refused"


def _rows_changed(change: Callable[[dict[str, list]], None]) -> Callable[..., bytes]:
    def build(rf: RolloutFile, rules: PoolRules) -> bytes:
        cols = columns(rf)
        change(cols)
        return write_parquet(cols, header_bytes(rf))
    return build


def _header_changed(**update: Any) -> Callable[..., bytes]:
    def build(rf: RolloutFile, rules: PoolRules) -> bytes:
        return write_parquet(columns(rf), rf.header.model_copy(update=update)
                             .model_dump_json().encode())
    return build


def _token(value: int) -> Callable[..., bytes]:
    def change(cols: dict[str, list]) -> None:
        cols["completion_tokens"][0] = [value, *cols["completion_tokens"][0][1:]]
    return _rows_changed(change)


def _long_prompt(cols: dict[str, list]) -> None:
    """Row 0's prompt long enough that prompt + completion pass the policy's context (256)."""
    cols["prompt_tokens"][0] = cols["prompt_tokens"][0] + [20] * 256


def _long_completion(cols: dict[str, list]) -> None:
    """Row 0's completion past the pool's max_new_tokens (16): refused by the file limits."""
    cols["completion_tokens"][0] = cols["completion_tokens"][0] + [20] * 8
    cols["logprobs"][0] = cols["logprobs"][0] + [-1.0] * 8


def _counter(value: int) -> Callable[[dict[str, list]], None]:
    def change(cols: dict[str, list]) -> None:
        cols["counter"] = [value] * len(cols["counter"])
    return change


def _set(column: str, row: int, value: Any) -> Callable[[dict[str, list]], None]:
    def change(cols: dict[str, list]) -> None:
        cols[column][row] = value(cols[column][row]) if callable(value) else value
    return change


def _flip_finish(reason: str) -> str:
    """A finish reason its row's tokens contradict (EOS claimed without one, or the length
    limit claimed by a row that ended on EOS before it)."""
    return "length" if reason == "eos" else "eos"


def _zero_proofs(cols: dict[str, list]) -> None:
    """Every row's proofs zeroed: proofs are checked on the replayed rows (sampled replay)."""
    cols["toploc_proofs"] = [[b"\x00" * len(p) for p in row] for row in cols["toploc_proofs"]]


def _empty_completion(cols: dict[str, list]) -> None:
    cols["completion_tokens"][0], cols["logprobs"][0], cols["toploc_proofs"][0] = [], [], []


def _topk_bomb(rf: RolloutFile) -> bytes:
    """A header naming top-k 131,072 and one-token chunks, its proofs that wide (issue #41)."""
    h = rf.header.model_copy(update={"toploc_topk": 1 << 17, "toploc_chunk_size": 1})
    cols = columns(rf)
    cols["toploc_proofs"] = [[bytes([i % 256]) + b"\0" * (h.proof_bytes - 1)
                              for i in range(len(t))] for t in cols["completion_tokens"]]
    return write_parquet(cols, h.model_dump_json().encode())


def _double_dip(rf: RolloutFile, rules: PoolRules) -> bytes:
    """The version-0 generation claimed as version 1, with the seed and prompt ids
    that claim would have (a careful cheater, as `adversary.DoubleDip`): the claimed version's
    problems are other problems."""
    h = rf.header
    a = Assignment(rules, h.node, 0, 1)
    rows = [dataclasses.replace(r, prompt_id=a.prompt_id(i)) for i, r in enumerate(rf.completions)]
    return rollout_file_bytes(RolloutFile(h.model_copy(update={
        "policy_version": 1, "sampling_seed": a.sampler_seed()}), rows))


def _vocab_size() -> int:
    return CharTokenizer().vocab_size


KINDS: dict[str, Hostile] = {
    "deep-json-header": Hostile(lambda rf, r: deep_header(rf), "schema"),
    "nested-json-header": Hostile(lambda rf, r: nested_header(rf), "schema"),
    "invalid-utf8": Hostile(lambda rf, r: invalid_utf8(rf), "schema"),
    "string-bomb-256MiB": Hostile(lambda rf, r: string_bomb(rf), "schema"),
    "proof-bomb": Hostile(lambda rf, r: proof_bomb(rf), "schema"),
    "header-top-k-proof-bomb": Hostile(lambda rf, r: _topk_bomb(rf), "schema"),
    "footer-understates-a-column": Hostile(lambda rf, r: footer_understates(
        string_bomb(rf), COLUMNS.get_field_index("finish_reason")), "schema"),
    "million-rows": Hostile(lambda rf, r: million_rows(rf), "schema"),
    "random-framed-as-parquet": Hostile(lambda rf, r: random_framed(), "schema"),
    "completion-past-max-new-tokens": Hostile(_rows_changed(_long_completion), "schema"),
    "token-outside-vocab": Hostile(_token(_vocab_size() + 7), "tokens"),
    "token-negative": Hostile(_token(-1), "tokens"),
    "token-2^31-1": Hostile(_token(2**31 - 1), "tokens"),
    "sequence-past-context": Hostile(_rows_changed(_long_prompt), "tokens"),
    "zero-rows": Hostile(_rows_changed(lambda cols: [v.clear() for v in cols.values()]),
                         "schema"),
    "empty-completion": Hostile(_rows_changed(_empty_completion), "schema"),
    # rows that parse and are scored: replayed in the prefill batch of the honest files
    "nan-logprob": Hostile(_rows_changed(_set("logprobs", 0, lambda lp: [float("nan"),
                                                                        *lp[1:]])),
                           "logprobs"),
    "inf-reward": Hostile(_rows_changed(_set("reward", 0, float("inf"))), "rewards"),
    "finish-reason-contradicted": Hostile(_rows_changed(_set("finish_reason", 0,
                                                             _flip_finish)),
                                          "termination", reader="ignored"),
    "zeroed-proofs": Hostile(_rows_changed(_zero_proofs), "toploc", reader="ignored"),
    "sample-index-forged": Hostile(_rows_changed(_set("sample_index", 0, 7)), "seq_ids",
                                   reader="ignored"),
    "prompt-id-forged": Hostile(_rows_changed(_set("prompt_id", 0, "9/9/9")), "seq_ids",
                                reader="ignored"),
    "header-other-pool": Hostile(_header_changed(pool_id=999), "rules", reader="ignored"),
    "header-other-rules-digest": Hostile(_header_changed(rules_sha256="0" * 64), "rules",
                                         reader="ignored"),
    "double-dip-version": Hostile(_double_dip, "prompts", {"policy_version": 1}),
    "counter-outside-range-slot-for-0": Hostile(_rows_changed(_counter(8)), "slot_claim",
                                                {"counter": 0}),
}
# refused its slot (counter 8 with files_per_step 8), then submitted on chain without one
UNGRANTED = Hostile(_rows_changed(_counter(8)), "validator_error", {"counter": 8})


def _claims(rf: RolloutFile, h: Hostile) -> dict[str, int]:
    c = {"policy_version": rf.header.policy_version,
         "work_units": rf.header.work_units, "counter": 0}
    return {**c, **(h.slot or {})}


def _engine(model_dir: Path) -> tuple[CPUEngine, Any]:
    tok = load_tokenizer(model_dir)
    return CPUEngine(load_model(model_dir), tok, EngineConfig(num_threads=1)), tok


def _honest(engine: CPUEngine, tok: Any, rules: PoolRules, node: str, provider: str) -> RolloutFile:
    """The file an honest worker would make with version 0 (its step), counter 0."""
    return generate_rollouts(engine, tok, Assignment(rules, node, 0, 0),
                             rules.task.build(), provider)


# ---- a cheater node, as a process of its own would act -------------------------------------
@dataclass
class Cheater:
    kind: str
    provider: Any
    node: Any
    data: bytes = b""
    sha256: str = ""
    refused: str = ""  # the orchestrator's refusal of the slot, if any


async def _onboard(net: Net, cheaters: list[Cheater]) -> None:
    """Stake, add the node, announce it, take the orchestrator's invite, join on chain: every
    cheater a member of the pool (the orchestrator answers its work-order poll)."""
    for c in cheaters:
        me = net.client(c.provider)
        await asyncio.to_thread(me.register_provider, PARAMS.min_stake)
        await asyncio.to_thread(me.add_node, c.node, 1)
        async with SignedClient(net.disc.url, hexkey(c.node)) as disc:
            await disc.call("PUT", "/nodes", NodeAnnouncement(
                provider=c.provider.address, pool_id=net.pool,
                hardware=Hardware(cores=4, memory_gb=8.0)))
    for c in cheaters:
        async with SignedClient(net.orch.url, hexkey(c.node)) as orch:
            inv = await _poll(lambda: orch.call("GET", "/invite", response=Invite))
            await asyncio.to_thread(net.client(c.node).join_pool, inv.pool_id, c.node.address,
                                    inv.nonce, inv.expiry,
                                    bytes.fromhex(inv.signature.removeprefix("0x")))
            await _poll(lambda: orch.call("GET", "/work"))


async def _poll(make: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await make()
        except WireHTTPError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _send(net: Net, c: Cheater, claims: dict[str, int], tmp: Path) -> None:
    """Grant a slot with the node's key and upload the bytes through it (unless refused), then
    submit the sha256 on chain with the provider's key."""
    path = tmp / f"{c.kind}.parquet"
    path.write_bytes(c.data)
    req = SlotRequest(sha256=c.sha256, size=len(c.data), **claims)
    async with SignedClient(net.orch.url, hexkey(c.node)) as orch:
        try:
            slot = await orch.call("POST", "/uploads", req, response=UploadSlot)
        except CounterOutOfRange as e:
            c.refused = type(e).__name__
        else:
            await orch.upload(slot.method, slot.url, path, c.sha256)
    units = claims["work_units"]
    await asyncio.to_thread(net.client(c.provider).submit_work, net.pool, c.node.address,
                            bytes.fromhex(c.sha256), units)


_STATUS_NAMES = {v: k.lower() for k, v in vars(WorkStatus).items() if k.isupper()}


def _hwm(pid: int) -> int:
    """Peak resident set size of process `pid` (VmHWM), bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


class _ChildPeaks(threading.Thread):
    """Samples the VmHWM of every descendant of `pid` until stopped: the largest one seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.seen = pid, 0, set()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.05):
            for child in _descendants(self.pid):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    self.peak = max(self.peak, _hwm(child))
                    self.seen.add(child)

    def stop(self) -> None:
        self._done.set()
        self.join(5)


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (from each process's parent in /proc/<n>/stat)."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _verdict_lines(log: Path) -> dict[str, dict]:
    out = {}
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("msg") == "verdict":
                out[rec["sha256"]] = rec
    return out


@pytest.fixture
def net(tmp_path):
    n = start_net(tmp_path, max_nodes_per_ip=64)  # every node of this pool is on loopback
    yield n
    n.close()


def test_hostile_files_never_hurt_a_real_validator_or_the_honest_files(net: Net,
                                                                       tmp_path: Path) -> None:
    t0 = time.monotonic()
    _set_step(net, STEP)
    v = validator(net, batch_files=32)
    v.start()
    pid = v.proc.pid
    _, hn, _ = fund_provider(net, "honest")
    honest = worker(net, "honest")
    honest.start()

    # meanwhile, the cheaters: keys, stake, membership, and each one's file
    cheaters = [Cheater(k, *fund_provider(net, f"x-{k}")[:2]) for k in [*KINDS, "ungranted"]]
    asyncio.run(_onboard(net, cheaters))
    async def rules_of() -> PoolRules:
        async with SignedClient(net.orch.url, hexkey(cheaters[0].node)) as c:
            return await c.call("GET", "/rules", response=PoolRules)
    rules = asyncio.run(rules_of())
    engine, tok = _engine(net.model_dir)
    claims = {}
    for c in cheaters:
        h = KINDS.get(c.kind, UNGRANTED)
        rf = _honest(engine, tok, rules, c.node.address, c.provider.address)
        c.data = h.build(rf, rules)
        c.sha256 = hashlib.sha256(c.data).hexdigest()
        claims[c.kind] = _claims(rf, h)
    t_prepared = time.monotonic()

    # the baseline: the validator's peak after judging one honest file
    assert honest.wait(300) == 0, honest.log.read_text()[-3000:]
    wait_until(_accepted(net, hn.address), 240)
    baseline = _hwm(pid)
    t_baseline = time.monotonic()

    # every hostile file, with an honest worker's two files around them: the validator is held
    # (SIGSTOP, the same process) until all are on chain, so it queues them in one poll and
    # judges them in one batch (batch_files 32): the honest files share their prefill batch
    # with every hostile file that parses
    os.kill(pid, signal.SIGSTOP)
    try:
        _, hn2, _ = fund_provider(net, "honest2")
        honest2 = worker(net, "honest2", max_files=2)
        honest2.start()

        async def send_all() -> None:
            for c in cheaters:
                await _send(net, c, claims[c.kind], tmp_path)
        asyncio.run(send_all())
        assert honest2.wait(300) == 0, honest2.log.read_text()[-3000:]
    finally:
        os.kill(pid, signal.SIGCONT)
    t_sent = time.monotonic()
    readers = _ChildPeaks(pid)  # the validator's isolated readers (forkserver children)
    readers.start()
    by_kind = {c.kind: c for c in cheaters}
    assert by_kind["ungranted"].refused == "CounterOutOfRange"
    assert not any(c.refused for c in cheaters if c.kind != "ungranted")

    def settled() -> bool:
        assert v.proc.poll() is None, v.log.read_text()[-4000:]  # never dies
        return all(_status(net, c.node.address) in ([WorkStatus.HARD_INVALIDATED],
                                                     [WorkStatus.SOFT_INVALIDATED])
                   for c in cheaters)
    wait_until(settled, JUDGE_SECONDS, every=1.0)
    wait_until(_accepted(net, hn2.address, 2), 60)
    peak = _hwm(pid)
    t_settled = time.monotonic()
    readers.stop()
    assert t_settled - t_sent < JUDGE_SECONDS
    assert readers.seen and readers.peak < CHILD_RSS, (readers.seen, readers.peak)

    # the validator: one process, alive, within its bound
    assert v.proc.poll() is None and v.proc.pid == pid
    assert peak <= baseline + RSS_HEADROOM, (baseline, peak)

    rows = _rows(net)
    verdicts = _verdict_lines(v.log)
    outcome = {}
    for c in cheaters:
        status = _status(net, c.node.address)
        [row] = [e for e in rows if e.node.lower() == c.node.address.lower()]
        outcome[c.kind] = {"chain": _STATUS_NAMES[status[0]], "ledger": row.status.value,
                           "checks": verdicts[c.sha256]["checks"], "bytes": len(c.data)}
        assert not trainable(row), c.kind
        stake = net.fed.provider(c.provider.address).stake
        if c.kind == "ungranted":  # never stored: the validator cannot download it
            assert status == [WorkStatus.SOFT_INVALIDATED], (c.kind, status)
            assert not row.granted and not row.uploaded
            assert verdicts[c.sha256]["checks"] == ["validator_error"]
            assert stake == PARAMS.min_stake and net.fed.node(c.node.address).pool == net.pool
            continue
        h = KINDS[c.kind]
        assert status == [WorkStatus.HARD_INVALIDATED], (c.kind, status, row.verdict)
        assert row.status is FileStatus.HARD_INVALIDATED, (c.kind, row.status)
        assert row.verdict is VerdictKind.HARD_INVALID, (c.kind, row.verdict)
        assert row.verdict_reason.startswith(f"{h.check}: "), (c.kind, row.verdict_reason)
        assert verdicts[c.sha256]["checks"][0] == h.check, (c.kind, verdicts[c.sha256])
        assert stake == PARAMS.min_stake - PARAMS.slash_penalty, c.kind
        assert net.fed.node(c.node.address).pool == 0, f"{c.kind}: not ejected"

    # the honest nodes: every file accepted, nothing slashed, still members
    for n in (hn, hn2):
        honest_rows = [e for e in rows if e.node.lower() == n.address.lower()]
        assert honest_rows and all(e.status is FileStatus.ACCEPTED for e in honest_rows)
        assert set(_status(net, n.address)) == {WorkStatus.SUBMITTED}
        assert net.fed.node(n.address).pool == net.pool

    v.proc.terminate()
    assert v.wait(60) == 0
    log = v.log.read_text()
    assert log.count('"msg": "pool rules"') == 1  # started once, never restarted
    queued = [json.loads(x)["files"] for x in log.splitlines()
              if x.startswith("{") and '"msg": "submissions queued"' in x]
    assert len(cheaters) + 2 in queued, queued  # one poll, so one batch: honest with hostile
    assert "verification crashed" not in log and "Traceback" not in log
    report = {"validator_rss_mb": {"baseline_peak": round(baseline / MB, 1),
                                   "peak": round(peak / MB, 1),
                                   "bound": round((baseline + RSS_HEADROOM) / MB, 1),
                                   "reader_children_seen": len(readers.seen),
                                   "reader_child_peak": round(readers.peak / MB, 1),
                                   "reader_child_bound": round(CHILD_RSS / MB, 1)},
              "seconds": {"prepare": round(t_prepared - t0, 1),
                          "baseline": round(t_baseline - t0, 1),
                          "hostile_sent": round(t_sent - t_baseline, 1),
                          "hostile_judged": round(t_settled - t_sent, 1),
                          "total": round(time.monotonic() - t0, 1)},
              "kinds": outcome}
    print(json.dumps(report, indent=1))
    (tmp_path / "hostile_report.json").write_text(json.dumps(report, indent=1))


# ---- the trainer's reader ---------------------------------------------------------------------
def _reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def test_every_hostile_file_is_refused_or_ignored_by_the_trainers_reader() -> None:
    """Each file, with a ledger entry that agrees with its header (the worst case: as if a
    validator had accepted it), through `file_groups`: a typed refusal (`UnusableFile` /
    `RolloutFileError`) in bounded time and memory, never another exception; a header naming
    another pool or rules digest steers nothing (the groups are the honest file's)."""
    rules = PoolRules(pool_id=1, **RULES)
    tok = CharTokenizer()
    engine = CPUEngine(build_model("qwen2-tiny", tok.vocab_size, seed=3), tok,
                       EngineConfig(num_threads=1))
    node, provider = "0x" + "ab" * 20, "0x" + "cd" * 20
    rf = _honest(engine, tok, rules, node, provider)
    tasks = rules.task.build()
    kinds = {**KINDS, "ungranted": UNGRANTED}
    files = {k: (h.build(rf, rules), _claims(rf, h)) for k, h in kinds.items()}
    honest = rollout_file_bytes(rf)
    control = file_groups(_entry(honest, node, _claims(rf, Hostile(lambda *_: b"", ""))),
                          honest, tok, rules, tasks)
    assert control.groups == rules.prompts_per_file
    gc.collect()
    reset = _reset_peak_rss()
    before = _hwm_self()
    times, outcomes = {}, {}
    for kind, (data, claims) in files.items():
        entry = _entry(data, node, claims)
        t = time.perf_counter()
        if kinds[kind].reader == "ignored":
            fg = file_groups(entry, data, tok, rules, tasks)
            got, want = fg.rows, control.rows
            assert (got.problems, got.prompt_ids, got.completion_ids,
                    got.rewards.tolist()) == (want.problems, want.prompt_ids,
                                              want.completion_ids, want.rewards.tolist()), kind
            outcomes[kind] = "ignored: the honest file's groups"
        else:
            with pytest.raises((UnusableFile, RolloutFileError)) as e:
                file_groups(entry, data, tok, rules, tasks)
            outcomes[kind] = f"{type(e.value).__name__}: {str(e.value)[:120]}"
        times[kind] = round(time.perf_counter() - t, 3)
        assert times[kind] < READ_SECONDS, (kind, times[kind])
    grown = _hwm_self() - before
    print(json.dumps({"reader_peak_rss_growth_mb": round(grown / MB, 1), "hwm_reset": reset,
                      "seconds": times, "outcomes": outcomes}, indent=1))
    assert grown < READER_HEADROOM, grown


def _entry(data: bytes, node: str, claims: dict[str, int]) -> LedgerEntry:
    return LedgerEntry(seq=1, sha256=hashlib.sha256(data).hexdigest(), node=node,
                       provider="0x" + "cd" * 20, size=len(data), status=FileStatus.ACCEPTED,
                       granted=True, uploaded=True, accepted_seq=1, **claims)


def _hwm_self() -> int:
    return _hwm(os.getpid())
