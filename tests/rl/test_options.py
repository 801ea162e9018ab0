"""Every option of `meshrl train` does what it says: a test that would fail if it were ignored.

`COVERED` maps each option to the test that shows it; `test_every_option_is_covered` fails when
an option is added without one. Options checked elsewhere point at those tests.
"""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest
import torch

from meshrl.config import CommandError, _dotted_fields, _model_type
from meshrl.inference import build_backend
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.rl.config import RLConfig, RolloutConfig, SFTConfig, TrainerConfig
from meshrl.rl.evaluate import evaluate, heldout_problems
from meshrl.rl.loop import RLRun, train
from meshrl.rl.losses import LossConfig
from meshrl.rl.packing import pack_groups
from meshrl.rl.rollouts import generate_batch
from meshrl.rl.sft import warm_start
from meshrl.rl.trainer import Trainer
from meshrl.tasks import TasksConfig

TOK = CharTokenizer()
HERE = "tests/rl/test_options.py::"
TRAINER, LOSSES = "tests/rl/test_trainer.py::", "tests/rl/test_losses.py::"
DIST = "tests/rl/test_distributed.py::"
PASS_K = "tests/rl/test_pass_at_k.py::test_evaluate_pass_at_k_matches_samples_scored_by_hand"
NET = "tests/network/test_network_e2e.py::"
COVERED = {
    "steps": "tests/rl/test_cli.py::test_train_then_eval_from_the_command_line",
    "async_level": "tests/rl/test_cli.py::test_train_then_eval_from_the_command_line",
    "stop_at_accuracy": HERE + "test_stop_at_accuracy_and_resume",
    "filter_groups": HERE + "test_filter_groups",
    "run.name": "tests/rl/test_cli.py::test_train_then_eval_from_the_command_line",
    "run.dir": "tests/rl/test_cli.py::test_train_then_eval_from_the_command_line",
    "run.seed": HERE + "test_seed_model_and_threads",
    "run.resume": HERE + "test_stop_at_accuracy_and_resume",
    "run.checkpoint_every": HERE + "test_run_outputs",
    "run.keep_checkpoints": HERE + "test_run_outputs",
    "run.threads": HERE + "test_seed_model_and_threads",
    "run.trainer_threads": HERE + "test_seed_model_and_threads",
    "run.progress": HERE + "test_run_outputs",
    "run.plot": HERE + "test_run_outputs",
    "run.wandb_project": HERE + "test_wandb_without_wandb_is_a_clear_error",
    "model.preset": HERE + "test_seed_model_and_threads",
    "model.path": HERE + "test_seed_model_and_threads",
    "model.source": "tests/model/test_gguf_import.py::test_train_starts_from_a_gguf_source",
    "model.cache": "tests/model/test_gguf_import.py::test_train_starts_from_a_gguf_source",
    "tasks.mix": HERE + "test_rollout_options",
    "tasks.length_target.enabled": "tests/tasks/test_tasks.py::test_length_target_reward",
    "tasks.length_target.targets": "tests/tasks/test_tasks.py::test_length_target_reward",
    "tasks.length_target.alpha": "tests/tasks/test_tasks.py::test_length_target_reward",
    "tasks.length_target.template": HERE + "test_rollout_options",
    "sft.max_steps": HERE + "test_sft_options",
    "sft.batch_size": HERE + "test_sft_options",
    "sft.lr": HERE + "test_sft_options",
    "sft.warmup_steps": HERE + "test_sft_options",
    "sft.eval_every": HERE + "test_sft_options",
    "sft.target_accuracy": HERE + "test_sft_options",
    "sft.max_accuracy": HERE + "test_sft_options",
    "rollout.prompts_per_step": HERE + "test_rollout_options",
    "rollout.group_size": HERE + "test_rollout_options",
    "rollout.max_new_tokens": HERE + "test_rollout_options",
    "rollout.temperature": HERE + "test_rollout_options",
    "rollout.top_p": HERE + "test_rollout_options",
    "rollout.node_id": HERE + "test_rollout_options",
    "rollout.prompt_format": "tests/rl/test_train_own_model.py::"
        "test_train_on_a_qwen3_directory_with_chat_prompts",
    "rollout.backend":
        "tests/rl/test_engine_backend.py::test_engine_and_reference_rollouts_agree_before_and_after_a_reload",
    "rollout.subprocess":
        "tests/rl/test_pipeline.py::test_subprocess_backend_matches_in_process_and_reloads_weights",
    "rollout.lockstep": "tests/rl/test_learning.py::"
        "test_same_seed_same_numbers_with_or_without_the_generator_thread",
    "trainer.lr": TRAINER + "test_lr_schedules",
    "trainer.warmup_steps": TRAINER + "test_warmup_and_clipping",
    "trainer.decay": TRAINER + "test_lr_schedules",
    "trainer.min_lr_ratio": TRAINER + "test_lr_schedules",
    "trainer.weight_decay": HERE + "test_weight_decay_and_betas",
    "trainer.betas": HERE + "test_weight_decay_and_betas",
    "trainer.max_grad_norm": TRAINER + "test_warmup_and_clipping",
    "trainer.micro_batch_size": TRAINER + "test_micro_batching_matches_one_full_batch",
    "loss.type": LOSSES + "test_normalisations_differ_as_specified",
    "loss.eps_low": LOSSES + "test_grpo_two_sided_clip_hand_computed",
    "loss.eps_high": LOSSES + "test_dapo_clip_higher",
    "loss.delta": LOSSES + "test_grpo_delta_bounds_negative_advantage_blowup",
    "loss.max_tokens": LOSSES + "test_normalisations_differ_as_specified",
    "loss.entropy_coef": LOSSES + "test_entropy_kl_and_tis_terms",
    "loss.kl_coef": HERE + "test_run_outputs",
    "loss.tis_cap": "tests/rl/test_decoupled.py::test_tis_cap_changes_the_update",
    "eval.num_problems": HERE + "test_eval_options",
    "eval.seed": HERE + "test_eval_options",
    "eval.every": HERE + "test_run_outputs",
    "eval.batch_size": HERE + "test_eval_options",
    "eval.max_new_tokens": HERE + "test_eval_options",
    "eval.pass_k": PASS_K,
    "eval.pass_samples": PASS_K,
    "eval.pass_temperature": PASS_K,
    "eval.pass_seed": PASS_K,
    "dist.backend": DIST + "test_nccl_without_cuda_is_a_clear_error",
    "dist.mixed_precision": DIST + "test_fsdp_bf16_mixed_precision_runs_close_to_fp32",
    "dist.activation_checkpointing": DIST + "test_fsdp_steps_match_single_process",
    "dist.reshard_after_forward": DIST + "test_fsdp_steps_match_single_process",
    "dist.timeout_s": DIST + "test_init_world_joins_a_group_with_the_configured_timeout",
    # the pool mode: a shortened network run on loopback (the trainer reads the orchestrator's
    # ledger with its key, publishes into the origin's store, and waits for verdicts)
    "network.orchestrator_url": NET + "test_trainer_records_against_the_ledger",
    "network.key_file": NET + "test_trainer_records_against_the_ledger",
    "network.origin_root": NET + "test_trainer_records_against_the_ledger",
    "network.poll_s": NET + "test_trainer_records_against_the_ledger",
    "network.hold_s": "tests/orchestrator/test_pacing.py::"
                      "test_a_waiting_trainer_takes_a_file_at_its_acceptance_not_its_next_poll",
    "network.judge_lag": NET + "test_cheater_slashed_ejected_within_two_steps_never_trained_on",
    "network.stall_log_s": "tests/orchestrator/test_stall.py::test_trainer_says_what_a_step_awaits",
    "network.broadcast": "tests/rl/test_shardcast_publisher.py::"
                         "test_delta_broadcast_publishes_each_later_version_as_a_signed_rebuildable_delta",
    "network.publish_dtype": HERE + "test_bf16_publishing_hands_the_rollouts_the_rounded_weights",
    "lora.enabled": "tests/rl/test_resume.py::"
                    "test_lora_run_resumed_matches_uninterrupted_and_trains_only_adapters",
    "lora.rank": "tests/rl/test_lora.py::"
                 "test_alpha_rank_and_rslora_set_the_scale_of_the_effective_weights",
    "lora.alpha": "tests/rl/test_lora.py::"
                  "test_alpha_rank_and_rslora_set_the_scale_of_the_effective_weights",
    "lora.rslora": "tests/rl/test_lora.py::"
                   "test_alpha_rank_and_rslora_set_the_scale_of_the_effective_weights",
    "lora.target_modules": "tests/rl/test_lora.py::"
                           "test_target_modules_choose_the_layers_that_get_adapters",
    "lora.dropout": "tests/rl/test_lora.py::"
                    "test_dropout_other_than_zero_and_adapter_broadcast_without_lora_are_refused",
    "network.ahead_files": "tests/orchestrator/test_stall.py::"
                           "test_trainer_paces_the_pool_by_what_it_will_take",
    "network.load_threads": "tests/orchestrator/test_stall.py::"
                            "test_a_step_loads_its_files_together_and_the_next_ones_while_it_trains",
}


