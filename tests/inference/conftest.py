import pytest
import torch

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.model import CharTokenizer, build_model


@pytest.fixture(scope="session")
def tok() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture(scope="session")
def qwen(tok):
    return build_model("qwen2-tiny", tok.vocab_size, seed=3)


@pytest.fixture(scope="session")
def engine(qwen, tok) -> CPUEngine:
    return CPUEngine(qwen, tok, EngineConfig())


def _random_prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(4, 99, (k,), generator=g).tolist() for k in lens]


@pytest.fixture(scope="session")
def random_prompts():
    """random_prompts(n, lo, hi, seed): n prompts of lengths in [lo, hi] over ordinary tokens."""
    return _random_prompts
