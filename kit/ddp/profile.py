"""Overlap proved from torch.profiler traces (notebook 05 section 2): the naive and the overlapped step recorded on
every engine, the collectives' spans read against backward's ops, and the share of communication hidden behind
backward computed from the traces and checked against the kit's own step timing.

    tr = record_all(cluster, folder)            # {scheme: {rank: trace}}, Chrome trace JSON files in `folder`
    sh = shares(tr)                             # {scheme: {rank: {"comm_ms", "compute_ms", "hidden_ms", "hidden"}}}
    share_rows(tr)                              # the same as table rows
    hidden_check(tr, x)                         # kit.checks.Check: the traces' hidden share vs the step times
    kit.plots.trace.plot_ranks(tr["overlap"], LANES)

The collectives are Gloo's work spans (`gloo:all_reduce`, on Gloo's threads, from launch to completion: kit.trace
.COLLECTIVE). Backward's compute is every autograd node except AccumulateGrad: the post-accumulate-grad hooks run
inside AccumulateGrad's span, so the naive hook's blocking allreduce would otherwise count as "hidden behind
backward" while backward in fact waits for it.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from kit import trace
from kit.checks import Check

BACKWARD_COMPUTE = r"^autograd::engine::evaluate_function: (?!torch::autograd::AccumulateGrad)"
LANES = {"backward ops": BACKWARD_COMPUTE, "collectives": trace.COLLECTIVE}
SCHEMES = ("naive", "overlap")
TOL = 0.20          # the traces' hidden share and the timing's agree within this much (absolute) and within 2×


def record(cfg: dict, folder: str, schemes_=SCHEMES, wait: int = 1, warmup: int = 1, active: int = 3) -> dict:
    """On every engine: train each scheme from the same seeded model under kit.trace.profiler (CPU activity) for
    wait + warmup + active steps; write `folder`/{scheme}_rank{r}.json; return {scheme: path}."""
    import torch.distributed as dist
    from kit.ddp import schemes
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for scheme in schemes_:
        model, opt, finish = schemes.setup(scheme, schemes.make_model(cfg), cfg)
        path = Path(folder) / f"{scheme}_rank{rank}.json"
        dist.barrier()                               # outside the profiler: every rank starts the scheme together
        with trace.profiler(path, wait, warmup, active, cuda=False) as rec:
            step = 0
            while True:
                schemes.train_step(model, opt, finish, *schemes.batch(cfg, step, rank, world))
                step += 1
                if not rec.step():
                    break
        out[scheme] = str(path)
    return out


def record_all(cluster, folder, cfg: dict | None = None, **schedule) -> dict:
    """Record every scheme on every engine of `cluster` (one host: the ranks share its clock and `folder`); return
    {scheme: {rank: trace dict}}."""
    from kit.ddp import schemes
    cfg = dict(schemes.CFG, **(cfg or {}))
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = cluster.wait(cluster.view.apply_async(record, cfg, str(folder), **schedule))
    return {s: {r: trace.load(p[s]) for r, p in enumerate(paths)} for s in paths[0]}


def shares(traces: dict) -> dict:
    """{scheme: {rank: trace}} -> {scheme: kit.trace.per_rank(...)}: each rank's collectives against its backward
    compute, and the share of communication hidden behind it."""
    return {s: trace.per_rank(by_rank, trace.COLLECTIVE, BACKWARD_COMPUTE) for s, by_rank in traces.items()}


def step_ms(by_rank: dict) -> float:
    """The mean profiled step (ProfilerStep#) of the slowest rank, in ms."""
    per = [trace.length(trace.spans(t, trace.STEP)) / len(trace.spans(t, trace.STEP)) / 1e3 for t in by_rank.values()]
    return max(per)


def hidden_check(traces: dict, x: dict | None = None) -> Check:
    """The share of communication hidden behind backward read from the overlapped traces (median over ranks)
    against the kit's own timing: (naive step − overlapped step) / the naive step's communication per step, the
    two within TOL of each other and within 2×. The step times are kit.ddp.experiment's medians (`x`) if given,
    else the traces' profiled steps."""
    sh = shares(traces)
    hid = statistics.median(r["hidden"] for r in sh["overlap"].values())
    steps = len(trace.spans(next(iter(traces["naive"].values())), trace.STEP))
    comm = statistics.median(r["comm_ms"] for r in sh["naive"].values()) / steps      # comm per naive step
    if x is not None:
        from kit.ddp.schemes import by_scheme
        naive, over = by_scheme(x)["naive"]["step_ms"], by_scheme(x)["overlap"]["step_ms"]
    else:
        naive, over = step_ms(traces["naive"]), step_ms(traces["overlap"])
    timed = max(0.0, min(1.0, (naive - over) / comm)) if comm > 0 else 0.0
    lo, hi = max(timed - TOL, timed / 2), min(timed + TOL, 2 * timed)               # 4% vs 20% is 5× apart
    return Check("overlap: share hidden in the traces", hid, f"{lo:.2f}–{hi:.2f}",
                 lo <= hid <= hi)


def share_rows(traces: dict) -> list[dict]:
    """Per scheme and rank: the collectives' ms in the traces and the share of it beside backward's compute."""
    return [{"scheme": s, "rank": r, "collectives ms": v["comm_ms"], "beside backward": v["hidden"]}
            for s, by_rank in shares(traces).items() for r, v in by_rank.items()]