def _leaf_options(cls, prefix: str = "") -> list[str]:
    return [name for name in _dotted_fields(cls, prefix)
            if _model_type(_field(cls, name).annotation) is None]


def _field(cls, dotted: str):
    *sections, last = dotted.split(".")
    for s in sections:
        cls = _model_type(cls.model_fields[s].annotation)
    return cls.model_fields[last]


def test_every_option_is_covered():
    assert sorted(_leaf_options(RLConfig)) == sorted(COVERED)
    root = Path(__file__).resolve().parents[2]
    for option, node in COVERED.items():
        path, name = node.split("::")
        tree = ast.parse((root / path).read_text())
        names = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
        assert name in names, (option, node)


def _model(seed: int = 0):
    return build_model("qwen2-tiny", TOK.vocab_size, seed=seed)


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_outputs(tiny_cfg, tmp_path, capsys):
    """checkpoint_every, keep_checkpoints, progress, plot, eval.every, loss.kl_coef."""
    runs = tmp_path / "runs"
    train(tiny_cfg(steps=2, async_level=0, filter_groups=False, **{
        "run.name": "a", "run.checkpoint_every": 1, "run.keep_checkpoints": 2,
        "run.progress": True, "eval.every": 1, "loss.kl_coef": 0.1,
        "loss.entropy_coef": 0.01}))  # a gradient even when every reward is equal
    bar = capsys.readouterr().err
    train(tiny_cfg(steps=3, async_level=0, **{
        "run.name": "b", "run.checkpoint_every": 1, "run.keep_checkpoints": 1,
        "run.plot": True, "eval.every": 2}))
    assert "rl: 100%" in bar and "rl: " not in capsys.readouterr().err
    assert sorted(p.name for p in (runs / "a" / "checkpoints").glob("step_*")) == [
        "step_1", "step_2"]
    assert [p.name for p in (runs / "b" / "checkpoints").glob("step_*")] == ["step_3"]
    assert not (runs / "a" / "curves.png").exists() and (runs / "b" / "curves.png").is_file()
    evals = {n: [r["step"] for r in _records(runs / n) if r.get("phase") == "rl"] for n in "ab"}
    assert evals == {"a": [0, 1, 2], "b": [0, 2, 3]}  # after the warm-start, every N, the last
    # kl_coef: the warm-started policy is kept as the reference and the KL is logged
    steps_a = [r for r in _records(runs / "a") if r["kind"] == "step"]
    assert steps_a[0]["kl"] == pytest.approx(0.0, abs=1e-9)  # step 1: policy == reference
    assert steps_a[1]["kl"] > 0  # after one update it has moved away
    assert (runs / "a" / "reference" / "config.json").is_file()
    assert not (runs / "b" / "reference").exists()
    assert all("kl" not in r for r in _records(runs / "b") if r["kind"] == "step")
    # resuming run b with a KL term is refused: it has no warm-started reference to measure
    with pytest.raises(CommandError, match="no reference policy"):
        train(tiny_cfg(steps=4, async_level=0, **{"run.name": "b", "loss.kl_coef": 0.1}))


