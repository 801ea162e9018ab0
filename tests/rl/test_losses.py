import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.rl import LossConfig, group_advantages, nonzero_groups, policy_loss


def test_group_advantages_hand_computed() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv = group_advantages(r, eps=0.0 + 1e-12)
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    assert torch.equal(adv[1], torch.zeros(4))
    assert torch.allclose(group_advantages(r, normalize_std=False)[0],
                          torch.tensor([0.5, -0.5, -0.5, 0.5]))
    assert nonzero_groups(adv).tolist() == [True, False]
    with pytest.raises(ValueError, match="groups, group_size"):
        group_advantages(torch.ones(4))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(-5, 5), min_size=2, max_size=8), min_size=1, max_size=4)
       .filter(lambda g: len({len(x) for x in g}) == 1))
def test_advantages_are_centered_and_unit_scale(groups: list[list[float]]) -> None:
    r = torch.tensor(groups)
    adv = group_advantages(r)
    assert torch.allclose(adv.sum(1), torch.zeros(len(groups)), atol=1e-4)
    for row, a in zip(r, adv, strict=True):
        if row.std(unbiased=False) > 1e-3:
            assert a.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-3)


def _lp(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.full((len(ratios), len(ratios[0])), -1.0)
    new = old + torch.log(torch.tensor(ratios))
    return new.requires_grad_(), old


def test_grpo_two_sided_clip_hand_computed() -> None:
    new, old = _lp([[1.5], [0.5]])
    loss, m = policy_loss(new, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), LossConfig())
    # seq0: max(-1.5, -1.2) = -1.2 ; seq1: max(0.5, 0.8) = 0.8
    assert loss.item() == pytest.approx(-0.2, abs=1e-6)
    assert m["clip_fraction"] == 1.0


def test_grpo_delta_bounds_negative_advantage_blowup() -> None:
    new, old = _lp([[10.0]])
    loss, _ = policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 1), LossConfig())
    assert loss.item() == pytest.approx(4.0, rel=1e-5)  # plain PPO would give 10
    ppo, _ = policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 1),
                         LossConfig(type="dapo"))
    assert ppo.item() == pytest.approx(10.0, rel=1e-5)


def test_normalisations_differ_as_specified() -> None:
    # two sequences, lengths 1 and 3, on-policy, advantages +1 and -1
    new = torch.zeros(2, 3, requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    grpo, _ = policy_loss(new, old, adv, mask, LossConfig(type="grpo"))
    dapo, _ = policy_loss(new, old, adv, mask, LossConfig(type="dapo"))
    dr, _ = policy_loss(new, old, adv, mask, LossConfig(type="dr_grpo", max_tokens=4))
    assert grpo.item() == pytest.approx((-1 + 1) / 2)
    assert dapo.item() == pytest.approx((-1 + 3) / 4)
    assert dr.item() == pytest.approx((-1 + 3) / (2 * 4))
    (g,) = torch.autograd.grad(dapo, new)
    assert torch.allclose(g, torch.tensor([[-0.25, 0, 0], [0.25, 0.25, 0.25]]))


def test_dapo_clip_higher() -> None:
    new, old = _lp([[1.25]])
    cfg = LossConfig(type="dapo", eps_low=0.2, eps_high=0.28)
    loss, m = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-1.25) and m["clip_fraction"] == 0.0
    new, old = _lp([[1.5]])
    loss, m = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-1.28) and m["clip_fraction"] == 1.0


def test_gspo_sequence_ratio() -> None:
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.1, 0.3]], requires_grad=True)
    loss, _ = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), LossConfig(type="gspo"))
    assert loss.item() == pytest.approx(-1.2)  # exp(0.2) = 1.2214 clipped to 1.2
    loss, _ = policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 2),
                          LossConfig(type="gspo"))
    assert loss.item() == pytest.approx(math.exp(0.2), rel=1e-5)


def test_cispo_keeps_gradient_of_clipped_tokens() -> None:
    new, old = _lp([[2.0, 1.0]])
    cfg = LossConfig(type="cispo", eps_high=0.5)
    loss, _ = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), cfg)
    (g,) = torch.autograd.grad(loss, new)
    # weights min(2, 1.5)=1.5 and 1.0, token-mean over 2 tokens, d/dlogp of -w*A*logp
    assert torch.allclose(g, torch.tensor([[-0.75, -0.5]]))


