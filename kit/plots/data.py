"""Figures of data loading and MNIST training (notebooks 01, 04): the monitor's timeline, worker sweeps,
histories, throughput, Horovod's timeline, elastic runs, lab scaling. One style: kit.plots.style."""
from __future__ import annotations

import re

import numpy as np

from kit.plots.style import axes as _axes


def plot_monitor(mon, ax=None, label: str = "", window: float = 0.05):
    """Draw a Monitor's timeline: compute (green) and wait (red) intervals, busy % per window, NVML if any."""
    ax, _ = _axes(ax, 1, (10, 2.2))
    ax.broken_barh([(s.ready, s.compute) for s in mon.steps], (0, 8), color="tab:green")
    ax.broken_barh([(s.start, s.wait) for s in mon.steps], (0, 8), color="tab:red")
    t, u = mon.utilization(window)
    ax.plot(t, u, color="black", lw=1, label=f"busy % per {window * 1e3:.0f} ms")
    if mon.samples:
        ts, us, _ = zip(*mon.samples)
        ax.plot(ts, us, color="tab:purple", lw=1, label="NVML GPU utilization %")
    st = mon.stats()
    ax.set(ylim=(0, 108), ylabel="%", xlabel="time (s)",
           title=f"{label}  busy {100 * st['busy']:.0f}%, mean wait {1e3 * st['wait']:.1f} ms")
    ax.legend(loc="lower right", fontsize=7)
    return ax


def plot_sweep(rows: list[dict], ax=None, title: str = ""):
    """Plot throughput and busy % vs workers, and predicted vs measured step time if present (2 or 3 Axes)."""
    n = 3 if "predicted_ms" in rows[0] else 2
    axes, created = _axes(ax, n, (4.2 * n, 3.2))
    w = [r["workers"] for r in rows]
    axes[0].plot(w, [r["samples_per_s"] for r in rows], "o-")
    axes[0].set(xlabel="workers", ylabel="samples/s", title=f"{title} throughput".strip())
    axes[1].plot(w, [100 * r["busy"] for r in rows], "o-", color="tab:green")
    axes[1].axhline(85, ls=":", color="gray")
    axes[1].set(xlabel="workers", ylabel="busy %", ylim=(0, 105), title="accelerator busy")
    if n == 3:
        axes[2].plot(w, [r["step_ms"] for r in rows], "o", label="measured")
        axes[2].plot(w, [r["predicted_ms"] for r in rows], "x--", label="max(t_load/W_eff, t_compute)")
        axes[2].set(xlabel="workers", ylabel="ms per step", ylim=(0, None), title="model vs measurement")
        axes[2].legend(fontsize=7)
    if created:
        axes[0].figure.tight_layout()
    return axes


def plot_timelines(mons: dict, ax=None, labels: dict | None = None, seconds: float | None = None):
    """Draw one Monitor timeline per run, stacked on a shared time axis (first `seconds` of each); one Axes each."""
    if ax is None:
        import matplotlib.pyplot as plt
        ax = plt.subplots(len(mons), 1, figsize=(10, 2.0 * len(mons)), sharex=True, squeeze=False)[1][:, 0]
    for a, (k, mon) in zip(ax, mons.items()):
        plot_monitor(mon, ax=a, label=(labels or {}).get(k, f"num_workers={k}"))
        if seconds:
            a.set_xlim(mon.steps[0].start, mon.steps[0].start + seconds)
    ax[0].figure.tight_layout()
    return ax


