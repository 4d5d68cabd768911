"""Notebook 05's figures (kit.ddp): the schemes' step times and bucket sweep, the lab runs, one overlapped step."""
import matplotlib.pyplot as plt

from kit.comm import costmodel


def plot_schemes(x: dict, axes=None):
    """Left: step time of every scheme; right: the bucket sweep, measured, against the α–β model."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    rows = x["rows"]
    local = next(r for r in rows if r["scheme"] == "local")["step_ms"]
    ax = axes[0]
    ax.barh([r["label"] for r in rows][::-1], [r["step_ms"] for r in rows][::-1], color="tab:blue")
    ax.set_xlabel("ms per step (median)")
    ax.set_title(f"one training step, N = {x['N']} engines (gloo, loopback)")
    ax = axes[1]
    buckets = [r for r in rows if r["scheme"].startswith("buckets:")]
    sizes = [int(r["scheme"].split(":")[1]) for r in buckets]
    ax.plot(sizes, [r["step_ms"] for r in buckets], "o-", label="measured step")
    if all("model_comm_ms" in r for r in buckets):
        ax.plot(sizes, [local + r["model_comm_ms"] for r in buckets], "s--",
                label="compute only + α–β model of the allreduces")
    ax.axhline(local, color="grey", lw=1, label="compute only")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [costmodel.human(s) for s in sizes])
    ax.set_xlabel("bucket size")
    ax.set_ylabel("ms per step")
    ax.legend(fontsize=8)
    return axes


def plot_overlap_step(x: dict, ax=None):
    """The median overlapped step (`timeline`): compute on the top lane, each gradient's allreduce from launch to
    done below it, and the same allreduces alone (no compute) from the first launch, at the bottom."""
    t, ar = x["timeline"], x["timeline"]["allreduces"]
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.8))
    top = len(ar) + 1
    for (a, b), name, color in zip([(0, t["forward"]), (t["forward"], t["backward"]), (t["backward"], t["summed"]),
                                    (t["summed"], t["end"])],
                                   ["forward", "backward", "waiting for the sums", "optimizer step"],
                                   ["C0", "C1", "0.85", "C2"]):
        ax.broken_barh([(a, b - a)], (top - 0.4, 0.8), color=color, label=name)
    for i, r in enumerate(ar):
        ax.broken_barh([(r["launched"], r["done"] - r["launched"])], (top - 1 - i - 0.35, 0.7), color="C3",
                       label="an allreduce: launched → done (queued, then on the wire)" if i == 0 else None)
    ax.broken_barh([(ar[0]["launched"], x["paired"]["comm"]["ms"])], (-0.4, 0.8), facecolor="white", edgecolor="k",
                   hatch="//", label="the same allreduces alone (median)")
    ax.set_yticks([top, *range(top - 1, 0, -1), 0],
                  ["compute", *[costmodel.human(r["bytes"]) for r in ar], "alone"], fontsize=7)
    ax.set_xlabel("ms from the start of the step")
    ax.set_title(f"one overlapped step at {x['rate']}, N = {x['N']} (rank {t['rank']}, the median step)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def plot_ddp_lab(xs: list[dict], ax=None):
    """Step time per scheme at each N, with the compute alone and the allreduces alone as the two bounds."""
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.8))
    names = [r["scheme"] for r in xs[0]["rows"] if r["scheme"] != "local"]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([j + i * width for j in range(len(xs))], [_row(x, name)["step_ms"] for x in xs], width,
               label=_row(xs[0], name)["label"])
    for j, x in enumerate(xs):
        span = (j - width / 2, j + 0.8 - width / 2)
        ax.plot(span, [x["paired"]["comm"]["ms"]] * 2, "k--", lw=1.5, label="allreduces alone" if j == 0 else None)
        ax.plot(span, [_row(x, "local")["step_ms"]] * 2, "k:", lw=1.5,
                label="compute alone" if j == 0 else None)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(xs))], [f"N = {x['N']}" for x in xs])
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"notebook 05's schemes on lab hosts at {xs[0]['rate']}")
    ax.legend(fontsize=7, ncol=2)
    return ax


def _row(x: dict, scheme: str) -> dict:
    return next(r for r in x["rows"] if r["scheme"] == scheme)
