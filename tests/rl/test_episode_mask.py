"""Agentic episodes in the trainer (issue #45): losses and importance ratios are computed on
the model's tokens only; a tool's output is context, never a target."""

from __future__ import annotations

import torch

from meshrl.model import build_model
from meshrl.rl import LossConfig, policy_loss
from meshrl.rl.packing import pack_groups, packed_logprobs
from meshrl.wire.rollout_file import Completion, loss_mask


def _episode() -> Completion:
    return Completion("t/0", 0, 0, 0, [1, 5, 6], [7, 8, 9, 10, 11, 12], [-0.5] * 2 + [0.0] * 2
                      + [-0.7] * 2, 1.0, "eos", [], [0, 1, 0], [2, 2, 2], ["", "calc", ""],
                      [0, 0, 0])


def test_packing_keeps_the_episode_mask_and_the_loss_ignores_tool_tokens():
    row = _episode()
    mask = loss_mask(row)
    assert mask == [True, True, False, False, True, True]
    packed = pack_groups([row.prompt_tokens] * 2, [row.completion_tokens] * 2,
                         [row.logprobs] * 2, 0, loss_masks=[mask, [True] * 6])
    assert packed["loss_mask"][0].tolist() == mask
    assert packed["loss_mask"][1].tolist() == [True] * 6
    model = build_model("qwen2-tiny", 32, seed=1)
    cfg = LossConfig()

    def loss(behaviour_at_tools: float) -> tuple[float, torch.Tensor]:
        model.zero_grad()
        lp, _ = packed_logprobs(model, packed)
        beh = packed["inference_logprobs"].clone()
        beh[0, 2:4] = behaviour_at_tools  # what a worker could claim there: nothing counts
        out, _ = policy_loss(lp[:1], beh[:1], torch.tensor([1.0]),
                                   packed["loss_mask"][:1], cfg)
        out.backward()
        return float(out.detach()), model.lm_head.weight.grad.clone()

    a, ga = loss(0.0)
    b, gb = loss(-50.0)
    assert a == b and torch.equal(ga, gb)
    unmasked = pack_groups([row.prompt_tokens], [row.completion_tokens], [row.logprobs], 0)
    assert unmasked["loss_mask"][0].tolist() == [True] * 6


def test_the_warm_start_trains_on_tool_use_traces_with_the_real_tool_output_masked():
    from meshrl.model import CharTokenizer
    from meshrl.rl.sft import sft_batch
    from meshrl.tasks import Problem, TasksConfig, ToolArithmeticConfig

    tok = CharTokenizer()
    tasks = TasksConfig(mix=[ToolArithmeticConfig()]).build()
    p = Problem("tool_arithmetic", "1234*5678=", "7006652")
    b = sft_batch(tok, [p], "raw", tasks)
    ids, mask = b["input_ids"][0, 1:], b["loss_mask"][0]
    trained = tok.decode(ids[mask].tolist(), skip_special_tokens=False)
    context = tok.decode(ids[~mask & (b["attention_mask"][0, 1:] == 1)].tolist())
    assert trained == "<calc>1234*5678</calc>7006652<eos>"
    assert context.endswith("<result>7006652</result>")  # the calculator's, not the answer's
