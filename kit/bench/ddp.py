"""`python -m kit.bench ddp`: notebook 05's schemes (kit.ddp.schemes) on 3 gloo engines at benchmark size: time,
correctness, memory and bytes per rank → results/ddp.json, results/ddp.png, docs/benchmarks/ddp.md."""
from __future__ import annotations

from kit import checks, env
from kit.comm import costmodel
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
    """The one-line summary of a run (the benchmark's last line): step times, then the lessons' checks."""
    s, N = schemes.by_scheme(x), x["N"]
    many, few = lessons.bucket_extremes(x)
    ddp, fp16 = schemes.first(x, "ddp"), schemes.first(x, "ddp_fp16")
    return (f"ddp: N={N} gloo engines, MLP K={x['K']:,} B in {x['tensors']} tensors; step ms: compute only "
            f"{s['local']['step_ms']:.1f}, naive {s['naive']['step_ms']:.1f}, overlap {s['overlap']['step_ms']:.1f}, "
            f"buckets {few['step_ms']:.1f} at {costmodel.human(int(few['scheme'].split(':')[1]))}, DDP "
            f"{ddp['step_ms']:.1f}, DDP fp16 {fp16['step_ms']:.1f}, Horovod {s['horovod']['step_ms']:.1f}, ZeRO-1 "
            f"{s['zero']['step_ms']:.1f}, FSDP2 {s['fsdp']['step_ms']:.1f}; peak state per rank (1/N = {1 / N:.3f}): "
            f"ZeRO-1 {memory.peak_share(s['zero'], x['K']):.3f}, FSDP2 {memory.peak_share(s['fsdp'], x['K']):.3f}; "
            f"checks {checks.summary_line(lessons.all_checks(x, env.cpu_cores()))}")
