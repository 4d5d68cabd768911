"""Figures of model parallelism (notebook 06): a pipeline step's per-stage timeline, the bubble against its
formula, the activations each stage held, and the placement of tensor and pipeline parallelism on the lab."""
from __future__ import annotations

from kit.plots.style import axes

COLORS = {"F": "#4C72B0", "B": "#DD8452"}
NAMES = {"afab": "AFAB (GPipe)", "1f1b": "1F1B"}


def plot_pipeline_timeline(events: list[dict], title: str = "", ax=None):
    """Draw one step's events: a row per stage, a bar per forward (blue) and backward (orange), numbered."""
    ax, _ = axes(ax, figsize=(8, 2.5))
    stages = sorted({e["stage"] for e in events})
    for e in events:
        y = e["stage"]
        ax.barh(y, 1e3 * (e["t1"] - e["t0"]), left=1e3 * e["t0"], color=COLORS[e["kind"]], edgecolor="white",
                height=0.8)
        ax.text(1e3 * (e["t0"] + e["t1"]) / 2, y, str(e["mb"]), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first forward")
    ax.set_title(title or "one pipeline step: forward (blue) and backward (orange) per micro-batch")
    return ax


def plot_bubble(rows: list[dict], ax=None):
    """Draw the measured bubble (median, with the range over repeats) against (p-1)/(m+p-1), per p and schedule."""
    ax, _ = axes(ax, figsize=(6, 3.5))
    for i, p in enumerate(sorted({r["p"] for r in rows})):
        color = f"C{i}"
        for name, marker in (("afab", "o"), ("1f1b", "s")):
            rs = sorted((r for r in rows if r["p"] == p and r["schedule"] == name), key=lambda r: r["m"])
            if not rs:
                continue
            ms = [r["m"] for r in rs]
            lo = [r["bubble"] - r["bubble_range"][0] for r in rs]
            hi = [r["bubble_range"][1] - r["bubble"] for r in rs]
            ax.errorbar(ms, [r["bubble"] for r in rs], yerr=[lo, hi], fmt=marker, color=color, ms=4,
                        mfc="none" if name == "1f1b" else color, label=f"p={p} {NAMES[name]}")
        rs = sorted((r for r in rows if r["p"] == p), key=lambda r: r["m"])
        ax.plot([r["m"] for r in rs], [r["model"] for r in rs], "-", color=color, lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("idle share of the step")
    ax.set_title("pipeline bubble: measured (markers) vs (p-1)/(m+p-1) (lines)")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_peak_activations(rows: list[dict], p: int, ax=None):
    """Draw the most micro-batches' activations stage 0 held, against m, for AFAB and 1F1B at p stages."""
    ax, _ = axes(ax, figsize=(5, 3.5))
    for name, marker in (("afab", "o-"), ("1f1b", "s-")):
        rs = sorted((r for r in rows if r["p"] == p and r["schedule"] == name), key=lambda r: r["m"])
        ax.plot([r["m"] for r in rs], [r["peak_bytes"][0] / 1024 for r in rs], marker, label=NAMES[name])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("stage 0's saved activations at peak (KiB)")
    ax.set_title(f"activations held, p={p} stages")
    ax.legend()
    return ax


def plot_placement(x: dict, ax=None):
    """Draw step time and NIC bytes per step of each placement on the lab, measured against the model."""
    ax, _ = axes(ax, n=2, figsize=(9, 3.2))
    names = [r["placement"] for r in x["rows"]]
    pos = range(len(names))
    ax[0].bar([i - 0.2 for i in pos], [r["step_ms"] for r in x["rows"]], 0.4, label="measured")
    ax[0].bar([i + 0.2 for i in pos], [r["model_step_ms"] for r in x["rows"]], 0.4, label="model")
    ax[0].set_ylabel("step time (ms)")
    ax[1].bar([i - 0.2 for i in pos], [r["nic_tx"] / 1e6 for r in x["rows"]], 0.4, label="measured")
    ax[1].bar([i + 0.2 for i in pos], [r["model_tx"] / 1e6 for r in x["rows"]], 0.4, label="model")
    ax[1].set_ylabel("bytes sent per host NIC per step (MB)")
    for a in ax:
        a.set_xticks(list(pos), names, fontsize=8)
        a.legend(fontsize=8)
    return ax
