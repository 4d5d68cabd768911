"""python -m kit.bench allreduce: appendix 03a's allreduce timings (`kit.comm.allreduce_timing`) at the benchmark's
settings: results/allreduce.json, allreduce*.png, the summary line and the docs' table.
"""
from __future__ import annotations

from kit import checks
from kit.checks import Check
from kit.comm import costmodel, lessons
from kit.comm.allreduce_timing import IMPLS, fusion_gloo, scaling, sweep, sweep_mpi
from kit.comm.costmodel import human, sizes
from kit.plots.style import LABELS


# ----------------------------------------------------------------------------------- the benchmark
SETTINGS = {   # reps, largest size, size factor, fusion tensors and reps, ranks for the model, ping-pong repeats
    "tiny": dict(reps=1, hi=64 << 10, factor=16, count=10, fusion_reps=1, ranks=(), pingpong=(3, 1)),
    "quick": dict(reps=2, hi=64 << 20, factor=16, count=100, fusion_reps=3, ranks=(2, 3), pingpong=(20, 3)),
    "full": dict(reps=5, hi=256 << 20, factor=4, count=100, fusion_reps=3, ranks=(2, 3, 4), pingpong=(20, 3)),
}
K_MODEL = 16 << 20      # the message size of the cost-model points


def experiment(size: str = "full") -> dict:
    """Run every allreduce experiment of notebook 03 at the benchmark's settings; return the results."""
    from kit import cluster as kc
    from kit.bench import say
    s = SETTINGS[size]
    goal = min(64 << 20, s["hi"])
    grid = sorted({*sizes(4 << 10, s["hi"], s["factor"]), goal})
    say("allreduce: starting 2 gloo engines")
    with kc.start(n=2, backend="gloo", quiet=True) as c:
        c.init_process_group()
        say(f"allreduce: {', '.join(IMPLS)} at {len(grid)} sizes")
        records = sweep(c.view, grid, s["reps"], labels=LABELS)
        say("allreduce: ping-pong (alpha, B)")
        ab = costmodel.measure_alpha_beta(c, repeats=s["pingpong"][0], rounds=s["pingpong"][1])
        say(f"allreduce: fusion of {s['count']} tensors (kit ring, Horovod Gloo, then fusion off)")
        fusion = fusion_gloo(c.view, s["count"], reps=s["fusion_reps"])
    say("allreduce: Horovod over MPI (2 engines of their own)")
    mpi_records, mpi_fusion = sweep_mpi(kc.start, grid, s["reps"], s["count"], fusion_reps=s["fusion_reps"])
    if s["ranks"]:
        say(f"allreduce: kit ring and naive at N = {', '.join(map(str, s['ranks']))}")
    points = scaling(kc.start, K_MODEL if size != "tiny" else goal, s["reps"], s["ranks"])
    say("allreduce: figures")
    return {"records": records + mpi_records, "ab": ab, "fusion": {**fusion, **mpi_fusion}, "points": points,
            "goal": goal, "count": s["count"], "K_model": K_MODEL if size != "tiny" else goal}


def bench(out_dir, quick: bool = False, tiny: bool = False):
    """python -m kit.bench allreduce: busbw vs size for 5 implementations at N=2, fusion, model vs N."""
    from kit import plots
    x = experiment("tiny" if tiny else "quick" if quick else "full")
    records, ab, fusion = x["records"], x["ab"], x["fusion"]
    for name, draw in (("allreduce", lambda ax: plots.plot_busbw(records, ax=ax)),
                       ("allreduce_model", lambda ax: plots.plot_ring_model(ab["alpha"], ab["B"], x["K_model"],
                                                                            x["points"], ax=ax)),
                       ("allreduce_fusion", lambda ax: plots.plot_fusion(fusion, x["count"], ax=ax))):
        fig, ax = plots.figure(figsize=(7, 4.5))
        draw(ax[0, 0])
        fig.savefig(out_dir / f"{name}.png", dpi=120, bbox_inches="tight")
    at = {r["impl"]: r["busbw"] for r in records if r["bytes"] == x["goal"]}
    ring_bw, gloo, mpi = at["kit ring"], at["Horovod (Gloo)"], at["Horovod (MPI)"]
    result = {"records": records, "alpha_s": ab["alpha"], "B_bytes_per_s": ab["B"], "model_bytes": x["K_model"],
              "model_points": {k: {str(n): s for n, s in v.items()} for k, v in x["points"].items()},
              f"fusion_{x['count']}x4KB_s": fusion, "all_correct": all(r["ok"] for r in records), "goal": x["goal"],
              f"ring_vs_horovod_busbw_{human(x['goal']).replace(' ', '')}": {"gloo": ring_bw / gloo,
                                                                             "mpi": ring_bw / mpi}}
    return result, summary(result)


def summary(x: dict) -> str:
    """Return the benchmark's summary line of a run (results/allreduce.json): busbw at its largest size up to
    64 MB, then its checks (the kit's ring at least half the best Horovod's busbw there; every result correct)."""
    goal = x.get("goal") or min(64 << 20, max(r["bytes"] for r in x["records"]))
    at = {r["impl"]: r["busbw"] for r in x["records"] if r["bytes"] == goal}
    best = max(at["Horovod (Gloo)"], at["Horovod (MPI)"])
    cs = [Check(f"kit ring busbw / best Horovod's at {human(goal)}", measured=at["kit ring"] / best, bound="≥ 0.5",
                held=at["kit ring"] / best >= 0.5),
          lessons.equal_check("results correct", {f"{r['impl']} {r['bytes']}": r["ok"] for r in x["records"]})]
    return (f"allreduce N=2, {human(goal)}, busbw GB/s: " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in at.items())
            + f"; checks {checks.summary_line(cs)}")


README_SIZES = (4 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20)


def readme_table(result: dict, sizes=README_SIZES) -> str:
    """Return the docs' table of a `python -m kit.bench allreduce` run: time · busbw (GB/s) per implementation
    and size (tests/test_packaging checks the README against it)."""
    by = {(r["impl"], r["bytes"]): r for r in result["records"]}
    impls = list(dict.fromkeys(r["impl"] for r in result["records"]))
    out = ["| implementation | " + " | ".join(human(k) for k in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for impl in impls:
        cells = [f"{by[impl, k]['seconds'] * 1e3:.1f} ms · {by[impl, k]['busbw'] / 1e9:.2f}" if (impl, k) in by
                 else "–" for k in sizes]
        out.append(f"| {impl} | " + " | ".join(cells) + " |")
    return "\n".join(out)
