"""Figures of communication: data vs model parallelism, the parameter server, the ring, busbw, fusion
(notebooks 02, 03). One style: kit.plots.style."""
from __future__ import annotations

import numpy as np

from kit.plots.style import axes


# --- communication (ps, ring) ---
def plot_parallelism(ax=None):
    """Draw model parallelism (layers split over devices) next to data parallelism (batch split, replicas)."""
    from matplotlib.patches import FancyArrowPatch, Rectangle
    ax = axes(ax, 2, (10, 3.6))[0]
    colors = ["tab:blue", "tab:orange", "tab:green"]

    def box(a, x, y, w, h, text, color, alpha=0.35):
        a.add_patch(Rectangle((x, y), w, h, color=color, alpha=alpha))
        a.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)

    def arrow(a, p, q, color="k"):
        a.add_patch(FancyArrowPatch(p, q, arrowstyle="->", mutation_scale=10, color=color))

    a = ax[0]
    a.set_title("model parallelism: one batch, layers split")
    box(a, 0.05, 0.4, 0.12, 0.2, "batch", "grey")
    for d in range(3):
        box(a, 0.25 + d * 0.25, 0.3, 0.18, 0.4, f"layers {2 * d + 1}-{2 * d + 2}\ndevice {d}", colors[d])
        arrow(a, (0.17 + d * 0.25 + (0.01 if d else 0), 0.5), (0.25 + d * 0.25, 0.5))
    a.text(0.5, 0.12, "activations flow device to device", ha="center", fontsize=8)
    a = ax[1]
    a.set_title("data parallelism: batch split, model copied")
    box(a, 0.36, 0.82, 0.28, 0.14, "parameter server\n(average, update)", "tab:red")
    for d in range(3):
        x = 0.05 + d * 0.33
        box(a, x, 0.05, 0.22, 0.12, f"batch 1/{3} #{d}", "grey")
        box(a, x, 0.3, 0.22, 0.25, f"full model\nworker {d}", colors[d])
        arrow(a, (x + 0.11, 0.17), (x + 0.11, 0.3))
        arrow(a, (x + 0.07, 0.55), (0.42 + 0.04 * d, 0.82), "tab:red")
        arrow(a, (0.5 + 0.04 * (d - 1), 0.82), (x + 0.15, 0.55), "tab:blue")
    a.text(1.0, 0.72, "push gradients", ha="right", fontsize=8, color="tab:red")
    a.text(1.0, 0.65, "pull parameters", ha="right", fontsize=8, color="tab:blue")
    for a in ax:
        a.set_xlim(0, 1), a.set_ylim(0, 1), a.axis("off")
    return ax


def plot_ps_bytes(rows: list[dict], ax=None):
    """Plot measured bytes per step at one server against N, with the N K / k line; rows from `ps_bench.summarise`."""
    ax = axes(ax)[0]
    for k in sorted({r["k"] for r in rows}):
        rs = [r for r in rows if r["k"] == k]
        ns = [r["N"] for r in rs]
        ax.plot(ns, [r["server_in"] / 1e6 for r in rs], "o", ms=8, label=f"measured in, k={k}")
        ax.plot(ns, [r["server_out"] / 1e6 for r in rs], "x", ms=8, label=f"measured out, k={k}")
        ax.plot(ns, [r["N"] * r["K"] / k / 1e6 for r in rs], "-", lw=1, label=f"N K / k, k={k}")
    ax.set_xlabel("workers N"), ax.set_ylabel("MB per step at one server"), ax.legend(fontsize=7)
    return ax


def plot_ps_split(rows: list[dict], title: str = "step time", ax=None):
    """Plot worker step time split into compute and communication against N (one bar group per k)."""
    ax = axes(ax)[0]
    labels = [f"N={r['N']}\nk={r['k']}" for r in rows]
    comp = np.array([r["compute_ms"] for r in rows])
    comm = np.array([r["comm_ms"] for r in rows])
    ax.bar(labels, comp, label="compute")
    ax.bar(labels, comm, bottom=comp, label="communication (push + wait + pull)")
    ax.set_ylabel("ms per step (median)"), ax.set_title(title), ax.legend(fontsize=7)
    return ax


