"""Figures and summary of `kit.netlab.exchange` runs (notebooks 02, 03 and `python -m kit.bench network`).

    plot_network(x, K)         three panels: time vs N with the model's lines, busbw vs size with the link rate,
                               bytes per host vs N from the NIC counters
    ratios(x, K)               the numbers issue 12's targets ask for (measured/model, N=max vs N=min, busbw/link,
                               counted/model bytes)
    readme_tables(x, K)        the README's tables of a run (tests/test_packaging checks the README against them)
"""
from __future__ import annotations

import numpy as np

from kit.comm.costmodel import human, ring_bytes, t_comm_ps, t_comm_ring
from kit.env import cpu_cores
from kit.plots.style import LABELS

STYLE = {"ring": ("tab:blue", "o"), "ps": ("tab:red", "s"), "byteps": ("tab:green", "^"),
         "torch": ("tab:purple", "v"), "horovod": ("tab:orange", "D"), "horovod_mpi": ("tab:brown", "P")}


def rows(x: dict, impl: str, K: int | None = None, N: int | None = None) -> list[dict]:
    """Return the rows of `impl` (at K bytes and/or N hosts when given), ordered by N then K."""
    return sorted([r for r in x["rows"] if r["impl"] == impl and K in (None, r["bytes"]) and N in (None, r["N"])],
                  key=lambda r: (r["N"], r["bytes"]))


def alpha_beta(x: dict) -> tuple[float, float]:
    """Return the run's alpha and B: its one link measurement, or (older runs, one lab per N) their medians."""
    if "link" in x:
        return x["link"]["alpha"], x["link"]["B"]
    links = list(x["links"].values())
    return float(np.median([v["alpha"] for v in links])), float(np.median([v["B"] for v in links]))


def link_rate(x: dict) -> float:
    """Return the rate every link was set to, in bytes/s."""
    return (x.get("link") or next(iter(x["links"].values())))["rate_bytes_per_s"]


def overhead(x: dict) -> float:
    """Return the PS's per-message overhead o fitted by the run (0 for runs without a latency fit)."""
    return max((x.get("latency") or {}).get("o") or 0.0, 0.0)


def plot_times(x: dict, K: int, ax, log: bool = False):
    """Time per allreduce at K bytes vs N: measured points, the α–β model's lines (ring and one-server PS); `log`:
    both axes logarithmic (a flat ring and a PS growing ~N read as slopes 0 and 1)."""
    alpha, B = alpha_beta(x)
    o = overhead(x)
    ns = np.arange(2, max(x["ns"]) + 1)
    ax.plot(ns, 1e3 * t_comm_ring(ns, K, alpha, B), "-", color="tab:blue", lw=1,
            label="model: ring 2(N-1)(α + K/(N·B))")
    ax.plot(ns, 1e3 * t_comm_ps(ns, K, alpha, B, o=o), "-", color="tab:red", lw=1,
            label=f"model: one server 2(α + (N-1)o) + 2N·K/B, o={o * 1e6:.0f} µs")
    for impl, (color, marker) in STYLE.items():
        pts = rows(x, impl, K)
        if pts:
            ax.plot([r["N"] for r in pts], [1e3 * r["seconds"] for r in pts], marker, color=color,
                    ls="none" if impl in ("ring", "ps") else ":", label=LABELS[impl])
    ax.set(xlabel="N (hosts, one worker each)", ylabel="ms per allreduce", xticks=x["ns"],
           title=f"K = {human(K)}, links {x['rate']} (α={alpha * 1e6:.0f} µs, B={B / 1e6:.0f} MB/s)")
    if log:
        ax.set(xscale="log", yscale="log")
        ax.set_xticks(x["ns"], [str(n) for n in x["ns"]])
        ax.minorticks_off()
    ax.legend(fontsize=7)


