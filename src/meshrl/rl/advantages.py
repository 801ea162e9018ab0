"""Group-relative advantages (GRPO): each completion is judged against its siblings.

`A_ij = (r_ij - mean_j r_ij) / (std_j r_ij + eps)`, with the population standard deviation
(divide by n, not n-1) so a group of two is not over-scaled. Dr. GRPO drops the division by the
standard deviation (it biases learning towards too-easy and too-hard questions).
"""

from __future__ import annotations

import torch

__all__ = ["group_advantages", "nonzero_groups"]


def group_advantages(
    rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages [groups, group_size] from rewards [groups, group_size]."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float32)
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if not normalize_std:
        return centered
    return centered / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)


def nonzero_groups(advantages: torch.Tensor, atol: float = 1e-8) -> torch.Tensor:
    """Bool [groups]: groups with any non-zero advantage (all-equal rewards teach nothing)."""
    return (advantages.abs() > atol).any(dim=1)
