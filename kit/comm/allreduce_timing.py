"""Timing allreduce on the engines (appendix 03a and `python -m kit.bench allreduce`), each experiment once.

    records = sweep(cluster.view, sizes(4 << 10, 64 << 20), labels=plots.LABELS)   # busbw vs size: ring, naive, ...
    mpi_records, mpi_fusion = sweep_mpi(kit.cluster.start, sizes(...))   # Horovod over MPI (a job of its own)
    fusion = fusion_gloo(cluster.view)                                  # 100 small tensors: one by one vs fused
    points = scaling(kit.cluster.start, 16 << 20)                       # kit ring and naive at N = 2, 3, 4

The experiments that start jobs of their own take the starter (`kit.cluster.start`) as an argument: kit.comm sits
below kit.cluster. Each takes the notebook's small settings by default; `kit.bench.allreduce` passes larger ones.
"""
from __future__ import annotations

import time

import numpy as np

from kit.comm.costmodel import busbw
from kit.comm.ring import Traffic, allreduce, allreduce_fused, allreduce_naive

IMPLS = ("ring", "naive", "torch", "horovod")
CALL_TIMEOUT = 600      # s: the longest one call on the engines may take (the full run's largest is a few seconds)
NAIVE_N1 = "naive, N+1 ranks (rank 0 = server)"


# ----------------------------------------------------------------------------------- on every engine
def _barrier():
    """Wait for every rank: torch.distributed's barrier where the group exists, else Horovod's."""
    import sys
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
    elif "horovod.torch" in sys.modules:
        sys.modules["horovod.torch"].barrier()


def time_allreduce(impl: str, nbytes: int, reps: int = 3, dtype: str = "float32") -> dict:
    """Time `reps` allreduces of `nbytes` with one implementation on this rank (call it on every engine).

    Returns {"seconds": one per rep, "sent": bytes this rank sent (ring/naive only, counted), "ok": correct?}.
    """
    import torch
    x = torch.full((nbytes // torch.empty(0, dtype=getattr(torch, dtype)).element_size(),), 1.0,
                   dtype=getattr(torch, dtype))
    run = _runner(impl)
    seconds, sent, ok = [], None, True
    for i in range(reps + 1):                       # one warm-up call, not timed
        y = x.clone()
        _barrier()
        t0 = time.perf_counter()
        out = run(y, f"t{nbytes}.{i}")
        dt = time.perf_counter() - t0
        y = out if isinstance(out, torch.Tensor) else y
        ok = ok and bool((y == _world_size()).all())
        if i:
            seconds.append(dt)
        if isinstance(out, Traffic):
            sent = out.sent
    return {"seconds": seconds, "sent": sent, "ok": ok}


def _world_size() -> int:
    from kit import env
    return env.size()


def _runner(impl: str):
    """Return f(tensor, name) that sums `tensor` over the ranks with `impl`."""
    if impl == "ring":
        return lambda t, name: allreduce(t)
    if impl == "naive":
        return lambda t, name: allreduce_naive(t)
    if impl == "torch":
        import torch.distributed as dist
        return lambda t, name: dist.all_reduce(t)
    if impl == "horovod":
        import horovod.torch as hvd
        return lambda t, name: hvd.allreduce(t, op=hvd.Sum, name=name)
    raise ValueError(f"unknown implementation {impl!r}: use one of {IMPLS}")


def time_fusion(impl: str, count: int = 100, numel: int = 1024, reps: int = 2) -> dict:
    """Time `count` small allreduces one by one vs as one fused call ("ring" or "horovod"); best of reps, s."""
    import torch
    tensors = [torch.ones(numel) for _ in range(count)]
    out = {}
    for mode in ("one_by_one", "fused"):
        best = float("inf")
        for r in range(reps + 1):
            _barrier()
            t0 = time.perf_counter()
            _fusion_modes[impl, mode](tensors, f"{mode}{r}")
            best = min(best, time.perf_counter() - t0) if r else best
        out[mode] = best
    return out


def _ring_one_by_one(tensors, name):
    for t in tensors:
        allreduce(t)


def _horovod_one_by_one(tensors, name):
    import horovod.torch as hvd
    for i, t in enumerate(tensors):
        hvd.allreduce_(t, op=hvd.Sum, name=f"{name}.{i}")


def _horovod_fused(tensors, name):
    """Hand all tensors to Horovod at once (async); its background thread fuses those ready in one cycle."""
    import horovod.torch as hvd
    handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"{name}.{i}") for i, t in enumerate(tensors)]
    for h in handles:
        hvd.synchronize(h)


_fusion_modes = {("ring", "one_by_one"): _ring_one_by_one, ("ring", "fused"): allreduce_fused,
                 ("horovod", "one_by_one"): _horovod_one_by_one, ("horovod", "fused"): _horovod_fused}