def test_stop_at_accuracy_and_resume(tiny_cfg, tmp_path):
    assert train(tiny_cfg(steps=5, stop_at_accuracy=0.0))["steps"] == 0  # reached at once
    run_dir = tmp_path / "runs" / "arithmetic"
    assert train(tiny_cfg(steps=2))["steps"] == 2  # resumes the checkpoint at step 0
    assert [r["step"] for r in _records(run_dir) if r["kind"] == "resume"] == [0]
    summary = train(tiny_cfg(steps=1, **{"run.resume": False}))  # starts over instead
    assert summary["steps"] == 1
    records = _records(run_dir)
    kinds = [r["kind"] for r in records]
    assert kinds.count("resume") == 1 and kinds.count("warm_start") == 2
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 1]


def test_filter_groups(tiny_cfg):
    from meshrl.rl.rollouts import RolloutBatch

    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    batch = RolloutBatch(0, 0, [], [], [], [], rewards, rewards, 0, 0.0)
    _, keep = RLRun(tiny_cfg()).advantages(batch)
    assert keep.tolist() == [False, True, False]
    _, keep = RLRun(tiny_cfg(filter_groups=False)).advantages(batch)
    assert keep.tolist() == [True, True, True]


def test_seed_model_and_threads(tiny_cfg, tmp_path):
    before = torch.get_num_threads()
    try:
        a = RLRun(tiny_cfg(**{"run.threads": 2}))
        assert torch.get_num_threads() == 1  # async: half of them for the trainer
        b = RLRun(tiny_cfg(async_level=0, **{"run.threads": 2, "run.seed": 1}))
        assert torch.get_num_threads() == 2
        RLRun(tiny_cfg(**{"run.threads": 2, "run.trainer_threads": 3}))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert not torch.equal(_params(a.model), _params(b.model))  # run.seed: initialisation
    assert torch.equal(_params(a.model), _params(_model(0)))
    llama = RLRun(tiny_cfg(**{"model.preset": "llama-tiny"}))
    assert (a.model.config.model_type, llama.model.config.model_type) == ("qwen2", "llama")
    save_model(_model(7), TOK, tmp_path / "start")
    loaded = RLRun(tiny_cfg(**{"model.path": str(tmp_path / "start")}))
    assert torch.equal(_params(loaded.model), _params(_model(7)))