def test_entropy_kl_and_tis_terms() -> None:
    new, old = _lp([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    ent = torch.tensor([[2.0, 4.0]])
    base, _ = policy_loss(new, old, torch.tensor([1.0]), mask, LossConfig())
    with_ent, m = policy_loss(new, old, torch.tensor([1.0]), mask, LossConfig(entropy_coef=0.1),
                              entropy=ent)
    assert with_ent.item() == pytest.approx(base.item() - 0.3) and m["entropy"] == 3.0
    ref = new.detach() - 0.5  # log(ref/p) = -0.5 per token: k3 = e^-0.5 + 0.5 - 1
    with_kl, m = policy_loss(new, old, torch.tensor([1.0]), mask, LossConfig(kl_coef=1.0),
                             ref_logprobs=ref)
    assert m["kl"] == pytest.approx(math.exp(-0.5) - 0.5, rel=1e-5)
    assert with_kl.item() == pytest.approx(base.item() + m["kl"], rel=1e-5)
    (g,) = torch.autograd.grad(with_kl - base, new)  # d/dlogp k3 = 1 - ref/p, token mean
    assert torch.allclose(g, torch.full((1, 2), (1 - math.exp(-0.5)) / 2), atol=1e-6)


def _decoupled(cap: float | None) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """dapo, A = 1, two tokens: pi = pi_prox = (0.5, 0.2), behaviour (0.25, 0.4), so
    pi_prox / pi_behaviour = (2, 0.5): the rollout came from a different (stale) policy."""
    new = torch.tensor([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    behaviour = torch.tensor([[math.log(0.25), math.log(0.4)]])
    cfg = LossConfig(type="dapo", tis_cap=cap)
    prox = new.detach().clone() if cap is not None else None
    loss, m = policy_loss(new, behaviour, torch.tensor([1.0]), torch.ones(1, 2), cfg,
                          proximal_logprobs=prox)
    (g,) = torch.autograd.grad(loss, new)
    return loss.detach(), g, m


def test_decoupled_objective_hand_values() -> None:
    # coupled: ratio vs behaviour (2, 0.5); token 1 clipped at 1.2 (no gradient), token 2 in
    # range: loss mean(-1.2, -0.5), d/dlogp = (0, -0.5 / 2)
    loss, g, m = _decoupled(None)
    assert loss.item() == pytest.approx(-0.85)
    assert torch.allclose(g, torch.tensor([[0.0, -0.25]]))
    assert "tis_weight_mean" not in m and m["ratio_mean"] == pytest.approx(1.25)
    # decoupled, cap 1.5: ratio vs proximal = 1, weights min((2, 0.5), 1.5) = (1.5, 0.5)
    loss, g, m = _decoupled(1.5)
    assert loss.item() == pytest.approx(-1.0)
    assert torch.allclose(g, torch.tensor([[-0.75, -0.25]]))
    assert m["tis_weight_mean"] == pytest.approx(1.0) and m["tis_capped_fraction"] == 0.5
    assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_fraction"] == 0.0
    # the cap changes the gradient: cap 3 keeps weight 2 on token 1
    loss, g, m = _decoupled(3.0)
    assert torch.allclose(g, torch.tensor([[-1.0, -0.25]]))
    assert m["tis_weight_mean"] == pytest.approx(1.25) and m["tis_capped_fraction"] == 0.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-4, 4), min_size=2, max_size=2),
       st.lists(st.floats(-4, 4), min_size=2, max_size=2), st.floats(0.1, 5.0))
def test_tis_weight_never_exceeds_the_cap(prox: list[float], behaviour: list[float],
                                          cap: float) -> None:
    new = torch.tensor([prox], requires_grad=True)
    cfg = LossConfig(type="dapo", tis_cap=cap)
    loss, m = policy_loss(new, torch.tensor([behaviour]), torch.tensor([1.0]), torch.ones(1, 2),
                          cfg, proximal_logprobs=new.detach().clone())
    (g,) = torch.autograd.grad(loss, new)
    weights = [min(math.exp(p - b), cap) for p, b in zip(prox, behaviour, strict=True)]
    # on-proximal ratio is 1: the gradient is -A * w / num_tokens per token
    assert torch.allclose(g, -torch.tensor([weights]) / 2, atol=1e-5, rtol=1e-4)
    assert max(weights) <= cap and m["tis_weight_mean"] == pytest.approx(sum(weights) / 2,
                                                                         rel=1e-4)


def test_decoupled_inputs_are_checked() -> None:
    new = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="proximal_logprobs"):
        policy_loss(new, new, torch.ones(1), torch.ones(1, 2), LossConfig(tis_cap=2.0))
    with pytest.raises(ValueError, match=r"without loss\.tis_cap"):
        policy_loss(new, new, torch.ones(1), torch.ones(1, 2), LossConfig(),
                    proximal_logprobs=new)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(new, new, torch.ones(1), torch.ones(1, 2), LossConfig(kl_coef=0.1))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["grpo", "dapo", "dr_grpo", "cispo"]),
       st.lists(st.floats(-3, 3), min_size=1, max_size=6))