def plot_busbw(x: dict, N: int, ax):
    """Bus bandwidth vs message size at N hosts, with the link's rate drawn as the physical limit."""
    for impl, (color, marker) in STYLE.items():
        pts = rows(x, impl, N=N)
        if pts and impl != "ps":
            ax.plot([r["bytes"] for r in pts], [r["busbw"] / 1e6 for r in pts], marker + "-", color=color,
                    label=LABELS[impl])
    ax.axhline(link_rate(x) / 1e6, color="k", ls="--", lw=1, label=f"link rate {x['rate']} (the limit)")
    ax.set(xscale="log", xlabel="message size (bytes)", ylabel="busbw (MB/s)", title=f"busbw at N = {N}")
    ax.set_ylim(0, 1.15 * link_rate(x) / 1e6)
    ax.legend(fontsize=7, loc="lower right")


def plot_bytes(x: dict, K: int, ax):
    """Bytes each host sent per allreduce of K bytes (NIC counters) vs N, with 2(N-1)/N·K and N·K."""
    ns = np.arange(2, max(x["ns"]) + 1)
    ax.plot(ns, ring_bytes(ns, K) / 2**20, "-", color="tab:blue", lw=1, label="model: 2(N-1)/N·K")
    ax.plot(ns, ns * K / 2**20, "-", color="tab:red", lw=1, label="model: N·K (server, in and out)")
    ring, ps = rows(x, "ring", K), rows(x, "ps", K)
    ax.plot([r["N"] for r in ring], [np.mean(r["tx"]) / 2**20 for r in ring], "o", color="tab:blue",
            label="ring, each host sent (counter)")
    ax.plot([r["N"] for r in ps], [r["tx"][0] / 2**20 for r in ps], "s", color="tab:red",
            label="PS server sent (counter)")
    ax.plot([r["N"] for r in ps], [r["rx"][0] / 2**20 for r in ps], "x", color="tab:red",
            label="PS server received (counter)")
    ax.set(xlabel="N", ylabel="MB per allreduce", xticks=x["ns"], title=f"bytes on each NIC, K = {human(K)}")
    ax.legend(fontsize=7)


def plot_network(x: dict, K: int, ax=None):
    """Draw the three panels of the lesson on `ax` (three axes) or a new figure; return the axes."""
    if ax is None:
        import matplotlib.pyplot as plt
        ax = plt.subplots(1, 3, figsize=(15, 4.2))[1]
    plot_times(x, K, ax[0])
    plot_busbw(x, max(x["ns"]), ax[1])
    plot_bytes(x, K, ax[2])
    return ax


def bytes_error(x: dict, K: int | None = None) -> dict:
    """Return the largest counted/model - 1 of the bytes per host (at K bytes, or over every size): ring and
    co-located servers' hosts (sent and received), PS server (sent and received, model N·K), PS workers (model K).
    Counted is each NIC's payload (its bytes less 66 of headers a packet) where the run counted packets, else its
    bytes: what is above the model is then the per-call barriers and resent segments (or, in bytes, also headers and
    ACKs)."""
    def sent(r):
        return r.get("tx_payload", r["tx"]), r.get("rx_payload", r["rx"])
    err = {}
    for impl in ("ring", "byteps"):
        got = [b / r["model_bytes"] - 1 for r in rows(x, impl, K) for b in sum(sent(r), [])]
        err[impl] = max(got, key=abs) if got else None
    server = [b / r["model_server_bytes"] - 1 for r in rows(x, "ps", K) for b in (sent(r)[0][0], sent(r)[1][0])]
    workers = [b / r["model_bytes"] - 1 for r in rows(x, "ps", K) for b in sent(r)[0][1:] + sent(r)[1][1:]]
    err["ps_server"] = max(server, key=abs) if server else None
    err["ps_workers"] = max(workers, key=abs) if workers else None
    return err


