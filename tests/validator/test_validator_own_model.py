"""A pool on a model of its own: a hub-layout Qwen3 directory with a byte-level BPE tokenizer,
a ChatML chat template and two stop tokens (`<|im_end|>`, `<|endoftext|>` from
generation_config.json). Prompts go through the template when the pool's `prompt_format` rule
says so; the worker's file ends rows on either stop token and the validator, which knows the
same set, accepts it, and refuses a row that runs past one. A model the fast engine cannot run
(Llama with YaRN) is generated and judged on the reference backend by both roles."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import torch
from helpers import claim, honest_file, rules

from hf_families import save_family
from meshrl.inference import CPUEngine, ReferenceBackend, engine_or_reference
from meshrl.inference.params import EngineConfig
from meshrl.model import load_model, load_tokenizer
from meshrl.pool import Check, PromptFormatError, VerdictKind, encode_prompt
from meshrl.validator.models import ModelCache, VersionUnavailable
from meshrl.validator.verify import verify_file


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """The Qwen3 directory, and its model with the head biased so that sampling often ends on
    `<|endoftext|>`, the second stop token."""
    d = save_family("qwen3-tied", tmp_path_factory.mktemp("own") / "qwen3", seed=4)
    tok, model = load_tokenizer(d), load_model(d)
    eot = tok.token_to_id("<|endoftext|>")
    with torch.no_grad():
        model.lm_head.weight[eot] = model.model.norm.weight.sign() * 0.25
    return d, tok, model


def chat_rules(fmt: str = "chat", max_new: int = 24):
    return rules(max_new=max_new).model_copy(update={"prompt_format": fmt})


def test_prompts_go_through_the_chat_template_by_the_rule(qwen3) -> None:
    _, tok, _ = qwen3
    assert tok.has_chat_template
    ids = encode_prompt(tok, "12+30=", "chat")
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == "<|im_start|>user\n12+30=<|im_end|>\n<|im_start|>assistant\n"
    assert encode_prompt(tok, "12+30=", "auto") == ids
    assert tok.decode(encode_prompt(tok, "12+30=", "raw"), skip_special_tokens=False) == "12+30="
    from meshrl.model import CharTokenizer

    char = CharTokenizer()
    assert encode_prompt(char, "1+2=", "auto") == encode_prompt(char, "1+2=", "raw")
    with pytest.raises(PromptFormatError, match="no chat template"):
        encode_prompt(char, "1+2=", "chat")
    assert rules().digest() == rules().model_copy(update={"prompt_format": "raw"}).digest()
    assert chat_rules().digest() != rules().digest()


def test_chat_file_ending_on_either_stop_token_is_accepted(qwen3) -> None:
    _, tok, model = qwen3
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    r = chat_rules()
    worker = engine_or_reference(model, tok, EngineConfig(num_threads=1))
    assert isinstance(worker, CPUEngine)
    files = [honest_file(worker, tok, r, counter=c) for c in range(3)]
    rows = [row for f in files for row in f.completions]
    for row in rows:
        text = tok.decode(row.prompt_tokens, skip_special_tokens=False)
        assert text.startswith("<|im_start|>user\n")
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ends = {row.completion_tokens[-1] for row in rows if row.finish_reason == "eos"}
    assert eot in ends  # the second stop token ended rows, with finish reason "eos"
    for row in rows:
        assert not {im_end, eot} & set(row.completion_tokens[:-1])
    for validator in (ReferenceBackend(model, tok), worker):
        for f in files:
            d = verify_file(validator, tok, f, claim(f), r, r.task.build())
            assert d.kind is VerdictKind.ACCEPT, d.reason
    # raw prompts are not the work of a chat pool
    raw = honest_file(worker, tok, chat_rules("raw"))
    d = verify_file(worker, tok, raw, claim(raw), r, r.task.build())
    assert d.kind is VerdictKind.HARD_INVALID and Check.PROMPTS in d.checks


def test_a_row_that_runs_past_the_second_stop_token_is_refused(qwen3) -> None:
    """A worker that knows only the tokenizer's EOS (not generation_config.json's list) runs
    past `<|endoftext|>`: the validator, which knows both, refuses its file."""
    import copy

    _, tok, model = qwen3
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    narrow = copy.copy(tok)
    narrow.eos_token_ids = (im_end,)
    r = chat_rules()
    f = honest_file(CPUEngine(model, narrow, EngineConfig(num_threads=1)), narrow, r)
    assert any(eot in row.completion_tokens[:-1] for row in f.completions)
    d = verify_file(CPUEngine(model, tok), tok, f, claim(f), r, r.task.build())
    assert d.kind is VerdictKind.HARD_INVALID and Check.TERMINATION in d.checks, d.reason
    assert "past an EOS / stop token" in d.reason


def test_a_model_the_engine_cannot_run_is_worked_and_judged_on_the_reference(
        qwen3, tmp_path) -> None:
    d = tmp_path / "llama-yarn"
    save_family("llama3.1-untied", d, seed=2)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 8192}
    (d / "config.json").write_text(json.dumps(cfg))
    tok, model = load_tokenizer(d), load_model(d)
    worker = engine_or_reference(model, tok, EngineConfig())
    assert isinstance(worker, ReferenceBackend)
    r = chat_rules("auto", max_new=12)
    f = honest_file(worker, tok, r)
    cache = ModelCache(tmp_path / "validator", str(d), [], EngineConfig())
    validator = asyncio.run(cache.get(0))
    assert isinstance(validator, ReferenceBackend) and validator is not worker
    dec = verify_file(validator, cache.tokenizer, f, claim(f), r, r.task.build())
    assert dec.kind is VerdictKind.ACCEPT, dec.reason
    shutil.rmtree(d)


def test_versions_of_one_model_share_an_engine_and_score_as_if_built_alone(
        tmp_path, monkeypatch) -> None:
    """The validator's cache builds a transformers model once: a later version of the same
    config is the held engine with the new weights (`CPUEngine.with_weights`), and scores
    exactly as an engine built from that version's directory; the older version's engine is
    unchanged, and a version whose config differs is built from its own directory."""
    policy = tmp_path / "validator" / "policy"
    for version, seed in ((0, 1), (1, 2), (2, 3)):
        save_family("qwen3-tied", policy / f"v{version}", seed=seed)
    cfg = json.loads((policy / "v2" / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-2  # same shapes, another model
    (policy / "v2" / "config.json").write_text(json.dumps(cfg))
    cache = ModelCache(tmp_path / "validator", "", [], EngineConfig())
    built: list[str] = []
    import meshrl.model as model_pkg

    def counting(path, *a, **kw):  # type: ignore[no-untyped-def]
        built.append(str(path))
        return load_model(path, *a, **kw)

    monkeypatch.setattr(model_pkg, "load_model", counting)
    engines = [asyncio.run(cache.get(v)) for v in (0, 1, 2)]
    assert built == [str(policy / "v0"), str(policy / "v2")] and cache.loads == 3
    prompts, comps = [[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14, 15, 16, 17]]
    for v, engine in enumerate(engines):
        alone = CPUEngine.from_pretrained(policy / f"v{v}")
        for got, want in zip(engine.score(prompts, comps), alone.score(prompts, comps),
                             strict=True):
            assert torch.equal(got.logprobs, want.logprobs)
            assert torch.equal(got.hidden_states, want.hidden_states)
    assert not torch.equal(engines[0].score(prompts, comps)[0].logprobs,
                           engines[1].score(prompts, comps)[0].logprobs)


def test_versions_older_than_every_held_one_leave_the_disk(tmp_path) -> None:
    """A pool fetches a version every step or two: the validator's cache deletes the fetched
    versions older than every one it still holds (a SmolLM2 pool's validators kept 2.1 GB
    after 13 steps), never one it holds; an old version asked again is loaded again."""
    policy = tmp_path / "validator" / "policy"
    for version in range(5):
        save_family("qwen3-tied", policy / f"v{version}", seed=version)
    (policy / "v-junk").mkdir()  # not a version: left alone
    cache = ModelCache(tmp_path / "validator", "", [], EngineConfig(), keep=2)
    for v in range(4):
        asyncio.run(cache.get(v))
    assert sorted(p.name for p in policy.iterdir()) == ["v-junk", "v2", "v3", "v4"]
    asyncio.run(cache.get(4))
    assert sorted(p.name for p in policy.iterdir()) == ["v-junk", "v3", "v4"]
    with pytest.raises(VersionUnavailable):  # gone from disk, and no server to fetch it from
        asyncio.run(cache.get(0))
