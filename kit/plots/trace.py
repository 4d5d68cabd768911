"""Figures of torch.profiler traces (kit.trace): spans drawn per lane, one lane per span pattern, time in ms."""
from __future__ import annotations

from kit import trace as _trace
from kit.plots.style import axes as _axes

LOADING_LANES = {"ProfilerStep#": _trace.STEP, "DataLoader.__next__": _trace.LOADER, "compute": _trace.COMPUTE}
OVERLAP_LANES = {"backward ops": _trace.BACKWARD, "collectives": _trace.COLLECTIVE}
COLOURS = ("0.6", "tab:red", "tab:green", "tab:blue", "tab:orange", "tab:purple")


def _draw(ax, rows: list[tuple[str, list]], t0: float, colours=COLOURS):
    """Draw each (label, spans) row as a lane of bars from t0 (µs); return the lane labels, top to bottom."""
    for y, (label, found) in enumerate(rows):
        colour = colours[y % len(colours)] if isinstance(colours, tuple) else colours[label]
        ax.broken_barh([((s.start - t0) / 1e3, s.dur / 1e3) for s in found], (y - 0.4, 0.8), color=colour,
                       edgecolor="white", linewidth=0.5)          # white edges: back-to-back steps stay apart
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    return [label for label, _ in rows]


def plot_trace(trace, lanes: dict | None = None, ax=None, title: str = "", t0: float | None = None):
    """Draw one trace's spans, one lane per {label: name pattern} (default: step, DataLoader.__next__, compute);
    time in ms from `t0` (µs; default the first step's start, else the first span's)."""
    lanes = lanes or LOADING_LANES
    ax, _ = _axes(ax, 1, (10, 0.45 * len(lanes) + 1.2))
    rows = [(label, _trace.spans(trace, pattern)) for label, pattern in lanes.items()]
    if t0 is None:
        steps = _trace.spans(trace, _trace.STEP)
        t0 = steps[0].start if steps else _trace.origin([trace])
    _draw(ax, rows, t0)
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    return ax


def plot_traces(traces: dict, lanes: dict | None = None, ax=None, titles: dict | None = None):
    """Draw several traces (e.g. {"num_workers=0": trace, ...}), one Axes each, each from its own first step, on
    one time scale (the x range of the longest). Returns the Axes."""
    if ax is None:
        import matplotlib.pyplot as plt
        lanes_n = len(lanes or LOADING_LANES)
        ax = plt.subplots(len(traces), 1, figsize=(10, (0.45 * lanes_n + 1.0) * len(traces)), sharex=True,
                          squeeze=False)[1][:, 0]
    for a, (key, tr) in zip(ax, traces.items()):
        plot_trace(tr, lanes, ax=a, title=(titles or {}).get(key, str(key)))
    for a in ax[:-1]:
        a.set_xlabel("")
    ax[0].figure.tight_layout()
    return ax


def plot_ranks(traces: dict, lanes: dict | None = None, ax=None, title: str = ""):
    """Draw every rank's lanes (default: backward ops, collectives) on one Axes and one time axis, rank 0 on top:
    {rank: trace} recorded on one host (the ranks share its clock)."""
    lanes = lanes or OVERLAP_LANES
    ax, _ = _axes(ax, 1, (10, 0.4 * len(lanes) * len(traces) + 1.2))
    rows = [(f"rank {r}: {label}", _trace.spans(tr, pattern)) for r, tr in traces.items()
            for label, pattern in lanes.items()]
    colours = {f"rank {r}: {label}": COLOURS[1 + i % (len(COLOURS) - 1)] for r in traces
               for i, label in enumerate(lanes)}
    _draw(ax, rows, _trace.origin(traces.values()), colours)
    ax.set_xlabel("time (ms, one axis for all ranks)")
    ax.set_title(title)
    return ax
