"""Metrics: one JSON object per line (train loss per log step, val loss/ppl per eval step)
and a PNG of the curves (when matplotlib is installed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


class MetricsLog:
    """Appends records to a JSONL file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate(self, step: int) -> None:
        """Drop the records past `step` (a resumed run writes them again), atomically."""
        if not self.path.is_file():
            return
        lines = [line for line in self.path.read_text().splitlines(keepends=True)
                 if line.strip() and json.loads(line)["step"] <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(lines))
        os.replace(tmp, self.path)


def read_metrics(path: str | Path) -> list[dict]:
    """Records in order; after a resume the re-run steps replace the earlier ones."""
    by_key = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            by_key[(r["split"], r["step"])] = r
    return sorted(by_key.values(), key=lambda r: (r["step"], r["split"]))


def plot_curves(jsonl: str | Path, png: str | Path, title: str = "", smooth: int = 10) -> None:
    """Train loss (raw and a running mean of `smooth` log points) and val loss against step.
    matplotlib is optional (the `train` extra): without it, one line says the PNG is skipped."""
    try:
        import matplotlib
    except ImportError:
        print(f"no {Path(png).name}: matplotlib is not installed (pip install 'specjax[train]')")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(jsonl)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    train = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
    val = [(r["step"], r["loss"]) for r in records if r["split"] == "val"]
    if train:
        steps, losses = np.array(train).T
        ax.plot(steps, losses, color="C0", alpha=0.3, label="train loss")
        k = min(smooth, len(losses))
        ax.plot(steps[k - 1:], np.convolve(losses, np.ones(k) / k, "valid"), color="C0",
                label=f"train loss, mean of {k} logs")
    if val:
        ax.plot(*zip(*val), "o-", color="C1", markersize=3, label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
