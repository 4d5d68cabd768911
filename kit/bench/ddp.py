"""`python -m kit.bench ddp`: notebook 05's schemes (kit.ddp.schemes) on 3 gloo engines at benchmark size: time,
correctness, memory and bytes per rank → results/ddp.json, results/ddp.png, docs/benchmarks/ddp.md."""
from __future__ import annotations

from kit.comm import costmodel
from kit.ddp import schemes

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
        import matplotlib.pyplot as plt
        from kit.plots.ddp import plot_schemes
        axes = plot_schemes(x)
        axes[0].figure.savefig(out_dir / "ddp.png", dpi=120, bbox_inches="tight")
        plt.close(axes[0].figure)
    return x, summary(x)


def summary(x: dict) -> str:
    """The one-line summary of a run (the benchmark's last line)."""
    s, N = schemes.by_scheme(x), x["N"]
    buckets = [r for r in x["rows"] if r["scheme"].startswith("buckets:")]
    best = min(buckets, key=lambda r: r["step_ms"])
    ddp, fp16 = schemes.first(x, "ddp"), schemes.first(x, "ddp_fp16")
    ok = all(r["ok"] for r in x["rows"] if r["ok"] is not None)
    return (f"ddp: N={N} gloo engines, MLP K={x['K']:,} B in {x['tensors']} tensors: every scheme equals one-process "
            f"SGD on the {N}x batch: {ok}; step ms: compute only {s['local']['step_ms']:.1f}, naive "
            f"{s['naive']['step_ms']:.1f}, overlap {s['overlap']['step_ms']:.1f}, buckets best "
            f"{best['step_ms']:.1f} at {costmodel.human(int(best['scheme'].split(':')[1]))}, DDP {ddp['step_ms']:.1f}, "
            f"DDP fp16 {fp16['step_ms']:.1f}, Horovod {s['horovod']['step_ms']:.1f}, ZeRO {s['zero']['step_ms']:.1f}, "
            f"FSDP2 {s['fsdp']['step_ms']:.1f}; "
            f"fp16 hook hands {fp16['handed'] / ddp['handed']:.2f}x DDP's bytes; state per rank (1/N = "
            f"{1 / N:.3f}): ZeRO {s['zero']['state_share']:.3f}, FSDP2 {s['fsdp']['state_share']:.3f}")

