"""Overlap proved from torch.profiler traces (notebook 05 section 2): the naive and the overlapped step recorded on
every engine, the collectives' spans read against backward's ops, and the share of communication hidden behind
backward computed from the traces and checked against the kit's own step timing.

    tr = record_all(cluster, folder)            # {scheme: {rank: trace}}, Chrome trace JSON files in `folder`
    sh = shares(tr)                             # {scheme: {rank: {"comm_ms", "compute_ms", "hidden_ms", "hidden"}}}
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
    against the kit's own timing: (naive step − overlapped step) / the naive step's communication per step. The
    step times are kit.ddp.experiment's medians (`x`) if given, else the traces' profiled steps."""
    sh = shares(traces)
    hid = statistics.median(r["hidden"] for r in sh["overlap"].values())
    naive_hid = statistics.median(r["hidden"] for r in sh["naive"].values())
    steps = len(trace.spans(next(iter(traces["naive"].values())), trace.STEP))
    comm = statistics.median(r["comm_ms"] for r in sh["naive"].values()) / steps      # comm per naive step
    if x is not None:
        from kit.ddp.schemes import by_scheme
        naive, over, source = by_scheme(x)["naive"]["step_ms"], by_scheme(x)["overlap"]["step_ms"], "section 4's"
    else:
        naive, over, source = step_ms(traces["naive"]), step_ms(traces["overlap"]), "the traced"
    timed = max(0.0, min(1.0, (naive - over) / comm)) if comm > 0 else 0.0
    held = abs(hid - timed) <= TOL and max(hid, timed) <= 2 * min(hid, timed)    # 4% vs 20% is 5× apart
    detail = (f"In the traces {hid:.0%} of the overlapped step's collective time ran beside backward's ops (naive: "
              f"{naive_hid:.0%}, as its allreduce blocks backward); {source} step times, naive {naive:.1f} ms and "
              f"overlapped {over:.1f} ms, save {naive - over:.1f} ms of the {comm:.1f} ms of communication per traced "
              f"naive step (profiler on; {timed:.0%})")
    reason = "" if held else (
        f"the traces say {hid:.0%} ran beside backward, the step times {timed:.0%}: running beside backward is not "
        "the same as saving time when the engines share too few cores (backward and Gloo's threads slow each other), "
        "and the step times also vary between runs; the trace shows what ran when, the difference of two step "
        "times only what it saved")
    return Check("overlap in the trace", measured=f"hidden share {hid:.0%} (traces) vs {timed:.0%} (step times)",
                 bound=f"within {TOL * 100:.0f} points and 2× of each other", held=held, reason=reason, detail=detail)
