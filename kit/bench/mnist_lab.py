"""`python -m kit.bench mnist_lab`: notebook 04's MNIST job on 2 and 4 lab hosts at 1 and 10 Gbit/s
(kit.mnist.lab.scaling) with more steps; mnist_lab.png."""
from __future__ import annotations

from pathlib import Path

from kit import checks, netlab
from kit.mnist import lab as lab_runs
from kit.plots import figure, plot_lab_scaling


def bench(out_dir: Path, quick: bool, tiny: bool = False) -> tuple[dict, str]:
    """`python -m kit.bench mnist_lab`: notebook 04's lab runs with more steps; figure mnist_lab.png."""
    sizes, rates, steps = ((2,), ("1gbit",), 12) if tiny else ((2, 4), ("1gbit", "10gbit"), 30 if quick else 80)
    with netlab.start(hosts=max(sizes), rate=rates[0]) as lab:
        result = lab_runs.scaling(lab, sizes, rates, steps)
    fig, (ax,) = figure(2, figsize=(10, 3.4))
    plot_lab_scaling(result, ax=ax)
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "mnist_lab.png", dpi=110)
    parts = [f"{r['n']} hosts at {r['rate']}: {r['speedup']:.2f}x" for r in result["runs"]]
    summary = (f"mnist_lab: 1 worker {result['one_worker']['samples_per_s']:,.0f} samples/s; " + "; ".join(parts)
               + f"; checks: {checks.summary_line(lab_runs.claims(result))}" if len(rates) > 1 else
               f"mnist_lab: 1 worker {result['one_worker']['samples_per_s']:,.0f} samples/s; " + "; ".join(parts))
    return result, summary
