# over 400 lines: the catalogue of cheats, one small function each, so a test can name any of them
"""The adversary: realistic dishonest workers, so tests can show the validator catches each one.

Each cheat is what a worker that wants rewards without the work (or with easier work) would do:
- `other-model`: generates with another model of the same shape (its own, cheaper to obtain);
- `int8`: int8-quantized weights (cheaper inference), `scale-layer`: one layer's MLP output
  scaled by `scale` (a subtly different model);
- `cherry-pick`: answers easier problems (shortest answers drawn from other counters) in place
  of the assigned ones, still claiming the assigned counter;
- `forge-rewards`: claims reward 1 for every wrong answer (with `forge_task`, only on the rows
  of that task of the mix, so a test can show a forgery on each task kind is caught);
- `forge-sampling`: samples at another temperature (0: greedy) while claiming the pool's;
- `truncate`: ends completions early with an EOS the sampler did not choose (fewer tokens);
- `stale-policy`: keeps generating with the policy it had when the cheat began;
- `copy`: submits another worker's file as its own;
- `inflate-units`: claims twice the work units it did;
- `forge-one-row`: one row per file is not generated: it repeats its group neighbour's
  completion (tokens, log-probs, proofs and reward all still consistent), so only the replay of
  that very row (its seeded noise) can tell; caught when sampled replay picks it;
- `double-dip`: submits one generation twice, the second time under another allowed policy
  version at a counter of its own (header seed rewritten to match the claim);
- `double-submit`: in a pool that batches, each batch's first file is also submitted on its
  own (`submit_work`), after the batch's root (`double_order` batch-first) or, its leaves
  posted, before it (file-first): the same file paid twice unless a validator opens the leaf;
- `forge-tools`: a lying tool in agentic episodes (issue #45): every tool output it appends
  is made up (a calculator off by one) in place of the tool's, the model's turns after it
  generated honestly on the forged conversation.
A cheat is active on steps > `after_step`, so a test can watch an honest node turn. It runs as
`meshrl adversary worker CONFIG` (`adversaries/cli.py`): the honest `WorkerNode` with these
parts handed in.

Every cheat is a `meshrl.worker.parts.Parts` that wraps the honest parts where it acts, and
nowhere else: the inference backend (`CheatingBackend`: the weights it loads, the temperature it
samples at, the completions it returns, the versions it refuses to load), the rollouts of an
assignment (the problems answered, the claims written into the file), the file maker (another
worker's file, a slot request that lies about the policy version) and the courier (no upload of
a copied file). The honest worker calls the parts it is handed and never asks which cheat
runs.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from meshrl.inference import Completion, InferenceBackend, SamplingParams
from meshrl.inference.backend import ScoreResult
from meshrl.log import get_logger, log_event
from meshrl.pool import Assignment, WorkOrder, prompt_of_row, work_units
from meshrl.protocol.batches import Batch
from meshrl.tasks import Problem, TaskSet
from meshrl.tasks.tools import Tool, ToolResult
from meshrl.wire.rollout_file import RolloutFile, read_rollout_file, rollout_file_bytes
from meshrl.worker.config import CheatConfig
from meshrl.worker.delivery import Courier
from meshrl.worker.outbox import Outbox, OutboxEntry
from meshrl.worker.parts import MadeFile, MakeFile, Parts

__all__ = ["CHEATS", "COPIED", "WEIGHT_CHEATS", "Adversary", "CheatingBackend", "worker_parts"]

log = get_logger("meshrl.worker")

COPIED = -1  # the counter of a copied file's outbox entry: it has none of its own


class Adversary(Parts):
    """A dishonest worker: the honest parts, wrapped where its cheat acts."""

    def __init__(self, cfg: CheatConfig) -> None:
        self.cfg = cfg

    def active(self, step: int) -> bool:
        return step > self.cfg.after_step

    def challenges(self, which: str) -> str:
        # its verdicts are true: a challenge would only lose the deposit (docs/protocol.md)
        return "off"


# ---- the inference backend -------------------------------------------------------------------
class BackendCheat(Adversary):
    """A cheat inside the inference backend: it wraps the engine in a `CheatingBackend`, which
    is told each file's step (its policy version) before the file is generated and asks the
    hooks below."""

    changes_weights = False

    def backend(self, engine: InferenceBackend, model: Any, tokenizer: Any,
                version: int) -> InferenceBackend:
        return CheatingBackend(engine, self, model, tokenizer, version)

    def rollouts(self, engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                 provider: str) -> RolloutFile:
        assert isinstance(engine, CheatingBackend), "a backend cheat generates with its backend"
        engine.at_step(a.policy_version)
        return super().rollouts(engine, tokenizer, a, tasks, provider)

    def weights(self, honest: dict[str, torch.Tensor], model_config: Any) -> dict[str, Any]:
        """The weights loaded while cheating (`changes_weights` only)."""
        return honest

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """The sampling parameters really used while cheating."""
        return params

    def completions(self, comps: list[Completion], eos_token_id: int) -> list[Completion]:
        """The completions returned while cheating."""
        return comps

    def loads_versions(self) -> bool:
        """Whether a new policy version is loaded when it arrives."""
        return True


class CheatingBackend(InferenceBackend):
    """An engine as a cheating worker runs it. It keeps a copy of the honest weights (the
    reference backend runs the loaded model itself, so a weight cheat loaded into it would
    overwrite them) and loads the cheat's weights only on the steps the cheat is active."""

    def __init__(self, inner: InferenceBackend, cheat: BackendCheat, model: Any, tokenizer: Any,
                 version: int) -> None:
        self.inner, self.cheat = inner, cheat
        self.model_config = model.config
        self.eos_token_id = tokenizer.eos_token_id
        self.honest = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.version = version
        self.on = False  # the cheat is active on the current file
        self.swapped = False  # the cheat's weights are loaded

    @property
    def max_seq_len(self) -> int:
        return int(self.inner.max_seq_len)  # type: ignore[attr-defined]

    def at_step(self, step: int) -> None:
        """Before each file (under the worker's policy lock): cheat on this step or not."""
        self.on = self.cheat.active(step)
        swap = self.on and self.cheat.changes_weights
        if swap != self.swapped:
            self.swapped = swap
            self._load()

    def _load(self) -> None:
        state = self.cheat.weights(self.honest, self.model_config) if self.swapped \
            else self.honest
        self.inner.load_weights(state, self.version)

    def load_weights(self, source: str | Path | dict[str, torch.Tensor], version: int) -> None:
        if not self.cheat.loads_versions():
            return
        if not isinstance(source, dict):
            from meshrl.model import load_model

            source = load_model(Path(source)).state_dict()
        self.honest, self.version = source, version
        self._load()

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seq_ids: list[int] | None = None) -> list[Completion]:
        if self.on:
            params = self.cheat.sampling(params)
        comps = self.inner.generate(prompts, params, seq_ids)
        return self.cheat.completions(comps, self.eos_token_id) if self.on else comps

    def score(self, prompts: list[list[int]], completions: list[list[int]] | list[Completion],
              temperature: float = 1.0, return_hidden_states: bool = True,
              return_logits: bool = False) -> list[ScoreResult]:
        return self.inner.score(prompts, completions, temperature, return_hidden_states,
                                return_logits)


