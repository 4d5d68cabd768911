"""Notebooks 02 and 03's lab section: `kit.netlab.exchange.experiment` on a fresh lab where one can start, else the
committed run of `python -m kit.bench network` (results/network.json and its figure), with the reason why.

    net, no_lab = fresh_or_committed(ns=(2, 3, 4), sizes=(4 << 10, 64 << 20), rate="1gbit", reps=2, impls=IMPLS)
"""
from __future__ import annotations

import json
import os

from kit.netlab import exchange
from kit.netlab.requirements import why_not
from kit.plots import network as network_plots

RESULTS = os.path.join(exchange.KIT_ROOT, "results")


def fresh_or_committed(ns, sizes, rate: str, reps: int, impls, link_rounds: int = 5) -> tuple[dict, str | None]:
    """Return (the run, None) after running the exchange on a lab here and plotting it, or (the committed run, why
    no lab can start here: not root with NET_ADMIN, no iproute2 or sshd) after showing its figure; then print
    whether every sum was right and the load average (small messages wait for a core). link_rounds: rounds of
    ping-pongs and streams that measure the link's α and B (exchange.measure_link)."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    no_lab = why_not()
    if no_lab is None:
        net = exchange.experiment(ns=ns, sizes=sizes, rate=rate, reps=reps, impls=impls, link_rounds=link_rounds)
        network_plots.plot_network(net, max(sizes))
        plt.tight_layout()
        plt.show()
    else:
        print(f"No lab on this machine: {no_lab}.\nBelow: the committed figure and JSON of `python -m kit.bench "
              "network`.")
        with open(os.path.join(RESULTS, "network.json")) as f:
            net = json.load(f)
        display(Image(os.path.join(RESULTS, "network.png")))
    print("every sum correct:", all(r["ok"] for r in net["rows"]))
    print(f"load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (small messages "
          "wait for a core)")
    return net, no_lab
