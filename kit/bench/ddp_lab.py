"""`python -m kit.bench ddp_lab` (root: kit.netlab): notebook 05's schemes on 2, 3 and 4 lab hosts at 1 Gbit/s
(kit.ddp.lab), each lesson checked → results/ddp_lab.json, ddp_lab.png, ddp_lab_timeline.png (the median overlapped
step at each N), docs/benchmarks/ddp_lab.md."""
from __future__ import annotations

import time

from kit import checks
from kit.ddp import lab, schemes

SETTINGS = {"tiny": dict(ns=(2,), cfg=dict(sizes=(16, 32, 32, 4), batch=8, reps=2)), "quick": dict(ns=(2, 3)),
            "full": dict(ns=(2, 3, 4))}


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """Run the lab experiment for each N, draw its two figures, return the runs and their checks."""
    import matplotlib.pyplot as plt
    from kit.bench import say
    from kit.plots.ddp import plot_ddp_lab, plot_overlap_step
    s = SETTINGS["tiny" if tiny else "quick" if quick else "full"]
    t0 = time.time()
    xs = lab.run(ns=s["ns"], cfg=s.get("cfg"), say=say)
    ax = plot_ddp_lab(xs)
    ax.figure.savefig(out_dir / "ddp_lab.png", dpi=110, bbox_inches="tight")
    plt.close(ax.figure)
    fig, axes = plt.subplots(len(xs), 1, figsize=(11, 3.8 * len(xs)), squeeze=False)
    for x, ax in zip(xs, axes[:, 0]):
        plot_overlap_step(x, ax)
    fig.tight_layout()
    fig.savefig(out_dir / "ddp_lab_timeline.png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return {"runs": xs, "claims": [[c.as_dict() for c in lab.claims(x)] for x in xs]}, summary(xs, time.time() - t0)


def summary(xs: list[dict], seconds: float) -> str:
    """The one-line summary of a run over several N (the benchmark's last line): step times, then the checks."""
    parts = []
    for x in xs:
        p = {k: v["ms"] for k, v in x["paired"].items()}
        parts.append(f"N={x['N']}: compute {p['local']:.1f} ms, comm {p['comm']:.1f}, naive {p['naive']:.1f}, "
                     f"overlap {p['overlap']:.1f} ({p['overlap'] / max(p['local'], p['comm']):.2f}x max), DDP "
                     f"{schemes.first(x, 'ddp')['step_ms']:.1f}, Horovod "
                     f"{schemes.by_scheme(x)['horovod']['step_ms']:.1f}; checks {checks.summary_line(lab.claims(x))}")
    return f"ddp_lab at {xs[0]['rate']}: " + "; ".join(parts) + f"; {seconds:.0f} s"
