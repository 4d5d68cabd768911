"""`python -m kit.bench ddp`: notebook 05's schemes (kit.ddp.schemes) on 3 gloo engines at benchmark size: time,
correctness, memory and bytes per rank → results/ddp.json, results/ddp.png, docs/benchmarks/ddp.md."""
from __future__ import annotations

from kit import checks
from kit.ddp import lessons, memory, schemes

SETTINGS = {
    "tiny": dict(cfg=dict(sizes=(16, 32, 32, 4), batch=8, reps=2), buckets=(256, 4096), alpha_beta=False),
    "quick": dict(cfg=dict(reps=5), buckets=schemes.BUCKETS, alpha_beta=True),
    "full": dict(cfg=dict(reps=30), buckets=schemes.BUCKETS, alpha_beta=True),
}


def bench(out_dir, quick: bool = False, tiny: bool = False, cluster=None):
    """Run every scheme on 3 gloo engines (on `cluster`'s engines when given: the tests share theirs)."""
    s = SETTINGS["tiny" if tiny else "quick" if quick else "full"]
    names = schemes.all_schemes(s["buckets"], s["buckets"][-1] if tiny else schemes.DDP_BUCKET)
    x = schemes.experiment(cluster, n=3, cfg=s["cfg"], names=names, alpha_beta=s["alpha_beta"])
    if not tiny:
        from kit.ddp.horovod import horovod_timeline
        x["horovod_timeline"] = horovod_timeline(n=3, cfg=s["cfg"])     # Horovod's own timeline, apart
        import matplotlib.pyplot as plt
        from kit.plots.ddp import plot_schemes
        axes = plot_schemes(x)
        axes[0].figure.savefig(out_dir / "ddp.png", dpi=120, bbox_inches="tight")
        plt.close(axes[0].figure)
    return x, summary(x)


def summary(x: dict) -> str:
    """The one-line summary of a run (the benchmark's last line): step times, peak shares, then the checks."""
    steps = ", ".join(f"{r['scheme']} {r['step_ms']:.1f}" for r in x["rows"])
    peaks = ", ".join(f"{r['scheme']} {memory.peak_share(r, x['K']):.3f}" for r in x["rows"] if memory.stage_of(r))
    return (f"ddp: N={x['N']} gloo engines, MLP K={x['K']:,} B in {x['tensors']} tensors; step ms: {steps}; "
            f"peak share of 3K: {peaks}; checks {checks.summary_line(lessons.all_checks(x))}")