class OtherModel(BackendCheat):
    changes_weights = True

    def weights(self, honest: dict[str, torch.Tensor], model_config: Any) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.other_seed)
            model = AutoModelForCausalLM.from_config(model_config)
        return model.state_dict()


class Int8(BackendCheat):
    changes_weights = True

    def weights(self, honest: dict[str, torch.Tensor], model_config: Any) -> dict[str, Any]:
        from meshrl.toploc.perturb import quantize_tensor

        return {name: quantize_tensor(w, 8) if ".layers." in name and
                name.endswith("proj.weight") else w for name, w in honest.items()}


class ScaleLayer(BackendCheat):
    changes_weights = True

    def weights(self, honest: dict[str, torch.Tensor], model_config: Any) -> dict[str, Any]:
        layers = sorted({int(n.split(".layers.")[1].split(".")[0]) for n in honest
                         if ".layers." in n})
        name = f"model.layers.{layers[len(layers) // 2]}.mlp.down_proj.weight"
        w = honest[name]
        return {**honest, name: (w.float() * self.cfg.scale).to(w.dtype)}


class ForgeSampling(BackendCheat):
    def sampling(self, params: SamplingParams) -> SamplingParams:
        return params.model_copy(update={"temperature": self.cfg.temperature})


class Truncate(BackendCheat):
    def completions(self, comps: list[Completion], eos_token_id: int) -> list[Completion]:
        """Every completion of 2+ tokens cut at half its length, ending on EOS."""
        out = []
        for c in comps:
            k = len(c.token_ids) // 2
            if k < 1 or (c.finish_reason == "eos" and len(c.token_ids) <= 2):
                out.append(c)
                continue
            tokens = [*c.token_ids[: k - 1], eos_token_id]
            hidden = None if c.hidden_states is None else c.hidden_states[:k]
            out.append(replace(c, token_ids=tokens, logprobs=c.logprobs[:k],
                               finish_reason="eos", hidden_states=hidden))
        return out