def plot_kinds(rows_by_name: dict, ax=None):
    """Plot throughput (measured dots, model dashes) and busy % vs workers for several pipelines (2 Axes)."""
    axes, created = _axes(ax, 2, (10, 3.4))
    for name, rows in rows_by_name.items():
        w = [r["workers"] for r in rows]
        line, = axes[0].plot(w, [r["samples_per_s"] for r in rows], "o-", label=f"{name} (measured)")
        if "predicted_ms" in rows[0]:
            model = [r["samples_per_s"] * r["step_ms"] / r["predicted_ms"] for r in rows]
            axes[0].plot(w, model, "x--", color=line.get_color(), label=f"{name} (model)")
        axes[1].plot(w, [100 * r["busy"] for r in rows], "o-", color=line.get_color(), label=name)
    axes[0].set(xlabel="num_workers", ylabel="samples/s", title="throughput", ylim=(0, None))
    axes[1].set(xlabel="num_workers", ylabel="busy %", title="accelerator busy", ylim=(0, 105))
    axes[0].legend(fontsize=7)
    if created:
        axes[0].figure.tight_layout()
    return axes


def plot_history(history: list[dict], ax=None, title: str = ""):
    """Plot loss and accuracy (train and test) per epoch (2 Axes)."""
    axes, created = _axes(ax, 2, (10, 3.2))
    epochs = [h["epoch"] for h in history]
    for a, name in zip(axes, ("loss", "accuracy")):
        a.plot(epochs, [h[name] for h in history], "o-", label="train")
        a.plot(epochs, [h[f"val_{name}"] for h in history], "s--", label="test")
        a.set(xlabel="epoch", ylabel=name)
        a.legend()
    axes[0].figure.suptitle(title)
    if created:
        axes[0].figure.tight_layout()
    return axes


def plot_throughput(runs: dict[str, list[float]], ax=None):
    """Plot samples/s per repeat for each setting (e.g. {'1 worker': [...], '2 workers': [...]}), bar = median."""
    ax, _ = _axes(ax, 1, (6, 3.2))
    for i, (name, values) in enumerate(runs.items()):
        ax.scatter([i] * len(values), values, alpha=0.7)
        ax.hlines(np.median(values), i - 0.25, i + 0.25, color="k")
    ax.set_xticks(range(len(runs)), list(runs))
    ax.set_ylabel("samples/s (whole job)")
    ax.set_ylim(0, None)
    ax.set_title("throughput per run (bar = median)")
    return ax


def plot_accuracy(histories: dict[str, list[dict]], ax=None, dataset: str = ""):
    """Plot test accuracy per epoch for several runs (e.g. {'2 workers': history, '1 process': history})."""
    ax, _ = _axes(ax, 1, (6, 3.2))
    for name, h in histories.items():
        ax.plot([r["epoch"] for r in h], [r["val_accuracy"] for r in h], "o-", label=name)
    ax.set(xlabel="epoch", ylabel=f"test accuracy ({dataset})".replace(" ()", ""))
    ax.legend()
    return ax


