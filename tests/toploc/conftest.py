"""Session fixtures for the TOPLOC detection matrix (helpers live in toploc_scenario.py)."""

import pytest
import torch
from toploc_scenario import MAX_NEW, PRESET, Scenario, make_prompts, one_thread, run_worker

from meshrl.inference import SamplingParams
from meshrl.model import CharTokenizer, build_model
from meshrl.wire.rollout_file import Completion as Row


@pytest.fixture(scope="session")
def scenario() -> Scenario:
    tok = CharTokenizer()
    model = build_model(PRESET, tok.vocab_size, seed=0, dtype=torch.bfloat16)
    # no EOS: every completion runs to the limit, so 48 prompts give 192 chunks
    params = SamplingParams(seed=1234, max_new_tokens=MAX_NEW, temperature=1.0, ignore_eos=True)
    return Scenario(tok, model, params, make_prompts(48, seed=1, vocab=tok.vocab_size))


@pytest.fixture(scope="session")
def honest_rows(scenario) -> list[Row]:
    with one_thread():
        return run_worker(scenario.model, scenario, scenario.prompts)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield
