"""Tools of agentic episodes (issue #45): each a deterministic function of its call and the
assignment's seed, bounded, and tools no validator could re-run refused when built."""

from __future__ import annotations

import shutil
import time

import pytest

from meshrl.tasks import EpisodeConfig, ToolArithmeticConfig, ToolRefused, ToolSpec, build_tool
from meshrl.tasks.sandbox import SandboxConfig


def test_the_calculator_computes_integer_arithmetic_without_eval():
    calc = build_tool(ToolSpec(name="calc"))
    assert calc.run("1234*5678", 0).output == "7006652"
    assert calc.run(" (7 - 10) * -2 + 9 // 2 % 3 ", 0).output == "7"
    assert calc.run("2**10", 0).output == "1024"
    for hostile, why in [("__import__('os').system('true')", "only integers"),
                         ("(lambda: 1)()", "only integers"), ("1.5*2", "only integers"),
                         ("9**9**9", "exponent"), ("10**64*10**64", "digits"),
                         ("1/0", "only integers"), ("1//0", "division by zero"),
                         ("(" * 200 + "1" + ")" * 200, "error"), ("1+", "not an arithmetic")]:
        res = calc.run(hostile, 0)
        assert res.exit == 1 and why in res.output, (hostile, res)
    assert calc.run("1+1" * 200, 0).output.startswith("error: call longer than 256")


def test_tools_no_validator_can_rerun_are_refused_at_build_in_one_line():
    for name, why in [("web_search", "network"), ("clock", "wall clock"),
                      ("llm_judge", "LLM judge"), ("shell", "not a tool a validator")]:
        with pytest.raises(ToolRefused, match=why) as e:
            build_tool(ToolSpec(name=name))
        assert "\n" not in str(e.value)
    with pytest.raises(ToolRefused, match="network"):
        ToolArithmeticConfig(episode=EpisodeConfig(tools=[ToolSpec(name="search")])).build()


@pytest.mark.timing
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_python_tool_is_sandboxed_seeded_clock_pinned_and_bounded():
    """Same call and seed, same output (random seeded, time pinned); no network; a program
    that hangs is ended by its CPU bound and one that floods by its output bound, each with a
    fixed status."""
    box = SandboxConfig(cpu_s=1, wall_s=5.0, output_bytes=4096)
    py = build_tool(ToolSpec(name="python", max_output_chars=100, sandbox=box))
    prog = "import random, time\nprint(random.random(), time.time())"
    a, b = py.run(prog, 11), py.run(prog, 11)
    assert a == b and a.exit == 0 and a.output.endswith(" 0.0\n")
    assert py.run(prog, 12).output != a.output
    net = py.run("import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=1)", 0)
    assert net.exit != 0
    t0 = time.monotonic()
    hang = py.run("while True: pass", 0)
    assert hang.exit != 0 and time.monotonic() - t0 < 5
    flood = py.run("while True: print('x' * 1000)", 0)
    assert flood.exit != 0 and len(flood.output) <= 100


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_python_tool_prints_a_set_the_same_on_every_run():
    """The sandbox's hash seed is fixed: a set of strings prints in one order on every run (an
    honest worker's output is the validator's re-run), not a per-process random order."""
    py = build_tool(ToolSpec(name="python", max_output_chars=1000))
    prog = "print(' '.join({str(i) for i in range(40)}))"
    assert len({py.run(prog, 0).output for _ in range(3)}) == 1


def _corpus(path, rows) -> tuple[str, str]:
    import hashlib
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


FACTS = [
    {"id": "paris", "text": "Paris is the capital of France."},
    {"id": "rome", "text": "Rome is the capital of Italy; Rome has seven hills."},
    {"id": "nile", "text": "The Nile is a river in Africa."},
    {"id": "rome2", "text": "Rome is the capital of Italy; Rome has seven hills."},  # a tie
]


def test_a_lookup_answers_from_its_pinned_corpus_deterministically(tmp_path):
    path, sha = _corpus(tmp_path / "facts.jsonl", FACTS)
    kb = build_tool(ToolSpec(name="kb", corpus=path, sha256=sha, max_output_chars=40))
    assert kb.run(" nile ", 1).output == "The Nile is a river in Africa."  # an exact id
    # BM25-lite: "rome" twice in the entry outranks one "capital"; the tie to the earlier one
    assert kb.run("capital of rome", 1).output.startswith("Rome is")
    two = build_tool(ToolSpec(name="kb", corpus=path, sha256=sha, top_k=2))
    assert two.run("capital rome", 2).output.splitlines() == [FACTS[1]["text"]] * 2
    assert two.run("hills", 2).output.splitlines() == [FACTS[1]["text"], FACTS[3]["text"]]
    assert kb.run("capital of rome", 1) == build_tool(ToolSpec(
        name="kb", corpus=path, sha256=sha, max_output_chars=40)).run("capital of rome", 99)
    assert len(kb.run("capital of rome", 1).output) == 40  # bounded output
    assert kb.run("zebra", 1) == kb.run("", 1) == type(kb.run("zebra", 1))(
        "error: no entry matches", 1)
    assert kb.run(" ".join(f"w{i}" for i in range(17)), 1).exit == 1  # bounded query
    # a search of a fixed corpus is a lookup, whatever its name; without one it is refused
    assert build_tool(ToolSpec(name="search", corpus=path, sha256=sha)).run("paris", 0).exit == 0


def test_a_corpus_unpinned_or_hashing_otherwise_is_refused_in_one_line(tmp_path):
    path, sha = _corpus(tmp_path / "facts.jsonl", FACTS)
    with pytest.raises(ToolRefused, match="no sha256 pin") as e:
        build_tool(ToolSpec(name="kb", corpus=path))
    assert "\n" not in str(e.value)
    # the validator's copy differs by one entry: refused at build, both digests named
    other, theirs = _corpus(tmp_path / "other.jsonl", FACTS[:3])
    with pytest.raises(ToolRefused, match=f"sha256 {theirs} differs from the rules' pin {sha}"):
        build_tool(ToolSpec(name="kb", corpus=other, sha256=sha))
    with pytest.raises(ToolRefused, match="cannot be read"):
        build_tool(ToolSpec(name="kb", corpus=str(tmp_path / "none.jsonl"), sha256=sha))
    bad, bad_sha = _corpus(tmp_path / "bad.jsonl", [{"id": "a", "text": "x"}, {"id": "a",
                                                                             "text": "y"}])
    with pytest.raises(ToolRefused, match="id 'a' appears twice"):
        build_tool(ToolSpec(name="kb", corpus=bad, sha256=bad_sha))
    # the pin is part of the task's rule, so of the pool's rules digest
    from meshrl.pool import PoolRules
    from meshrl.tasks import TasksConfig

    def digest(pin: str) -> str:
        task = ToolArithmeticConfig(episode=EpisodeConfig(tools=[ToolSpec(
            name="kb", corpus=path, sha256=pin)]))
        return PoolRules(pool_id=1, task=TasksConfig(mix=[task])).digest()
    assert digest(sha) != digest(theirs)
