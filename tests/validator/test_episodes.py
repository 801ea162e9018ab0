"""Agentic episodes (issue #45) judged on a real worker's files: an honest episode file is
accepted, and each way of forging one (a lying calculator, a tool call the model never
made, model tokens labelled as a tool's, a tool's tokens labelled as the model's, an episode
cut short or run past its limits) is a hard finding. The policy is `episodes.caller_model`,
a real Qwen2 that writes calls."""

from __future__ import annotations

import copy

import pytest
from episodes import KB_WALK, caller_model, episode_rules
from helpers import cheat_file, claim, honest_file, roundtrip

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.pool import Check, VerdictKind
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import verify_file
from meshrl.wire.rollout_file import RolloutFile, segments

ENGINE = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))


@pytest.fixture(scope="module")
def caller(tok):
    return CPUEngine(caller_model(tok), tok, EngineConfig(num_threads=1))


@pytest.fixture(scope="module")
def ep_rules():
    return episode_rules(max_new=64, max_tool_tokens=56, prompts=3, group=4)


@pytest.fixture(scope="module")
def honest(caller, tok, ep_rules) -> RolloutFile:
    return honest_file(caller, tok, ep_rules)


def _judge(caller, tok, rules, rf: RolloutFile):
    rf = roundtrip(rf)[0]
    return verify_file(caller, tok, rf, claim(rf), rules, rules.task.build(), ENGINE)


def _with_tool(rf: RolloutFile) -> int:
    rows = [i for i, c in enumerate(rf.completions) if len(segments(c)) > 1]
    assert rows, "the caller model made no tool call in this file"
    return rows[0]


def test_an_honest_episode_file_is_accepted(caller, tok, ep_rules, honest):
    """Tool outputs re-run equal, every model turn the sampler's pick from one prefill of the
    whole conversation, proofs per model turn: accepted, with only model tokens replayed."""
    i = _with_tool(honest)
    row = honest.completions[i]
    env = [s for s in segments(row) if not s.model]
    assert env[0].tool == "calc" and tok.decode(row.completion_tokens[env[0].start:env[0].end]
                                                ).startswith("<result>")
    d = _judge(caller, tok, ep_rules, honest)
    assert d.accepted and d.kind is VerdictKind.ACCEPT, d.reason
    model_tokens = sum(s.end - s.start for c in honest.completions for s in segments(c)
                       if s.model)
    assert d.stats["tokens"] == model_tokens


def _tamper(honest: RolloutFile, edit) -> RolloutFile:
    rf = copy.deepcopy(honest)
    edit(rf.completions[_with_tool(rf)])
    return rf


def _lie(row):
    """A calculator that lies: one digit of the tool's output changed."""
    env = next(s for s in segments(row) if not s.model)
    j = env.start + len("<result>")
    row.completion_tokens[j] = row.completion_tokens[j] + 1 if row.completion_tokens[j] < 90 \
        else 20


def _no_call(row):
    """A tool output after a turn that made no call: the call's closing tag rewritten."""
    env = next(s for s in segments(row) if not s.model)
    row.completion_tokens[env.start - 1] = row.completion_tokens[env.start - 2]


