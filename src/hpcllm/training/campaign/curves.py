"""Train and validation loss of an experiment, from its segments' engine logs.

Both engines print Megatron-LM's lines: ``iteration N/ T | consumed samples: ... | lm
loss: ...`` and ``validation loss at iteration N | lm loss value: ... | lm loss PPL: ...``.
A segment's log holds every attempt; an iteration logged twice (trained again after a
resume from an earlier checkpoint) keeps its last value, the one the checkpoint holds.
"""

from __future__ import annotations

import re
from pathlib import Path

from hpcllm.atomic import atomic_path

_VALID = re.compile(r"validation loss at iteration (\d+) \| lm loss value: ([-+.\dEe]+)")


def read_curves(engine_logs, seq_length: int) -> dict[str, list[tuple[float, float]]]:
    """``{"train": [(tokens, loss), ...], "valid": [...]}`` sorted by tokens."""
    from hpcllm.training.engines.log_lines import parse_log_lines

    train: dict[int, tuple[float, float]] = {}
    valid: dict[int, float] = {}
    samples_per_iteration: float | None = None
    for path in engine_logs:
        path = Path(path)
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for row in parse_log_lines(text):
            if "lm loss" in row and "consumed samples" in row:
                train[row["iteration"]] = (row["consumed samples"], row["lm loss"])
                samples_per_iteration = row["consumed samples"] / row["iteration"]
        for m in _VALID.finditer(text):
            valid[int(m.group(1))] = float(m.group(2))
    per_iteration = (samples_per_iteration or 0.0) * seq_length
    return {
        "train": sorted((samples * seq_length, loss) for samples, loss in train.values()),
        "valid": sorted((it * per_iteration, loss) for it, loss in valid.items()),
    }


def plot_loss_curve(name: str, engine_logs, seq_length: int, out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read_curves(engine_logs, seq_length)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style in (("train", "-"), ("valid", "o--")):
        if curves[key]:
            x, y = zip(*curves[key])
            ax.plot(x, y, style, label="validation" if key == "valid" else "train")
    if not curves["train"]:
        ax.text(0.5, 0.5, "no iterations logged", ha="center", transform=ax.transAxes)
    ax.set_xlabel("tokens")
    ax.set_ylabel("lm loss")
    ax.set_title(f"{name}: loss against tokens")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