class StalePolicy(BackendCheat):
    """Stops loading new policy versions once the cheat begins, generates as if the work order
    still allowed the version it has, and claims the newest allowed one in its slot request (an
    old version would be refused a slot)."""

    frozen = False

    def loads_versions(self) -> bool:
        return not self.frozen

    def file_maker(self, make: MakeFile, outbox: Outbox) -> MakeFile:
        async def stale(order: WorkOrder) -> MadeFile | None:
            if not self.active(order.step):
                return await make(order)
            self.frozen = True
            made = await make(order.model_copy(
                update={"policy_versions": list(range(order.step + 1))}))
            if made is None:
                return None
            entry, data = made
            newest = max(order.policy_versions)
            return replace(entry, policy_version=newest), data

        return stale


# ---- the rollouts of an assignment -----------------------------------------------------------
@dataclass(frozen=True)
class _CherryPicked(Assignment):
    """An assignment whose problems are the easiest of several other counters' problems."""

    def problems(self, tasks: TaskSet) -> list[Problem]:
        pool = [p for c in range(1, 9) for p in Assignment(
            self.rules, self.node, self.counter + 1000 * c,
            self.policy_version).problems(tasks)]
        pool.sort(key=lambda p: (len(p.answer), p.prompt))
        return pool[: self.rules.prompts_per_file]


class CherryPick(Adversary):
    def rollouts(self, engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                 provider: str) -> RolloutFile:
        if self.active(a.policy_version):
            a = _CherryPicked(a.rules, a.node, a.counter, a.policy_version)
        return super().rollouts(engine, tokenizer, a, tasks, provider)


class ForgeRewards(Adversary):
    def rollouts(self, engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                 provider: str) -> RolloutFile:
        rf = super().rollouts(engine, tokenizer, a, tasks, provider)
        if self.active(a.policy_version):
            names = [p.task for p in a.problems(tasks)] if self.cfg.forge_task else []
            forged = 0
            for i, r in enumerate(rf.completions):
                if (not names or names[prompt_of_row(i, a.rules.group_size)] ==
                        self.cfg.forge_task) and r.reward < 1.0:
                    r.reward, forged = 1.0, forged + 1
            # the run's report tells this cheater's dishonest files from its honest ones by
            # this line: with forge_task (or all rows right), a file may forge nothing
            log_event(log, "rewards forged", version=a.policy_version, counter=a.counter,
                      rows=forged)
        return rf


class InflateUnits(Adversary):
    def rollouts(self, engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                 provider: str) -> RolloutFile:
        rf = super().rollouts(engine, tokenizer, a, tasks, provider)
        if self.active(a.policy_version):
            rf.header = rf.header.model_copy(update={"work_units": 2 * rf.header.work_units})
        return rf