def horovod_restart(**settings) -> dict:
    """Shut Horovod (torch) down, set HOROVOD_* variables, init again; return the settings now in force.

    Horovod reads HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME at init only. Measured here: one restart per
    job works (Gloo and MPI); a second one killed the engines, so change both settings in one restart.
    """
    import os
    import horovod.torch as hvd
    hvd.shutdown()
    os.environ.update({f"HOROVOD_{k.upper()}": str(v) for k, v in settings.items()})
    hvd.init()
    return {k: os.environ[k] for k in sorted(os.environ) if k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME")}



# ----------------------------------------------------------------------------------- the experiments
def _call(view, f, *args, **kwargs):
    """view.apply_sync(f, ...), bounded: an engine stuck in a collective is an error that names the call, not a
    benchmark that prints nothing for ever."""
    from ipyparallel.error import TimeoutError as IPPTimeout
    try:
        return view.apply_async(f, *args, **kwargs).get(timeout=CALL_TIMEOUT)
    except IPPTimeout:
        raise TimeoutError(f"{f.__name__}{args} did not return from the engines within {CALL_TIMEOUT} s: a rank is "
                           f"stuck (restart the cluster)") from None


def measure(view, impl: str, sizes, reps: int = 3, label: str | None = None) -> list[dict]:
    """Time `impl` on every engine of `view` for each size; one record per size (slowest rank, median of reps)."""
    n, records = len(view), []
    for nbytes in sizes:
        per_rank = _call(view, time_allreduce, impl, int(nbytes), reps)
        seconds = float(np.median(np.max([r["seconds"] for r in per_rank], axis=0)))
        records.append({"impl": label or impl, "n": n, "bytes": int(nbytes), "seconds": seconds,
                        "algbw": nbytes / seconds, "busbw": busbw(nbytes, seconds, n),
                        "sent": [r["sent"] for r in per_rank], "ok": all(r["ok"] for r in per_rank)})
    return records



def table(records: list[dict], at: int) -> list[tuple[str, float, float]]:
    """Return (implementation, ms, busbw GB/s) for every implementation measured at `at` bytes."""
    return [(r["impl"], r["seconds"] * 1e3, r["busbw"] / 1e9) for r in records if r["bytes"] == at]



def fusion_table(view, count: int = 100, numel: int = 1024, reps: int = 2, impls=("ring", "horovod")) -> dict:
    """Return {impl: {"one_by_one": s, "fused": s}} for `count` tensors of `numel` float32 (slowest rank)."""
    out = {}
    for impl in impls:
        per_rank = _call(view, time_fusion, impl, count, numel, reps)
        out[impl] = {mode: max(r[mode] for r in per_rank) for mode in ("one_by_one", "fused")}
    return out


def sweep(view, message_sizes, reps: int = 3, impls=IMPLS, labels: dict | None = None) -> list[dict]:
    """Time each implementation on the torch.distributed group of `view` at each size; records as `measure`,
    each named by `labels[impl]` (the figures' names, `kit.plots.LABELS`) or by `impl`."""
    return [r for impl in impls for r in measure(view, impl, message_sizes, reps, label=(labels or {}).get(impl, impl))]


def sweep_mpi(start, message_sizes, reps: int = 3, count: int = 100, numel: int = 1024, fusion_reps: int = 2):
    """Start 2 MPI engines with `start` (`kit.cluster.start`; a job of their own: no torch.distributed group); time
    Horovod (MPI) at each size and on `count` small tensors, with the default 1 ms cycle and with a 10 ms one;
    return (records, fusion)."""
    with start(n=2, backend="mpi", quiet=True) as mpi:
        records = measure(mpi.view, "horovod", message_sizes, reps, label="Horovod (MPI)")
        hvd = lambda: fusion_table(mpi.view, count, numel, fusion_reps, ("horovod",))["horovod"]  # noqa: E731
        fusion = {"Horovod (MPI)": hvd()}
        _call(mpi.view, horovod_restart, cycle_time=10)
        fusion["Horovod (MPI), cycle 10 ms"] = hvd()
    return records, fusion


def fusion_gloo(view, count: int = 100, numel: int = 1024, reps: int = 2) -> dict:
    """Time `count` small tensors one by one vs fused with the kit ring and Horovod (Gloo), then Horovod again with
    fusion off (this restarts Horovod on the engines: once per job, see `horovod_restart`)."""
    f = fusion_table(view, count, numel, reps)
    out = {"kit ring": f["ring"], "Horovod (Gloo)": f["horovod"]}
    _call(view, horovod_restart, fusion_threshold=0)
    out["Horovod (Gloo), fusion off"] = fusion_table(view, count, numel, reps, ("horovod",))["horovod"]
    return out


def scaling(start, K: int, reps: int = 3, ranks=(2, 3, 4)) -> dict:
    """Start a gloo job of each size in `ranks` with `start` (`kit.cluster.start`); time the kit ring at N ranks and
    the naive allreduce (rank 0 as the server of N-1 workers) on K bytes; return {implementation: {N: seconds}}.
    Run it with no other job busy."""
    points = {"kit ring": {}, NAIVE_N1: {}}
    for n in ranks:
        with start(n=n, backend="gloo", quiet=True) as c:
            c.init_process_group()
            points["kit ring"][n] = measure(c.view, "ring", [K], reps)[0]["seconds"]
            if n > 2:
                points[NAIVE_N1][n - 1] = measure(c.view, "naive", [K], reps)[0]["seconds"]
    return points
