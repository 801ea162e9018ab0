"""Run observability: per-step JSONL metrics, optional wandb, and the reward/accuracy plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "plot_curves", "read_metrics"]


class MetricsWriter:
    """Appends one JSON object per record to `path`; mirrors them to wandb when enabled.

    `enabled=False` (a trainer rank other than 0) writes nothing: one process owns the file."""

    def __init__(self, path: str | Path, wandb_project: str | None = None, run_name: str = "",
                 config: dict[str, Any] | None = None, enabled: bool = True) -> None:
        self.path = Path(path)
        self._file = None
        self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        if wandb_project:
            try:
                import wandb  # optional dependency: `pip install meshrl[wandb]`
            except ImportError:
                from meshrl.config import CommandError

                raise CommandError("run.wandb_project needs wandb: pip install 'meshrl[wandb]'"
                                   " (or leave run.wandb_project unset)") from None

            self._wandb = wandb.init(project=wandb_project, name=run_name, config=config or {})

    def log(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            step = record.get("step")
            kind = record.get("kind", "step")
            data = {f"{kind}/{k}": v for k, v in record.items() if isinstance(v, int | float)}
            self._wandb.log(data, step=step if kind == "step" else None)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: str | Path, out_png: str | Path) -> Path:
    """Training reward per RL step and held-out accuracy (warm-start and RL) in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    if steps:
        xs = [r["step"] for r in steps]
        ys = [r["reward"] for r in steps]
        ax1.plot(xs, ys, alpha=0.35, label="batch reward")
        ax1.plot(xs, _smooth(ys), label="smoothed")
    ax1.set(xlabel="RL step", ylabel="mean reward", title="training reward")
    ax1.legend(loc="lower right")
    for phase, style in (("sft", "o--"), ("rl", "o-")):
        pts = [r for r in evals if r.get("phase") == phase]
        if pts:
            ax2.plot([r["elapsed"] for r in pts], [r["accuracy"] for r in pts], style,
                     label=f"held-out ({phase})")
    ax2.set(xlabel="wall time (s)", ylabel="greedy accuracy", title="held-out accuracy",
            ylim=(0, 1))
    ax2.legend(loc="lower right")
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def _smooth(values: list[float], alpha: float = 0.1) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None else (1 - alpha) * acc + alpha * v
        out.append(acc)
    return out