def ratios(x: dict, K: int) -> dict:
    """Return the numbers of issue 12's targets at K bytes: measured/model per N (ring, ps), time at the largest
    N over the smallest (with the model's ratio), busbw/link rate at the largest N, counted/model bytes."""
    lo, hi = min(x["ns"]), max(x["ns"])
    alpha, B = alpha_beta(x)
    out = {"K": K, "measured_over_model": {i: {r["N"]: r["seconds"] / r["model_s"] for r in rows(x, i, K)}
                                           for i in ("ring", "ps")}}
    t = {i: {r["N"]: r["seconds"] for r in rows(x, i, K)} for i in ("ring", "ps")}
    o = overhead(x)
    model = {"ring": float(t_comm_ring(hi, K, alpha, B) / t_comm_ring(lo, K, alpha, B)),
             "ps": float(t_comm_ps(hi, K, alpha, B, o=o) / t_comm_ps(lo, K, alpha, B, o=o))}
    out["scaling"] = {i: {"measured": t[i][hi] / t[i][lo], "model": model[i], "ideal": ideal}
                      for i, ideal in (("ring", 2 * (hi - 1) / hi / (2 * (lo - 1) / lo)), ("ps", hi / lo))
                      if hi in t[i] and lo in t[i] and hi != lo}
    out["busbw_over_link"] = {i: rows(x, i, K, hi)[0]["busbw"] / link_rate(x)
                              for i in ("ring", "byteps", "torch", "horovod", "horovod_mpi") if rows(x, i, K, hi)}
    out["ring_vs_torch"] = {n: [rows(x, i, K, n)[0]["busbw"] / link_rate(x) for i in ("ring", "torch")]
                            for n in x["ns"] if rows(x, "ring", K, n) and rows(x, "torch", K, n)}
    out["bytes_error"] = bytes_error(x, K)
    out["bytes_error_any_size"] = bytes_error(x)
    out["all_correct"] = all(r["ok"] for r in x["rows"])
    return out


def summary(x: dict, K: int, seconds: float) -> str:
    """Return the benchmark's one-line summary: its checks on `ratios` (measured/model within 0.8–1.2 at every N,
    the growth from the smallest to the largest N within 25% of the model's, the ring's busbw at least 85% of the
    link, NIC bytes within 2% of the model's, every sum correct)."""
    from kit.checks import Check, summary_line
    from kit.comm import lessons
    r, lo, hi = ratios(x, K), min(x["ns"]), max(x["ns"])
    cs = [Check(f"{i} measured/model (every N)", measured=f"{min(d.values()):.2f}–{max(d.values()):.2f}",
                bound="0.8–1.2", held=all(0.8 <= v <= 1.2 for v in d.values()))
          for i, d in r["measured_over_model"].items() if d]
    cs += [Check(f"{i} t(N={hi}) / t(N={lo})", measured=v["measured"], bound=f"{v['model']:.2f} ± 25%",
                 held=abs(v["measured"] / v["model"] - 1) <= 0.25, unit="×") for i, v in r["scaling"].items()]
    if "ring" in r["busbw_over_link"]:
        cs.append(Check(f"ring busbw / link at N={hi}", measured=r["busbw_over_link"]["ring"], bound="≥ 0.85",
                        held=r["busbw_over_link"]["ring"] >= 0.85))
    cs += [Check(f"{i} NIC bytes / model − 1", measured=v, bound="± 0.02", held=abs(v) <= 0.02)
           for i, v in r["bytes_error"].items() if v is not None]
    cs.append(lessons.equal_check("sums correct", {str(i): row["ok"] for i, row in enumerate(x["rows"])}))
    return (f"network {x['rate']}, {human(K)}, N={'/'.join(map(str, x['ns']))}, {seconds:.0f} s; "
            f"checks {summary_line(cs)}")


SHORT = {"ring": "kit ring", "byteps": "PS, k=N co-located", "torch": "torch.distributed",
         "horovod": "Horovod (Gloo)", "horovod_mpi": "Horovod (MPI)", "ps": "PS, one server"}


