"""A pool whose `prompt_format` rule is `chat` and a policy without a chat template: no prompt
of the pool can be encoded, so the validator refuses for good (`PoolRulesError`, exit
`EXIT_REFUSED`, one line), never judging a file by prompts it cannot build: at start with a
local `model_dir`, or when it loads its first policy version from shardcast. `auto` and `raw`
start on the same policy."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import rules, rules_server
from test_rules import served

from meshrl.config import EXIT_REFUSED
from meshrl.inference.params import EngineConfig
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.pool import PoolRulesError
from meshrl.protocol import deploy
from meshrl.protocol.anvil import AnvilNode, find_anvil
from meshrl.validator.models import ModelCache
from network import PARAMS, key
from orchestrator.net import SRC, write_toml

REFUSAL = ("refusing to start: prompt_format 'chat': the policy's tokenizer has no chat "
           "template")


@pytest.fixture(scope="module")
def char_model(tmp_path_factory) -> Path:
    """A policy with meshrl's character tokenizer: it has no chat template."""
    tok = CharTokenizer()
    d = tmp_path_factory.mktemp("char") / "policy"
    save_model(build_model("qwen2-tiny", tok.vocab_size), tok, d)
    return d


def _cache(tmp: Path, model_dir: str, fmt: str) -> ModelCache:
    return ModelCache(tmp, model_dir, [], EngineConfig(), prompt_format=fmt)  # type: ignore[arg-type]


def test_a_local_policy_without_a_template_is_refused_at_start(char_model, tmp_path) -> None:
    with pytest.raises(PoolRulesError) as e:
        _cache(tmp_path, str(char_model), "chat").check_prompt_format()
    assert str(e.value) == REFUSAL
    for fmt in ("auto", "raw"):  # the same policy serves these: prompts are raw
        cache = _cache(tmp_path, str(char_model), fmt)
        cache.check_prompt_format()
        assert cache.tokenizer is not None and not cache.tokenizer.has_chat_template


def test_a_fetched_policy_without_a_template_is_refused_before_judging(char_model,
                                                                         tmp_path) -> None:
    """No local model: the first version loaded (here already on disk, as a fetch leaves it)
    is checked before its engine exists, so nothing is judged with it."""
    shutil.copytree(char_model, tmp_path / "policy" / "v3")
    cache = _cache(tmp_path, "", "chat")
    cache.check_prompt_format()  # nothing local to check at start
    with pytest.raises(PoolRulesError, match="^" + REFUSAL + "$"):
        asyncio.run(cache.get(3))
    assert cache.engines == {} and cache.tokenizer is None
    ok = _cache(tmp_path, "", "auto")
    assert asyncio.run(ok.get(3)) is not None and ok.loads == 1


@pytest.mark.anvil
def test_the_validator_process_refuses_a_chat_pool_without_a_template(char_model,
                                                                      tmp_path) -> None:
    """A real `meshrl validator` on a real chain, the pool publishing `prompt_format = chat`,
    its model directory without a chat template: exit `EXIT_REFUSED`, one line."""
    if find_anvil() is None:
        pytest.skip("anvil not installed (run `make setup`)")
    published = rules(max_new=8).model_copy(update={"prompt_format": "chat"})
    serve = published.model_dump(mode="json", exclude={"pool_id"})
    anvil = AnvilNode()
    with anvil as backend:
        fed = key("fed")
        backend.fund(fed.address, 10**21)
        deploy(backend, fed, PARAMS).save(tmp_path / "deployment.json")
        with served(rules_server(1, **serve)) as url:
            cfg = write_toml(tmp_path / "validator.toml", {
                "pool_id": 1, "orchestrator_url": url, "work_dir": str(tmp_path / "v"),
                "poll_interval": 0.2, "model_dir": str(char_model),
                "chain": {"deployment": str(tmp_path / "deployment.json"),
                          "rpc_url": anvil.url}})
            proc = subprocess.run([sys.executable, "-m", "meshrl.cli", "validator", str(cfg)],
                                  capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYTHONPATH": str(SRC)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_REFUSED, out[-3000:]
    assert '"msg": "pool rules"' in out  # it read the published rules, then refused
    [line] = [x for x in out.splitlines() if x.strip() and not x.startswith("{")]
    assert line == f"meshrl validator: {REFUSAL}", line