def plot_ps_model(ab: dict, rows: list[dict], ax=None):
    """Plot ping-pong timings with the alpha-beta fit, and predicted vs measured server exchange time."""
    ax = axes(ax, 2, (10, 3.6))[0]
    s = np.array(ab["sizes"], float)
    ax[0].loglog(s, np.array(ab["seconds"]) * 1e3, "o", label="ping-pong (one way)")
    ax[0].loglog(s, (ab["alpha"] + s / ab["B"]) * 1e3, "-", label="alpha + size / B")
    ax[0].set_xlabel("message bytes"), ax[0].set_ylabel("ms"), ax[0].legend(fontsize=7)
    ax[0].set_title(f"alpha = {ab['alpha'] * 1e6:.0f} us, B = {ab['B'] / 1e9:.2f} GB/s")
    pred = np.array([r["predicted_ms"] for r in rows])
    meas = np.array([r["measured_ms"] for r in rows])
    ax[1].loglog(pred, meas, "o")
    for r, p, m in zip(rows, pred, meas):
        ax[1].annotate(f"N{r['N']} k{r['k']} {r['K'] / 1e6:.1f}MB", (p, m), fontsize=6)
    lim = [min(pred.min(), meas.min()) * 0.7, max(pred.max(), meas.max()) * 1.4]
    ax[1].plot(lim, lim, "k--", lw=1, label="measured = predicted")
    ax[1].fill_between(lim, [v * 0.75 for v in lim], [v * 1.25 for v in lim], color="grey", alpha=0.2,
                       label="within 25%")
    ax[1].set_xlabel("predicted t_empty + 2 N K / min(B_max, N B), ms")
    ax[1].set_ylabel("measured at the workers, ms")
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    for axis in (ax[1].xaxis, ax[1].yaxis):                 # ticks at 1, 2, 5, 10, 20, ... ms, plainly written
        axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(ScalarFormatter()), axis.set_minor_formatter(NullFormatter())
    if ab.get("B_max"):
        ax[1].set_title("B_max = " + " / ".join(f"{b / 1e9:.2f}" for b in ab["B_max"].values()) + " GB/s ("
                        + " / ".join(str(h) for h in ab["B_max"]) + " servers)")
    ax[1].legend(fontsize=7)
    return ax


def plot_ps_extrapolation(alpha: float, B: float, K: float, ns, ks=(1, 8, 64), compute_s: float | None = None,
                          ax=None, o: float = 0.0, alpha_ring: float | None = None):
    """Plot predicted PS communication time per step, 2(alpha + (max(N, k) - 1) o) + 2 max(N/k, 1) K/B
    (`t_comm_ps`), against N for k servers, with the ring's 2(N-1)(a + K/(N B)) for comparison: a = alpha_ring, its
    own cost per message, when given (then the ring with the link's alpha dotted beside it)."""
    from kit.comm.costmodel import t_comm_ps, t_comm_ring
    ax = axes(ax, 1, (5.5, 3.8))[0]
    ns = np.asarray(ns)
    for k in ks:
        ax.loglog(ns, t_comm_ps(ns, K, alpha, B, k, o), "o-", label=f"PS, k={k} server(s)")
    if alpha_ring is not None and alpha_ring != alpha:
        ax.loglog(ns, t_comm_ring(ns, K, alpha_ring, B), "k.-", lw=1,
                  label=f"ring, {alpha_ring * 1e6:.0f} µs per message")
    ax.loglog(ns, t_comm_ring(ns, K, alpha, B), "k.:" if alpha_ring not in (None, alpha) else "k.-", lw=1,
              label=f"ring, the link's α ({alpha * 1e6:.0f} µs)" if alpha_ring not in (None, alpha) else "ring")
    if compute_s:
        ax.axhline(compute_s, color="k", ls="--", lw=1, label=f"compute per step ({compute_s:g} s)")
    ax.set_xlabel("workers N"), ax.set_ylabel("seconds per step (communication)")
    ax.set_title(f"K = {K / 1e6:.0f} MB, B = {B * 8 / 1e9:.0f} Gbit/s"), ax.legend(fontsize=7)
    return ax

def plot_ring_step(step, ax=None):
    """Draw one `kit.comm.ring_sim.Step`: workers on a circle, each a row of chunks coloured by how many inputs
    they sum."""
    import matplotlib.pyplot as plt
    n = step.contributions.shape[0]
    ax = axes(ax, 1, (4, 4))[0]
    cmap = plt.get_cmap("viridis", n)
    angle = np.pi / 2 - 2 * np.pi * np.arange(n) / n          # worker 0 on top, clockwise
    xy = np.c_[np.cos(angle), np.sin(angle)]
    w = min(0.9 / n, 0.25)
    for r in range(n):
        x0 = xy[r, 0] - n * w / 2
        for c in range(n):
            k = step.contributions[r, c]
            ax.add_patch(plt.Rectangle((x0 + c * w, xy[r, 1] - w / 2), w, w, color=cmap(k - 1), ec="white"))
            if n <= 8:
                ax.text(x0 + (c + .5) * w, xy[r, 1], str(c), ha="center", va="center", fontsize=7,
                        color="white" if k < n else "black")
        ax.text(xy[r, 0], xy[r, 1] + w, f"worker {r}", ha="center", va="bottom", fontsize=8)
    for src, dst, c in step.sends:
        a, b = xy[src] * 0.8, xy[dst] * 0.8
        ax.annotate("", b, a, arrowprops=dict(arrowstyle="->", color="tab:red", connectionstyle="arc3,rad=-0.25"))
        mid = (a + b) / 2 * 0.75
        if n <= 8:
            ax.text(*mid, f"c{c}", color="tab:red", fontsize=7, ha="center", va="center")
    ax.set(xlim=(-1.4, 1.4), ylim=(-1.4, 1.4), aspect="equal", title=step.title)
    ax.axis("off")
    return ax


