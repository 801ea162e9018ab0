"""Names of the ways an honest validator may recompute (kept torch-free for the CLI)."""

__all__ = ["HONEST_MODES"]

# batch size, padding side and width, thread count (threads-alt: 1 thread, or 2 when the caller
# runs on 1), attention kernel, and fp32 instead of the worker's bf16
HONEST_MODES = (
    "bf16-batch8", "bf16-batch1", "bf16-leftpad-batch16", "bf16-threads-alt", "bf16-eager",
    "fp32", "fp32-eager-leftpad", "fp32-batch3",
)
