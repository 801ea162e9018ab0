"""What a rollout file of this pool may hold at most, from its rules: the limits a reader checks
before it decompresses anything a worker uploaded (`meshrl.wire.FileLimits`)."""

from __future__ import annotations

from meshrl.pool.rules import PoolRules
from meshrl.wire.rollout_file import PROOF_CHUNK_SIZE, PROOF_TOPK, FileLimits

__all__ = ["file_limits"]

_DEFAULT = FileLimits()


def file_limits(rules: PoolRules, max_file_bytes: int = _DEFAULT.max_bytes,
                max_prompt_tokens: int = _DEFAULT.max_prompt_tokens,
                toploc_chunk_size: int = PROOF_CHUNK_SIZE,
                toploc_topk: int = PROOF_TOPK) -> FileLimits:
    """Exactly the pool's rows per file, completions of at most `max_new_tokens`, prompts of at
    most `max_prompt_tokens` (the policy's context, say), files of at most `max_file_bytes`,
    proofs of exactly the TOPLOC chunk size and top-k a validator verifies with (the header
    names them; any other would fail the proofs, and a huge top-k is a memory bomb), and any
    row-group layout of those rows (one row group a row at most)."""
    return FileLimits(max_bytes=max_file_bytes, max_rows=rules.rows_per_file(),
                      max_prompt_tokens=max_prompt_tokens,
                      max_completion_tokens=rules.sampling.max_new_tokens,
                      toploc_chunk_size=toploc_chunk_size, toploc_topk=toploc_topk,
                      max_toploc_topk=max(toploc_topk, _DEFAULT.max_toploc_topk),
                      max_segments=_segments(rules),
                      # any layout of the pool's rows is legal, down to one row group a row
                      max_row_groups=max(_DEFAULT.max_row_groups, rules.rows_per_file()))


def _segments(rules: PoolRules) -> int:
    """The most segments a row of the pool's tasks holds: one for a task without tools, a
    model turn and a tool output per turn but the last for a task with them (issue #45)."""
    turns = [spec.episode.max_turns for spec in rules.task.mix
             if getattr(spec, "episode", None) is not None]
    return max([2 * t - 1 for t in turns] or [1])
