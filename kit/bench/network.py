"""python -m kit.bench network: the ring and the parameter server on emulated hosts (`kit.netlab.exchange`), at
the benchmark's size: results/network.json, network.png and the summary line.

The experiment (one lab, its link measured once, every implementation at every N and size, the latency fit) is
`kit.netlab.exchange.experiment`, the one notebooks 02 and 03 call; the figures are `kit.plots.network`.
"""
from __future__ import annotations

from kit.netlab import exchange

SETTINGS = {   # hosts N, message sizes (the smallest for the latency fit), timed calls per size
    "tiny": dict(ns=(2,), sizes=(4 << 10, 256 << 10), reps=1),
    "quick": dict(ns=(2, 4), sizes=(4 << 10, 4 << 20, 64 << 20), reps=2),
    "full": dict(ns=(2, 4, 8), sizes=(4 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20), reps=3),
}


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """Run every implementation at N = 2, 4, 8 on 1 Gbit/s links; write network.png; return (result, summary)."""
    from kit import plots
    from kit.plots.network import plot_network, ratios, summary
    s = SETTINGS["tiny" if tiny else "quick" if quick else "full"]
    x = exchange.experiment(**s)
    K = max(s["sizes"])
    fig, ax = plots.figure(3, figsize=(15, 4.2))
    plot_network(x, K, ax=ax[0])
    fig.tight_layout()
    fig.savefig(out_dir / "network.png", dpi=100)
    result = {**x, "links": {str(n): v for n, v in x["links"].items()}, "ratios": ratios(x, K)}
    return result, summary(x, K, x["seconds"])
