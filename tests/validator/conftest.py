import sys
from pathlib import Path

import pytest
import torch

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
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
