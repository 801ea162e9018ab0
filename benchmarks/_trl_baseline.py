"""TRL's GRPOTrainer on the same work as meshrl's trainer (benchmark helper, optional dep: trl).

The policy is the same qwen2-tiny preset with meshrl's character tokenizer, wrapped as a HF fast
tokenizer (one token per character, same ids) so TRL can drive it.
"""

from __future__ import annotations

import random
import tempfile
import time
from typing import Any


def hf_char_tokenizer(tok: Any) -> Any:
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(WordLevel(vocab=dict(tok.stoi), unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>", padding_side="left",
    )


def run_trl(steps: int, prompts_per_step: int, group_size: int, max_new_tokens: int,
            lr: float, seed: int = 0, model_dir: str | None = None) -> dict[str, float]:
    """Time `steps` GRPOTrainer steps from the preset (or the policy in `model_dir`); returns
    seconds per step (after 2 warm-up steps) and the mean completion length TRL logged."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from meshrl.model import CharTokenizer, build_model, load_model

    tok = CharTokenizer()
    model = load_model(model_dir) if model_dir else build_model("qwen2-tiny", tok.vocab_size,
                                                                 seed=seed)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    rng = random.Random(seed)
    rows = []
    for _ in range(steps * prompts_per_step + 64):
        a, b = rng.randrange(100), rng.randrange(100)
        rows.append({"prompt": f"<bos>{a}+{b}=", "answer": str(a + b)})

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        pairs = zip(completions, answer, strict=True)
        return [float(c.replace("<eos>", "").strip() == a) for c, a in pairs]

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.stamps.append(time.perf_counter())

    timer = Timer()
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, per_device_train_batch_size=prompts_per_step * group_size,
            num_generations=group_size, max_completion_length=max_new_tokens, max_steps=steps,
            learning_rate=lr, logging_steps=1, save_strategy="no", report_to=[],
            use_cpu=True, bf16=False, seed=seed, disable_tqdm=True, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_list(rows),
                              processing_class=hf_char_tokenizer(tok), callbacks=[timer])
        trainer.remove_callback(PrinterCallback)  # logs every step (for the lengths), not to stdout
        trainer.train()
    gaps = [b - a for a, b in zip(timer.stamps[1:], timer.stamps[2:], strict=False)]
    tokens = float(trainer.state.num_input_tokens_seen or 0)
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history
               if "completions/mean_length" in h]
    return {"step_seconds": sum(gaps) / len(gaps), "tokens_seen": tokens,
            "completion_tokens_mean": sum(lengths) / max(1, len(lengths))}