class ForgeOneRow(Adversary):
    """Skips one row's generation per file (`forge_row`, mod the rows): the row repeats the
    completion of the row before it in its group (same prompt, so its reward, log-probs and
    TOPLOC proofs are those the policy gives these tokens; only the sampler's noise, keyed by
    the row's seq id, differs). Needs group_size >= 2 (else the file is honest)."""

    def rollouts(self, engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                 provider: str) -> RolloutFile:
        rf = super().rollouts(engine, tokenizer, a, tasks, provider)
        g, rows = a.rules.group_size, rf.completions
        i = self.cfg.forge_row % len(rows)
        if not self.active(a.policy_version) or g < 2:
            return rf
        i = i if i % g else i + 1  # a row with a neighbour before it in its group
        src = rows[i - 1]
        rows[i] = replace(rows[i], completion_tokens=list(src.completion_tokens),
                          logprobs=list(src.logprobs), reward=src.reward,
                          finish_reason=src.finish_reason,
                          toploc_proofs=list(src.toploc_proofs))
        units = work_units([len(r.prompt_tokens) for r in rows],
                           [len(r.completion_tokens) for r in rows])
        rf.header = rf.header.model_copy(update={"work_units": units})
        return rf


class _LyingTool(Tool):
    """A tool that answers every call with a made-up output (an integer off by one, anything
    else "0"), its exit status the honest one's, and counts its lies. A lie the episode's
    template and cut would make equal to the honest output is not told (it would be no
    forgery)."""

    def __init__(self, honest: Tool, same: Any) -> None:
        super().__init__(honest.spec)
        self.name, self.honest, self.same, self.lies = honest.name, honest, same, 0

    def _run(self, call: str, seed: int) -> ToolResult:
        res = self.honest.run(call, seed)
        out = res.output.strip()
        lie = ToolResult(str(int(out) + 1) if out.lstrip("-").isdigit() else "0", res.exit)
        if self.same(res, lie):
            return res
        self.lies += 1
        return lie


class ForgeTools(Adversary):
    """Runs every episode with lying tools: the worker's own episode loop, handed a copy of
    the task mix whose tasks' tools lie. Logs the lies told per file ("tools forged")."""

    def rollouts(self, engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                 provider: str) -> RolloutFile:
        if not self.active(a.policy_version):
            return super().rollouts(engine, tokenizer, a, tasks, provider)
        forged, liars = copy.copy(tasks), []
        forged.tasks = dict(tasks.tasks)
        for name, task in tasks.tasks.items():
            if task.episode is None:
                continue
            ep = task.episode

            def same(x: ToolResult, y: ToolResult, ep: Any = ep) -> bool:
                def ids(r: ToolResult) -> list[int]:
                    text = ep.result_template.format(output=r.output)
                    return list(tokenizer.encode(text))[: ep.max_tool_tokens]
                return ids(x) == ids(y)

            t = copy.copy(task)
            t.tools = [_LyingTool(tool, same) for tool in task.tools]
            liars += t.tools
            forged.tasks[name] = t
        rf = super().rollouts(engine, tokenizer, a, forged, provider)
        # the run's report tells this cheater's dishonest files by this line (a file whose
        # episodes made no call forges nothing)
        log_event(log, "tools forged", version=a.policy_version, counter=a.counter,
                  outputs=sum(t.lies for t in liars))
        return rf


# ---- the file maker and the courier ----------------------------------------------------------
class Copy(Adversary):
    """Submits another worker's newest submitted file (from its outbox, `copy_from`), one not
    copied before; the orchestrator already stores its bytes, so it is never uploaded."""

    def file_maker(self, make: MakeFile, outbox: Outbox) -> MakeFile:
        async def copied(order: WorkOrder) -> MadeFile | None:
            if not self.active(order.step):
                return await make(order)
            return _copy(Path(self.cfg.copy_from), outbox)

        return copied

    def courier(self, courier: Courier) -> Courier:
        return _NoUploadOfCopies(courier)


def _copy(source: Path, outbox: Outbox) -> MadeFile | None:
    seen = {r["sha256"] for r in outbox.sent()}
    files = sorted((source / "sent").glob("*.parquet"), key=lambda p: p.stat().st_mtime,
                   reverse=True)
    for path in files:
        if path.stem in seen:
            continue
        data = path.read_bytes()
        h = read_rollout_file(data).header
        return OutboxEntry(path.stem, len(data), COPIED, h.policy_version, h.work_units), data
    return None


