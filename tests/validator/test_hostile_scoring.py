"""A rollout file whose answer hangs its task's scorer, judged by a real `meshrl validator`
process (issue #41): reasoning-gym's countdown scores an answer with sympy's `parse_expr`,
and `9**9**9**9` makes sympy compute the integer power, holding the GIL for ever. Before every
task kind scored in the killable child, the validator froze on it (no verdict, no chain poll,
no heartbeat). Now the row scores 0 when the task's `timeout_s` passes (its claimed reward 0
agrees), the file gets its verdict and the validator goes on."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

import pytest
from test_hostile_process import Cheater, _engine, _honest, _onboard, _send, _verdict_lines

from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.pool import PoolRules
from meshrl.protocol import WorkStatus
from meshrl.wire import SignedClient
from network import RULES, _set_step, _status, fund_provider, hexkey, start_net, validator
from wire.hostile import columns, header_bytes, write_parquet

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

DEADLINE = 2.0
HANG = "<answer>9**9**9**9</answer>"
# a countdown prompt is ~355 characters: a policy of 512 positions (qwen2-tiny's are 256)
GYM_RULES = {**RULES, "prompts_per_file": 1,
             "task": {"mix": [{"type": "reasoning_gym", "dataset": "countdown",
                               "config": {"min_numbers": 2, "max_numbers": 2},
                               "timeout_s": DEADLINE}]},
             "sampling": {"max_new_tokens": 32, "temperature": 1.0, "top_p": 1.0}}
# the validator's start (model, reasoning-gym, the scoring child) and the file's judgement
VERDICT_SECONDS = 150.0


def _hanging(rf, rules: PoolRules, tok: CharTokenizer) -> bytes:
    """Row 0's completion ends in HANG (its length, so its work units, unchanged) with the
    reward 0 the timeout rule gives it."""
    cols = columns(rf)
    n = len(cols["completion_tokens"][0])
    text = ("x" * max(0, n - len(HANG)) + HANG)
    cols["completion_tokens"][0] = tok.encode(text)[:max(n, len(HANG))]
    cols["logprobs"][0] = [-1.0] * len(cols["completion_tokens"][0])
    cols["reward"][0] = 0.0
    return write_parquet(cols, header_bytes(rf))


def test_an_answer_that_hangs_its_scorer_scores_0_and_the_validator_goes_on(tmp_path: Path):
    net = start_net(tmp_path, orch={"rules": GYM_RULES})
    try:
        tok = CharTokenizer()
        model_dir = save_model(build_model("qwen2-tiny", tok.vocab_size, seed=3,
                                           max_position_embeddings=512), tok,
                               tmp_path / "policy-512")
        _set_step(net, 0)
        v = validator(net, model_dir=str(model_dir), rules=dict(GYM_RULES))
        v.start()
        c = Cheater("hang", *fund_provider(net, "hang")[:2])
        asyncio.run(_onboard(net, [c]))

        async def rules_of() -> PoolRules:
            async with SignedClient(net.orch.url, hexkey(c.node)) as cl:
                return await cl.call("GET", "/rules", response=PoolRules)
        rules = asyncio.run(rules_of())
        engine, _ = _engine(model_dir)
        rf = _honest(engine, tok, rules, c.node.address, c.provider.address)
        c.data = _hanging(rf, rules, tok)
        c.sha256 = hashlib.sha256(c.data).hexdigest()
        claims = {"policy_version": rf.header.policy_version,
                  "work_units": rf.header.work_units, "counter": 0}
        asyncio.run(_send(net, c, claims, tmp_path))
        t_sent = time.monotonic()

        deadline = t_sent + VERDICT_SECONDS
        while c.sha256 not in _verdict_lines(v.log):
            assert v.proc.poll() is None, v.log.read_text()[-4000:]
            assert time.monotonic() < deadline, ("no verdict: the validator froze?\n"
                                                 + v.log.read_text()[-4000:])
            time.sleep(0.5)
        log = v.log.read_text()
        kills = [json.loads(x) for x in log.splitlines() if x.startswith("{")
                 and "verifier deadline: scoring child killed" in x]
        assert kills and all(DEADLINE <= k["seconds"] < DEADLINE + 1.5 for k in kills)
        verdict = _verdict_lines(v.log)[c.sha256]
        # the row's claimed 0 is the timeout rule's; whether the replay samples row 0 (a hard
        # verdict: its completion was not sampled) or not (accepted), the file is judged
        assert "rewards" not in verdict["checks"], verdict
        if verdict["verdict"] != "accept":
            assert _status(net, c.node.address) == [WorkStatus.HARD_INVALIDATED]
        assert v.proc.poll() is None  # alive, and it answers a stop at once
        v.proc.terminate()
        assert v.wait(60) == 0
    finally:
        net.close()