def test_on_policy_gradient_is_reinforce(kind: str, advs: list[float]) -> None:
    b, t = len(advs), 3
    new = torch.randn(b, t).requires_grad_()
    mask = torch.ones(b, t)
    cfg = LossConfig(type=kind, max_tokens=t)
    loss, m = policy_loss(new, new.detach().clone(), torch.tensor(advs), mask, cfg)
    (g,) = torch.autograd.grad(loss, new)
    expected = -torch.tensor(advs)[:, None].expand(b, t) / (b * t)
    assert torch.allclose(g, expected, atol=1e-6)
    assert m["clip_fraction"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0)


def test_shape_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3),
                    LossConfig())
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3),
                    LossConfig())


def _poisoned() -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of two tokens; the first's behaviour log-prob is a forged -100 (issue #41),
    the second's is honest (log-ratio 0.5)."""
    return torch.tensor([[-1.0, -2.0]], requires_grad=True), torch.tensor([[-100.0, -2.5]])


@pytest.mark.parametrize("kind", ["grpo", "dapo", "dr_grpo", "gspo", "cispo"])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_a_forged_behaviour_logprob_keeps_loss_and_gradient_finite(kind: str, adv: float):
    new, old = _poisoned()
    for cfg in (LossConfig(type=kind), LossConfig(type=kind, tis_cap=2.0)):
        prox = new.detach() if cfg.tis_cap else None
        loss, m = policy_loss(new, old, torch.tensor([adv]), torch.ones(1, 2), cfg,
                              proximal_logprobs=prox)
        (g,) = torch.autograd.grad(loss, new)
        assert math.isfinite(loss.item()) and torch.isfinite(g).all(), (kind, cfg.tis_cap)
        assert math.isfinite(m["ratio_mean"])


def test_the_clamped_ratio_hand_computed() -> None:
    from meshrl.rl.losses import LOG_RATIO_LIMIT

    assert LOG_RATIO_LIMIT == 20.0
    # grpo, A = -1: token 0's log-ratio 99 is clamped to 20, its ratio e^20 bounded by delta
    # = 4 (zero gradient); token 1: ratio e^0.5 unclipped; per-sequence mean of the two
    new, old = _poisoned()
    loss, m = policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 2), LossConfig())
    assert loss.item() == pytest.approx((4 + math.exp(0.5)) / 2, rel=1e-6)
    (g,) = torch.autograd.grad(loss, new)
    assert g[0].tolist() == pytest.approx([0.0, math.exp(0.5) / 2], rel=1e-6)
    assert m["ratio_mean"] == pytest.approx((math.exp(20) + math.exp(0.5)) / 2, rel=1e-6)
    # dapo (plain PPO on the negative side): the ratio itself, capped at e^20
    new, old = _poisoned()
    loss, _ = policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 2),
                          LossConfig(type="dapo"))
    assert loss.item() == pytest.approx((math.exp(20) + math.exp(0.5)) / 2, rel=1e-6)
    (g,) = torch.autograd.grad(loss, new)
    assert g[0].tolist() == pytest.approx([0.0, math.exp(0.5) / 2], rel=1e-6)
    # gspo: the sequence ratio exp(mean(20, 0.5)) = e^10.25, unclipped for A = -1
    new, old = _poisoned()
    loss, _ = policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 2),
                          LossConfig(type="gspo"))
    assert loss.item() == pytest.approx(math.exp(10.25), rel=1e-5)
    (g,) = torch.autograd.grad(loss, new)
    assert g[0].tolist() == pytest.approx([0.0, math.exp(10.25) / 2], rel=1e-5)