def test_wandb_without_wandb_is_a_clear_error(tiny_cfg, monkeypatch):
    try:
        import wandb  # noqa: F401  (an optional extra)
    except ImportError:
        with pytest.raises(CommandError, match=r"run\.wandb_project needs wandb"):
            RLRun(tiny_cfg(**{"run.wandb_project": "p"}))
    else:  # installed: offline, the run mirrors its metrics to a wandb run
        monkeypatch.setenv("WANDB_MODE", "disabled")
        assert RLRun(tiny_cfg(**{"run.wandb_project": "p"})).metrics._wandb is not None


def _batch(tasks: TasksConfig, **rollout) -> object:
    cfg = RolloutConfig(**{"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 6,
                           **rollout})
    gen = build_backend("engine", _model(0), TOK)
    return generate_batch(gen, TOK, cfg, tasks.build(), 0, 0, 0)


def test_rollout_options():
    base_tasks = TasksConfig()
    base = _batch(base_tasks)
    assert base.rewards.shape == (3, 4) and len(base.completion_ids) == 12
    assert _batch(base_tasks, prompts_per_step=2).rewards.shape == (2, 4)
    assert _batch(base_tasks, group_size=2).rewards.shape == (3, 2)
    assert max(len(c) for c in base.completion_ids) == 6
    assert max(len(c) for c in _batch(base_tasks, max_new_tokens=2).completion_ids) == 2
    cold = _batch(base_tasks, temperature=0.05)
    assert cold.completion_ids != base.completion_ids
    # a near-zero nucleus is greedy: every completion of a prompt is the same
    narrow = _batch(base_tasks, top_p=1e-6)
    for g in range(3):
        assert len({tuple(c) for c in narrow.completion_ids[4 * g: 4 * g + 4]}) == 1
    assert len({tuple(c) for c in base.completion_ids[:4]}) > 1
    assert ([p.prompt for p in _batch(base_tasks, node_id="other").problems]
            != [p.prompt for p in base.problems])
    reverse = TasksConfig(mix=[{"type": "reverse"}])
    assert {p.task for p in _batch(reverse).problems} == {"reverse"}
    custom = TasksConfig(length_target={"enabled": True, "targets": [4],
                                        "template": " <= {target} chars"})
    assert all(p.prompt.endswith(" <= 4 chars") for p in _batch(custom).problems)