def _model_as_env(row):
    """The model's last turn relabelled as part of the tool's output before it (its tokens
    out of the proofs' and sampler's reach)."""
    assert row.segment_kinds[-2:] == [1, 0]
    s = segments(row)[-1]
    row.logprobs[s.start:s.end] = [0.0] * (s.end - s.start)
    del row.toploc_proofs[len(row.toploc_proofs) - -(-(s.end - s.start) // 32):]
    last = row.segment_lengths.pop()
    row.segment_lengths[-1] += last
    for name in ("segment_kinds", "segment_tools", "segment_exits"):
        getattr(row, name).pop()


def _env_as_model(row):
    """The tool's output relabelled as the model's (merged into the turns around it)."""
    k = row.segment_kinds.index(1)
    n = sum(row.segment_lengths[k - 1:k + 2]) if k + 1 < len(row.segment_kinds) else sum(
        row.segment_lengths[k - 1:k + 1])
    take = 3 if k + 1 < len(row.segment_kinds) else 2
    del row.segment_kinds[k:k + take - 1]
    del row.segment_tools[k:k + take - 1]
    del row.segment_exits[k:k + take - 1]
    row.segment_lengths[k - 1:k + take - 1] = [n]
    if len(row.segment_kinds) == 1:  # now a one-turn row: proofs of the whole completion
        row.toploc_proofs = row.toploc_proofs[:-(-n // 32)]
    else:
        row.toploc_proofs = row.toploc_proofs[:-(-n // 32)]


def _cut_short(row):
    """The episode stopped at its first call: the tool's output and what followed dropped."""
    k = row.segment_kinds.index(1)
    n = sum(row.segment_lengths[:k])
    row.completion_tokens = row.completion_tokens[:n]
    row.logprobs = row.logprobs[:n]
    for name in ("segment_kinds", "segment_lengths", "segment_tools", "segment_exits"):
        setattr(row, name, getattr(row, name)[:k])
    row.toploc_proofs = row.toploc_proofs[:sum(-(-x // 32) for x in row.segment_lengths)]
    row.finish_reason = "stop"


def _ends_on_tool(row):
    """The model's last turn dropped after the tool's output (its answer left out)."""
    n = row.segment_lengths.pop()
    for name in ("segment_kinds", "segment_tools", "segment_exits"):
        getattr(row, name).pop()
    del row.completion_tokens[-n:], row.logprobs[-n:]
    del row.toploc_proofs[len(row.toploc_proofs) - -(-n // 32):]


@pytest.mark.parametrize(("edit", "check"), [
    (_ends_on_tool, Check.EPISODE),
    (_lie, Check.EPISODE),
    (_no_call, Check.EPISODE),
    (_cut_short, Check.EPISODE),
    (_model_as_env, Check.EPISODE),
    (_env_as_model, Check.SAMPLING),
])
def test_each_forged_episode_is_a_hard_finding(caller, tok, ep_rules, honest, edit, check):
    rf = _tamper(honest, edit)
    d = _judge(caller, tok, ep_rules, rf)
    assert d.kind is VerdictKind.HARD_INVALID and check in d.checks, d.reason


def test_the_lying_tool_worker_is_a_hard_finding(caller, tok, ep_rules, honest):
    """`meshrl adversary worker` in mode forge-tools: the worker's own episode loop with tools
    that lie (a calculator off by one); the model's turns after a lie are the policy's real
    samples on the forged conversation, so only the tool's re-run can tell."""
    rf = cheat_file(caller, None, tok, ep_rules, "forge-tools")
    i = _with_tool(rf)
    env = next(s for s in segments(rf.completions[i]) if not s.model)
    lied = tok.decode(rf.completions[i].completion_tokens[env.start:env.end])
    told = tok.decode(honest.completions[i].completion_tokens[env.start:env.end])
    assert lied.startswith("<result>") and lied != told, (lied, told)
    d = _judge(caller, tok, ep_rules, rf)
    assert d.kind is VerdictKind.HARD_INVALID and Check.EPISODE in d.checks, d.reason
    assert "differs from the tool's re-run" in d.reason


def test_an_episode_past_its_turn_limit_is_a_hard_finding(caller, tok, ep_rules, honest):
    """The same honest episode under rules of one turn: its second turn is past the limit."""
    i = _with_tool(honest)
    one_turn = episode_rules(max_new=64, max_tool_tokens=56, prompts=3, group=4, max_turns=1)
    assert len(segments(honest.completions[i])) > 1
    rf = copy.deepcopy(honest)
    rf.header.rules_sha256 = one_turn.digest()
    d = _judge(caller, tok, one_turn, rf)
    assert d.kind is VerdictKind.HARD_INVALID and Check.EPISODE in d.checks, d.reason
    assert "ran past the episode's turn or token limits" in d.reason


def test_the_pools_file_limits_bound_segments_by_its_tasks_turns(honest, ep_rules):
    """An honest episode file reads within its pool's limits (2 x max_turns - 1 segments a
    row); a pool whose tasks have no tools reads one segment a row and refuses more."""
    from helpers import rules as plain_rules

    from meshrl.pool import file_limits
    from meshrl.wire.errors import RolloutFileError
    from meshrl.wire.rollout_file import read_rollout_file, rollout_file_bytes

    data = rollout_file_bytes(honest)
    assert file_limits(ep_rules).max_segments == 5
    assert len(read_rollout_file(data, file_limits(ep_rules)).completions) == 12
    plain = file_limits(plain_rules(max_new=64, prompts=3, group=4))
    assert plain.max_segments == 1
    with pytest.raises(RolloutFileError, match="segment_"):
        read_rollout_file(data, plain)


def test_a_forged_lookup_result_is_a_hard_finding(tok, tmp_path):
    """A lookup in the pool's pinned corpus (`kb`), called by a real policy: the honest file
    is accepted (every lookup re-run from the same corpus); the same file with one lookup's
    result replaced by another entry's text (a plausible answer, not the corpus's) is a hard
    finding."""
    import hashlib
    import json

    from meshrl.tasks import ToolSpec

    corpus = tmp_path / "kb.jsonl"
    corpus.write_text("".join(json.dumps({"id": "q" * n, "text": f"{n} q"}) + "\n"
                              for n in range(1, 9)))
    spec = ToolSpec(name="kb", corpus=str(corpus),
                    sha256=hashlib.sha256(corpus.read_bytes()).hexdigest())
    rules = episode_rules(max_new=64, max_tool_tokens=24, prompts=3, group=4, tools=[spec])
    engine = CPUEngine(caller_model(tok, KB_WALK), tok, EngineConfig(num_threads=1))
    honest = honest_file(engine, tok, rules)
    found = [(i, s) for i, c in enumerate(honest.completions) for s in segments(c)
             if not s.model and s.exit == 0]
    assert found, "the kb caller found no entry in this file"
    i, env = found[0]
    assert env.tool == "kb"
    d = _judge(engine, tok, rules, honest)
    assert d.accepted, d.reason
    # another entry's text in place of the one the corpus gives: "<result>3 q</result>"
    rf = copy.deepcopy(honest)
    ids = rf.completions[i].completion_tokens
    j = env.start + len("<result>")
    ids[j] = tok.encode(str(int(tok.decode(ids[j:j + 1])) % 8 + 1))[0]
    d = _judge(engine, tok, rules, rf)
    assert d.kind is VerdictKind.HARD_INVALID and Check.EPISODE in d.checks, d.reason
    assert "'kb' output differs from the tool's re-run" in d.reason