def plot_ring_steps(steps: list, cols: int = 4, ax=None):
    """Draw every step as a small multiple (the static figure; renders anywhere, also under nbval); `ax`: an
    array of at least len(steps) axes, or None for a new figure of `cols` columns."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm
    n = steps[0].contributions.shape[0]
    if ax is None:
        rows = -(-len(steps) // cols)
        ax = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)[1]
    for a in np.ravel(ax)[len(steps):]:
        a.axis("off")
    for step, a in zip(steps, np.ravel(ax)):
        plot_ring_step(step, a)
    norm = BoundaryNorm(np.arange(0.5, n + 1), n)
    bar = np.ravel(ax)[0].figure.colorbar(ScalarMappable(norm, plt.get_cmap("viridis", n)), ax=ax, shrink=0.6,
                                          ticks=range(1, n + 1))
    bar.set_label("inputs summed in the chunk")
    return ax


def ring_step_slider(steps: list):
    """Show a slider to step through the ring (needs ipywidgets); fall back to the static figure without it."""
    import matplotlib.pyplot as plt
    try:
        import ipywidgets as widgets
    except ImportError:
        return plot_ring_steps(steps)

    def show(step):
        plot_ring_step(steps[step])
        plt.show()
    return widgets.interact(show, step=widgets.IntSlider(0, 0, len(steps) - 1, description="step"))

def plot_busbw(records: list[dict], ax=None):
    """Plot busbw against message size, one line per implementation, log-log; records from `ring_bench.measure`."""
    from kit.comm.costmodel import human
    ax = axes(ax, 1, (7, 4.5))[0]
    for impl in dict.fromkeys(r["impl"] for r in records):
        rs = [r for r in records if r["impl"] == impl]
        ax.plot([r["bytes"] for r in rs], [r["busbw"] / 1e9 for r in rs], "o-", label=impl)
    ticks = sorted({r["bytes"] for r in records})
    ax.set(xscale="log", yscale="log", xlabel="message size K", ylabel="busbw (GB/s) = K/t · 2(N-1)/N",
           title=f"allreduce over N = {records[0]['n']} ranks on this machine")
    ax.set_xticks(ticks, [human(t) for t in ticks], rotation=45)
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def plot_ring_model(alpha: float, B: float, K: int, measured: dict | None = None, ns=None, ax=None, o: float = 0.0):
    """Plot the model's time of ring vs one parameter server for N = 2 ... 1024, with measured points
    {impl: {N: s}}; o: the server's per-message overhead."""
    from kit.comm.costmodel import human, t_comm_ps, t_comm_ring
    ns = np.unique(np.geomspace(2, 1024, 60).astype(int)) if ns is None else np.asarray(ns)
    ax = axes(ax, 1, (7, 4.5))[0]
    ax.plot(ns, t_comm_ring(ns, K, alpha, B), label="ring model: 2(N-1)(α + K/(N·B))")
    ax.plot(ns, t_comm_ps(ns, K, alpha, B, o=o), label="one server: 2(α + (N-1)o) + 2N·K/B")
    for (impl, points), color, marker in zip((measured or {}).items(), ("C0", "C1"), ("o", "s")):
        ax.plot(list(points), list(points.values()), marker, color=color, mfc="none", mew=2, ms=9,
                label=f"measured: {impl}")
    ax.set(xscale="log", yscale="log", xlabel="workers N", ylabel="time per allreduce (s)",
           title=f"K = {human(K)}, α = {alpha * 1e6:.0f} µs, B = {B / 1e9:.2f} GB/s (measured here)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax

def plot_fusion(fusion: dict, count: int, ax=None):
    """Bar chart: time for `count` small allreduces, one by one vs fused, per implementation."""
    ax = axes(ax, 1, (8, 3.8))[0]
    names = list(fusion)
    x = np.arange(len(names))
    for i, mode in enumerate(("one_by_one", "fused")):
        ax.bar(x + (i - 0.5) * 0.38, [fusion[k][mode] * 1e3 for k in names], 0.38, label=mode.replace("_", " "))
    ax.set_xticks(x, [k.replace(" (", "\n(").replace(", ", ",\n") for k in names], fontsize=8)
    ax.set(yscale="log", ylabel="ms (log)", title=f"{count} small tensors: one by one vs fused")
    ax.legend()
    return ax