def readme_tables(x: dict, K: int, small_reps: int | None = None) -> str:
    """Return docs/benchmarks/network.md for a run: the link (ping-pong, bare socket, stream), every row at K bytes,
    then the smallest messages (timed `small_reps` times)."""
    cores = x.get("machine", {}).get("cpu_cores") or cpu_cores()      # a fresh run: this machine
    small = min(x["sizes"])
    out = [f"Links {x['rate']} each way; {cores} cores; run took {x['seconds']:.0f} s; {x['reps']} timed calls per "
           "point" + (f" ({human(small)}: {small_reps})" if small_reps and small_reps != x["reps"] else "") + "."]
    out += _link_rows(x)
    out += ["", f"At K = {human(K)}:", "",
            "| implementation | N | ms measured | ms model | measured/model | busbw (MB/s) | busbw/link "
            "| NIC sent per host / model |", "|---|---|---|---|---|---|---|---|"]
    for impl in SHORT:
        for r in rows(x, impl, K):
            row = (f"| {SHORT[impl]} | {r['N']} | {r['seconds'] * 1e3:.0f} | {r['model_s'] * 1e3:.0f} | "
                   f"{r['seconds'] / r['model_s']:.2f} | ")
            if impl == "ps":
                row += (f"– | – | server {r['tx'][0] / r['model_server_bytes']:.4f} (N·K), workers "
                        f"{np.mean(r['tx'][1:]) / r['model_bytes']:.4f} (K) |")
            else:
                row += (f"{r['busbw'] / 1e6:.0f} | {r['busbw'] / link_rate(x):.0%} | "
                        f"{np.mean(r['tx']) / r['model_bytes']:.4f} |")
            out.append(row)
    return "\n".join(out + small_k(x, small_reps or x["reps"]))


def _link_rows(x: dict) -> list[str]:
    """Return the link's table: one measurement for every N (median and the rounds' range, the bare socket's α), or,
    for runs before 2026-12-06 (a lab per N, no "link"), one row per N."""
    us = lambda a: f"{a * 1e6:.0f}"                                                    # noqa: E731
    if "link" not in x:
        return ["", "| N | α (µs) | B ping-pong (MB/s) | stream h1→h2 (MB/s) |", "|---|---|---|---|"] + [
            f"| {n} | {us(v['alpha'])} | {v['B'] / 1e6:.1f} | {v['stream']['h1->h2'] / 1e6:.1f} |"
            for n, v in sorted(x["links"].items(), key=lambda kv: int(kv[0]))]
    v = x["link"]
    rng = lambda key: "–".join(map(us, v.get(f"{key}_range", [v.get(key, 0)] * 2)))    # noqa: E731
    socket = "socket_alpha" in v
    return [f"One link measurement for every N ({v.get('rounds', 1)} rounds; median, then the rounds' range):", "",
            "| α ping-pong (µs) | α bare socket (µs) | B ping-pong (MB/s) | stream h1→h2 (MB/s) |", "|---|---|---|---|",
            f"| {us(v['alpha'])} ({rng('alpha')}) | "
            + (f"{us(v['socket_alpha'])} ({rng('socket_alpha')})" if socket else "not measured")
            + f" | {v['B'] / 1e6:.1f} | {v['stream']['h1->h2'] / 1e6:.1f} |"]


def small_k(x: dict, reps: int) -> list[str]:
    """Return the table of the run's smallest messages (timed `reps` times: kit.netlab.exchange.SMALL_REPS): ms per
    step of each implementation run, the ring's time per message in sequence (step / 2(N−1)), and whether the
    model with the ping-pong's α for every message puts the ring behind one server there ((N−2)·α > (N−1)·o)."""
    K, lat = min(x["sizes"]), x.get("latency") or {}
    at = {impl: {r["N"]: r for r in rows(x, impl, K)} for impl in SHORT}
    at = {impl: v for impl, v in at.items() if v}
    if K == max(x["sizes"]) or not {"ps", "ring"} <= set(at) or lat.get("o") is None:
        return []
    a, o = alpha_beta(x)[0], max(lat["o"], 0.0)
    out = ["", f"At K = {human(K)}, median of {reps} calls; α = {a * 1e6:.0f} µs, o = {o * 1e6:.0f} µs:", "",
           "| N | " + " | ".join(f"{SHORT[i]} (ms)" for i in at) + " | ring / 2(N−1) (µs) | (N−2)·α > (N−1)·o |",
           "|---" * (len(at) + 3) + "|"]
    for n in sorted(at["ring"]):
        ms = " | ".join(f"{at[i][n]['seconds'] * 1e3:.2f}" if n in at[i] else "–" for i in at)
        per = f"{at['ring'][n]['seconds'] / (2 * (n - 1)) * 1e6:.0f}" if n > 1 else "–"
        out.append(f"| {n} | {ms} | {per} | {(n - 2) * a > (n - 1) * o} |")
    return out