def test_sft_options():
    tasks = TasksConfig().build()
    calls: list[int] = []

    def run(script: list[float], **cfg):
        """warm-start a fresh model; held-out accuracy at each evaluation comes from `script`."""
        calls.clear()
        model = _model(0)
        scores = iter(script)

        def evaluate_fn(step: int) -> float:
            calls.append(step)
            return next(scores, 0.0)

        base = {"max_steps": 5, "batch_size": 4, "eval_every": 2, "warmup_steps": 0}
        out = warm_start(model, TOK, SFTConfig(**{**base, **cfg}), tasks, evaluate_fn, 0)
        return out, _params(model) - _params(_model(0))

    out, moved = run([], max_steps=0)
    assert out["steps"] == 0 and calls == [0] and moved.abs().max() == 0
    out, _ = run([])
    assert calls == [0, 2, 4, 5] and out["steps"] == 5  # eval_every 2, and the last step
    run([], eval_every=3)
    assert calls == [0, 3, 5]
    out, _ = run([0.0, 0.1, 0.35])  # target_accuracy 0.3 reached at step 4: stop there
    assert calls == [0, 2, 4] and out == {"steps": 4.0, "accuracy": 0.35, "loss": out["loss"]}
    out, _ = run([0.0, 0.1, 0.35], target_accuracy=0.5)
    assert calls == [0, 2, 4, 5]
    out, moved = run([0.0, 0.9])  # overshoots max_accuracy 0.4: keep the step-0 snapshot
    assert out["steps"] == 0 and moved.abs().max() == 0
    out, _ = run([0.0, 0.9], max_accuracy=0.95)
    assert out["steps"] == 2 and out["accuracy"] == 0.9
    # one step: Adam's first update is lr / (warm-up + 1) times the gradient's sign, per weight
    _, d1 = run([], max_steps=1, lr=1e-3)
    _, d2 = run([], max_steps=1, lr=2e-3)
    _, d3 = run([], max_steps=1, lr=2e-3, warmup_steps=1)
    big = d1.abs() > 5e-4
    assert big.sum() > 1000
    assert torch.allclose(d2[big] / d1[big], torch.tensor(2.0), rtol=1e-2)
    assert torch.allclose(d3[big] / d1[big], torch.tensor(1.0), rtol=1e-2)
    l4, _ = run([], max_steps=1)
    l8, _ = run([], max_steps=1, batch_size=8)
    assert l4["loss"] != l8["loss"]  # other problems in the batch


