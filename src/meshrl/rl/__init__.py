"""Reinforcement learning core: advantages, losses, and the asynchronous trainer."""

from meshrl.rl.advantages import group_advantages, nonzero_groups
from meshrl.rl.losses import LossConfig, masked_mean, policy_loss

__all__ = ["LossConfig", "group_advantages", "masked_mean", "nonzero_groups", "policy_loss"]
