import sys
from pathlib import Path

import pytest

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.model import CharTokenizer, build_model

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tok() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture(scope="session")
def model(tok):
    return build_model("qwen2-tiny", tok.vocab_size, seed=3)


@pytest.fixture(scope="session")
def engine(model, tok) -> CPUEngine:
    return CPUEngine(model, tok, EngineConfig(num_threads=1))


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every validator test on one torch thread (see tests/conftest.py)."""