def plot_timeline(intervals: list[dict], ax=None, start: float = 0.0, seconds: float | None = None):
    """Draw a Horovod timeline's allreduce phases per gradient tensor as a Gantt chart (colour = phase)."""
    from matplotlib import colormaps
    end = start + seconds if seconds else float("inf")
    rows = [r for r in intervals if r["end"] >= start and r["start"] <= end and r["tensor"].startswith("grad")]
    tensors = sorted({r["tensor"] for r in rows}, key=lambda t: [int(d) for d in re.findall(r"\d+", t)] or [0])
    phases = sorted({r["phase"] for r in rows}, key=lambda p: (p.startswith("NEGOTIATE") is False, p))
    colours = dict(zip(phases, colormaps["tab10"].colors))
    ax, _ = _axes(ax, 1, (10, 0.35 * len(tensors) + 1.5))
    for r in rows:
        y, h = tensors.index(r["tensor"]), 0.8 if r["depth"] == 0 else 0.4
        ax.broken_barh([(1e3 * r["start"], 1e3 * (r["end"] - r["start"]))], (y - h / 2, h),
                       color=colours[r["phase"]], label=r["phase"])
    handles = {h.get_label(): h for h in ax.collections}
    ax.legend(handles.values(), handles.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(range(len(tensors)), tensors)
    ax.set_xlabel("time (ms)")
    ax.set_title("Horovod timeline: allreduce phases per gradient tensor (rank 0's view)")
    return ax


def plot_elastic(run: dict, ax=None):
    """Draw an elastic run (kit.mnist.elastic.run_on_lab): world size and batches done over time, link cut/restore."""
    ax, _ = _axes(ax, 1, (9, 3.4))
    batches = [e for e in run["events"] if e["event"] == "batch"]
    t = [e["t"] - run["t0"] for e in batches]
    ax.plot(t, [e["size"] for e in batches], ".", ms=3, color="C0", label="world size (workers)")
    for i, p in enumerate(run.get("pauses", [])):
        ax.axvspan(p["t"] - run["t0"], p["t"] + p["seconds"] - run["t0"], color="0.85",
                   label="no batch finished" if i == 0 else None)
    ax.set(xlabel="time since training started (s)", ylabel="workers", ylim=(0, len(run["hosts"]) + 0.5))
    ax.yaxis.get_major_locator().set_params(integer=True)
    done = ax.twinx()
    done.plot(t, [e["done"] for e in batches], ".", ms=2, color="C1", label="batches done")
    done.set_ylabel("batches done", color="C1")
    for when, what, c in ((run["t_cut"], f"{run['cut']}'s link cut", "C3"),
                          (run["t_restore"], f"{run['cut']}'s link restored", "C2")):
        ax.axvline(when - run["t0"], color=c, ls="--")
        ax.text(when - run["t0"], 0.3, " " + what, color=c, fontsize=8)
    ax.set_title(f"elastic Horovod on {len(run['hosts'])} lab hosts, state committed every "
                 f"{run['commit_every']} batches")
    ax.legend(loc="lower right", fontsize=8)
    return ax


def plot_lab_scaling(result: dict, ax=None):
    """Draw kit.mnist.lab.scaling's runs: samples/s per (link rate, hosts); each step split into the allreduce
    (Horovod timeline) and the rest. Returns the two Axes."""
    ax, _ = _axes(ax, 2, (10, 3.4))
    rates = list(dict.fromkeys(r["rate"] for r in result["runs"]))
    sizes = list(dict.fromkeys(r["n"] for r in result["runs"]))
    width = 0.8 / len(rates)
    for i, rate in enumerate(rates):
        at = {r["n"]: r for r in result["runs"] if r["rate"] == rate}      # a (hosts, rate) pair may be left out
        xs = [j + (i - (len(rates) - 1) / 2) * width for j, n in enumerate(sizes) if n in at]
        rows = [at[n] for n in sizes if n in at]
        ax[0].bar(xs, [r["samples_per_s"] for r in rows], width, label=rate)
        ax[1].bar(xs, [1e3 * (r["step_s"] - r["allreduce_s"]) for r in rows], width, color="0.75",
                  label="rest of the step" if i == 0 else None)
        ax[1].bar(xs, [1e3 * r["allreduce_s"] for r in rows], width, bottom=[1e3 * (r["step_s"] - r["allreduce_s"])
                  for r in rows], label=f"allreduce at {rate}")
        ax[1].hlines([1e3 * (r["step_s"] - r["allreduce_s"] + r["link_s"]) for r in rows],
                     [x - width / 2 for x in xs], [x + width / 2 for x in xs], colors="k",
                     label="the wire alone: 2(N−1)/N·K/B" if i == 0 else None)
    ax[0].axhline(result["one_worker"]["samples_per_s"], color="k", ls="--", lw=1, label="1 worker")
    for a, ylabel in zip(ax, ("samples/s (job)", "ms per step")):
        a.set_xticks(range(len(sizes)), [f"{n} hosts" for n in sizes])
        a.set_ylabel(ylabel)
        a.legend(fontsize=8)
    ax[0].set_title("MNIST CNN, 1 worker per lab host")
    ax[1].set_title("where a step's time goes (Horovod timeline)")
    return ax
