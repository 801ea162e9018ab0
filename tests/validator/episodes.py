"""A tiny policy that makes tool calls, for episode tests: a real Qwen2 whose weights are set
so that each next character depends (almost) only on the current one, a walk over

    = -> <,  < -> c | /,  / -> c,  c -> a | >,  a -> l,  l -> c,  > -> 4 | EOS,
    4 -> * | <,  * -> 4

(at temperature 1, two choices each half): after a prompt ending in "=" it writes calls such
as `<calc>4*4</calc>` (answered), `<c>4</calc>` (no opening tag: an error output), stops
after a tool's `</result>` or calls again. Its layers' outputs are scaled down, not removed,
so hidden states still depend on the context (TOPLOC proofs are not degenerate)."""

from __future__ import annotations

from typing import Any

import torch

from meshrl.model import CharTokenizer, build_model
from meshrl.pool import PoolRules
from meshrl.tasks import EpisodeConfig, TasksConfig, ToolArithmeticConfig, ToolSpec

WALK = {"=": "<", "<": "c/", "/": "c", "c": "a>", "a": "l", "l": "c", ">": "4\x00",
        "4": "*<", "*": "4"}
# the same walk for a lookup tool named `kb`: calls `<kb>qq</kb>` (queries of q's)
KB_WALK = {"=": "<", "<": "k/", "/": "k", "k": "b", "b": ">", ">": "q\x00", "q": "q<"}
STRENGTH = 30.0


def caller_model(tok: CharTokenizer, walk: dict[str, str] = WALK) -> Any:
    model = build_model("qwen2-tiny", tok.vocab_size, seed=5, tie_word_embeddings=False)
    d = model.config.hidden_size
    assert tok.vocab_size <= d and not model.config.tie_word_embeddings
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(tok.vocab_size, d))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.02)
            layer.mlp.down_proj.weight.mul_(0.02)
        head = torch.zeros(tok.vocab_size, d)
        for a, nexts in walk.items():
            for b in nexts:
                j = tok.eos_token_id if b == "\x00" else tok.stoi[b]
                head[j, tok.stoi[a]] = STRENGTH / d**0.5
        model.lm_head.weight.copy_(head)
    return model.eval()


def episode_rules(max_new: int = 48, prompts: int = 2, group: int = 4, max_turns: int = 3,
                  max_tool_tokens: int = 24, seed: int = 7,
                  tools: list[ToolSpec] | None = None) -> PoolRules:
    task = ToolArithmeticConfig(digits=1, episode=EpisodeConfig(
        max_turns=max_turns, max_tool_tokens=max_tool_tokens,
        **({"tools": tools} if tools else {})))
    return PoolRules(pool_id=1, seed=seed, prompts_per_file=prompts, group_size=group,
                     task=TasksConfig(mix=[task]), proof_profile="meshrl-cpu-engine",
                     sampling={"max_new_tokens": max_new, "temperature": 1.0, "top_p": 1.0})
