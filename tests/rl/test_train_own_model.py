"""`meshrl train` on a hub-layout model directory as it is (Qwen3, sharded safetensors, a BPE
tokenizer with a chat template and two stop tokens), prompts through the chat template: it
warm-starts, trains, evaluates, and checkpoints a directory every role can load again."""

from __future__ import annotations

import json

from hf_families import save_family
from meshrl.cli import main
from meshrl.model import load_model, load_tokenizer


def test_train_on_a_qwen3_directory_with_chat_prompts(tmp_path, capsys) -> None:
    src = save_family("qwen3-tied", tmp_path / "qwen3", seed=3)
    args = [
        "train", "--run.dir", str(tmp_path / "runs"), "--run.name", "own", "--steps", "2",
        "--run.progress", "false", "--run.plot", "false", "--run.threads", "1",
        "--model.path", str(src), "--rollout.prompt_format", "chat",
        "--sft.max_steps", "1", "--eval.num_problems", "4", "--rollout.prompts_per_step", "2",
        "--rollout.group_size", "2", "--rollout.max_new_tokens", "4", "--filter_groups", "false",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2
    run = tmp_path / "runs" / "own"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    # chat prompts: every prompt holds the template's turns around the short task text
    assert all(r["tokens"] > 2 * 2 * 10 for r in steps)
    saved = sorted(p.parent for p in run.rglob("generation_config.json"))
    assert saved, "no checkpointed model directory"
    model, tok = load_model(saved[-1]), load_tokenizer(saved[-1])
    assert model.config.model_type == "qwen3"
    assert tok.has_chat_template and tok.eos_token_ids == load_tokenizer(src).eos_token_ids
    # `meshrl eval` prompts the way the run was trained: through the chat template
    from meshrl.pool import encode_prompt
    from meshrl.rl.config import EvalCommandConfig
    from meshrl.rl.evaluate import evaluate_checkpoint

    assert len(encode_prompt(tok, "1+1=", "chat")) > len(encode_prompt(tok, "1+1=", "raw")) + 4
    base = {"checkpoint": str(run), "threads": 1, "eval": {"num_problems": 4}}
    chat = evaluate_checkpoint(EvalCommandConfig(**base, prompt_format="chat"))
    assert chat["n"] == 4
    # and the option is honoured: a policy without a chat template cannot be asked for one
    import pytest

    from meshrl.model import CharTokenizer, build_model, save_model
    from meshrl.pool import PromptFormatError

    tok0 = CharTokenizer()
    save_model(build_model("qwen2-tiny", tok0.vocab_size), tok0, tmp_path / "plain")
    plain = {**base, "checkpoint": str(tmp_path / "plain")}
    assert evaluate_checkpoint(EvalCommandConfig(**plain))["n"] == 4
    with pytest.raises(PromptFormatError):
        evaluate_checkpoint(EvalCommandConfig(**plain, prompt_format="chat"))
    assert main(["eval", "--checkpoint", str(run), "--prompt_format", "chat",
                 "--eval.num_problems", "4", "--threads", "1"]) == 0