class DoubleDip(Adversary):
    """Every other file is the previous generation again: its rows claimed under another
    allowed policy version, at the counter (in range) of the file made in its place,
    the header's seed rewritten to what that claim's seed would be. At a tiny learning rate the
    versions' weights are nearly the same, so only the binding of the problems and the noise
    to the version can tell."""

    def file_maker(self, make: MakeFile, outbox: Outbox) -> MakeFile:
        kept: list[MadeFile] = []

        async def dipped(order: WorkOrder) -> MadeFile | None:
            made = await make(order)
            if made is None or not self.active(order.step):
                return made
            if not kept:
                kept.append(made)
                return made
            (first, data), (entry, _) = kept.pop(), made
            versions = [v for v in order.policy_versions if v != first.policy_version]
            if not versions:
                return made
            return _redeemed(data, entry.counter, max(versions), order)

        return dipped


def _redeemed(data: bytes, counter: int, version: int, order: WorkOrder) -> MadeFile:
    """The file `data` claimed as policy version `version` at `counter`."""
    rf = read_rollout_file(data)
    a = Assignment(order.rules, rf.header.node, counter, version)
    rows = [replace(r, counter=a.counter, prompt_id=a.prompt_id(i))
            for i, r in enumerate(rf.completions)]
    header = rf.header.model_copy(update={"policy_version": version,
                                          "sampling_seed": a.sampler_seed()})
    out = rollout_file_bytes(RolloutFile(header, rows))
    return OutboxEntry(hashlib.sha256(out).hexdigest(), len(out), a.counter, version,
                       header.work_units), out


class _NoUploadOfCopies:
    """A courier that does not upload copied files (and delivers every other file as given)."""

    def __init__(self, inner: Courier) -> None:
        self.inner = inner

    async def upload(self, entry: OutboxEntry, path: Path) -> None:
        if entry.counter != COPIED:
            await self.inner.upload(entry, path)

    async def submitted(self, entry: OutboxEntry) -> bool:
        return await self.inner.submitted(entry)

    async def submit(self, entry: OutboxEntry) -> str:
        return await self.inner.submit(entry)

    def __getattr__(self, name: str) -> object:  # the batch methods and the node, as given
        return getattr(self.inner, name)


class DoubleSubmit(Adversary):
    """Each batch's first file submitted on its own too (module doc, `double-submit`)."""

    def courier(self, courier: Courier) -> Courier:
        return _SubmitsTwice(courier, self.cfg.double_order)


class _SubmitsTwice:
    """A batch courier that also submits the first leaf of each batch with `submit_work`."""

    def __init__(self, inner: Any, order: str) -> None:
        self.inner, self.order = inner, order

    async def _again(self, batch: Batch) -> None:
        leaf = batch.leaves[0]
        r = await asyncio.to_thread(self.inner.chain.submit_work, self.inner.pool,
                                    self.inner.node, leaf.file_sha256, leaf.units)
        log_event(log, "cheat: a leaf submitted on its own too", order=self.order,
                  batch_id=batch.id.hex(), sha256=leaf.file_sha256.hex(), tx=r.tx_hash)

    async def post_batch(self, batch: Batch) -> None:
        await self.inner.post_batch(batch)
        if self.order == "file-first":
            await self._again(batch)

    async def submit_batch(self, batch: Batch) -> str:
        tx = await self.inner.submit_batch(batch)
        if self.order == "batch-first":
            await self._again(batch)
        return tx

    def __getattr__(self, name: str) -> object:  # every other method, as given
        return getattr(self.inner, name)


CHEATS: dict[str, type[Adversary]] = {
    "other-model": OtherModel, "int8": Int8, "scale-layer": ScaleLayer,
    "cherry-pick": CherryPick, "forge-rewards": ForgeRewards, "forge-sampling": ForgeSampling,
    "truncate": Truncate, "stale-policy": StalePolicy, "copy": Copy,
    "inflate-units": InflateUnits, "double-dip": DoubleDip, "forge-one-row": ForgeOneRow,
    "forge-tools": ForgeTools, "double-submit": DoubleSubmit,
}

# the cheats that load weights of their own into the backend
WEIGHT_CHEATS: tuple[str, ...] = tuple(m for m, c in CHEATS.items()
                                       if issubclass(c, BackendCheat) and c.changes_weights)


def worker_parts(cheat: CheatConfig) -> Parts:
    """The one factory of a worker's parts: honest ones for cheat mode "none", else that
    cheat's wrapped parts."""
    return Parts() if cheat.mode == "none" else CHEATS[cheat.mode](cheat)