def test_weight_decay_and_betas():
    prompts = [[1, *TOK.encode("1+2=")]] * 2
    completions = [TOK.encode("3"), TOK.encode("4")]
    batch = pack_groups(prompts, completions, [[-1.0], [-1.0]], TOK.pad_token_id)
    zero = torch.zeros(2)  # no policy gradient: AdamW's decay is the only change
    model = _model(0)
    start = _params(model)
    t = Trainer(model, TrainerConfig(lr=0.1, warmup_steps=0, weight_decay=0.5), LossConfig())
    t.train_step(batch, zero)
    assert torch.allclose(_params(model), start * (1 - 0.1 * 0.5))
    t = Trainer(copy.deepcopy(model), TrainerConfig(warmup_steps=0), LossConfig())
    t.train_step(batch, zero)
    assert torch.equal(_params(t.model), _params(model))  # default: no decay
    # betas: the second Adam step depends on them
    adv = torch.tensor([1.0, -1.0])
    after = []
    for betas in ((0.9, 0.99), (0.5, 0.9)):
        t = Trainer(_model(0), TrainerConfig(lr=1e-3, warmup_steps=0, betas=betas), LossConfig())
        t.train_step(batch, adv)
        t.train_step(batch, adv)
        assert t.optimizer.param_groups[0]["betas"] == betas
        after.append(_params(t.model))
    assert not torch.allclose(after[0], after[1], atol=1e-7)


def test_eval_options():
    tasks = TasksConfig().build()
    from meshrl.rl.config import EvalConfig

    a = heldout_problems(tasks, EvalConfig(num_problems=20))
    assert len(a) == 20 and len({p.prompt for p in a}) == 20
    b = heldout_problems(tasks, EvalConfig(num_problems=20, seed=5))
    assert {p.prompt for p in a} != {p.prompt for p in b}
    gen = build_backend("engine", _model(0), TOK)
    sizes: list[int] = []

    class Counting:  # the real generator; records the size of each generation call
        def generate(self, prompts, params, seq_ids):
            sizes.append(len(prompts))
            return gen.generate(prompts, params, seq_ids)

    full = evaluate(Counting(), TOK, a, tasks, EvalConfig(max_new_tokens=6))
    assert sizes == [20]
    sizes.clear()
    chunked = evaluate(Counting(), TOK, a, tasks, EvalConfig(max_new_tokens=6, batch_size=8))
    assert sizes == [8, 8, 4] and chunked == full  # greedy: same answers in any chunking
    short = evaluate(Counting(), TOK, a, tasks, EvalConfig(max_new_tokens=2))
    assert short["mean_tokens"] <= 2 < full["mean_tokens"]


def test_zero_steps_with_a_decaying_schedule(tiny_cfg):
    """`--steps 0` (warm-start only) is valid with any schedule: nothing to decay over."""
    summary = train(tiny_cfg(steps=0, **{"trainer.decay": "cosine"}))
    assert summary["steps"] == 0


def test_bf16_publishing_hands_the_rollouts_the_rounded_weights(tiny_cfg):
    """The trainer's own rollouts compute with the weights a worker would load: the float32
    master rounded to bfloat16 and upcast; float32 publishing hands the master itself."""
    plain = RLRun(tiny_cfg())
    assert all(torch.equal(v, plain.model.state_dict()[k])
               for k, v in plain.policy_weights().items())
    run = RLRun(tiny_cfg(**{"network.publish_dtype": "bfloat16"}))
    master = run.model.state_dict()
    got = run.policy_weights()
    assert got.keys() == master.keys()
    for k, v in got.items():
        assert v.dtype == torch.float32 and torch.equal(v, master[k].to(torch.bfloat16).float())
    assert any(not torch.equal(v, master[k]) for k, v in got.items())
    with pytest.raises(ValueError, match="publish_dtype"):
        tiny_cfg(**{"network.publish_dtype": "bfloat16", "lora.enabled": True})
