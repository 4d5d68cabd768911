"""Notebook 06's experiments on engines, written once (the notebook and `python -m kit.bench mp` call them).

    x = sweep(cluster, ps=(2, 3, 4), ms=(1, 2, 4, 8, 16))     # both schedules: bubble, activations held, timeline
    g = grads_check(cluster, p=2, m=4)                        # both schedules equal one process's gradients
    t = torch_side_by_side(cluster, p=2, m=4)                 # torch.distributed.pipelining on the same stages
    tp = tp_check(cluster)                                    # the reference TP MLP equals the unsharded one

The functions named engine_* run on every engine (cluster.view.apply); the others run in the notebook.
"""
from __future__ import annotations

import statistics
import time

from kit.mp import model as formulas

CFG = dict(d=32, mb=8, seed=0, tf=0.010, tb=0.020, reps=3)


def _groups(world: int):
    """One group per prefix 0..p-1 of the ranks (created on every rank, in the same order)."""
    import torch.distributed as dist
    return {p: dist.new_group(list(range(p))) for p in range(2, world + 1)}


def engine_step(cfg: dict, p: int, m: int, name: str, rank: int, die_at: int | None = None):
    """Run one pipeline step of schedule `name` as stage `rank` of p; return (run_step's dict, the stage module).

    die_at: this process exits (code 3) at its forward of that micro-batch, mid-step (the failure lesson)."""
    import os
    from kit.mp import pipeline as pp
    module = pp.make_model(p, cfg["d"], cfg["seed"], cfg["tf"], cfg["tb"])[rank]
    if die_at is not None:
        calls = iter(range(m))
        module.register_forward_pre_hook(lambda *_: os._exit(3) if next(calls) == die_at else None)
    x, y = pp.data(m * cfg["mb"], cfg["d"], cfg["seed"])
    xs, ys = x.chunk(m), y.chunk(m)
    acts = (pp.SCHEDULES.get(name) or _engine_class(name, None))(p, m, rank)
    out = pp.run_step(module, acts, stage=rank, p=p, xs=xs if rank == 0 else None,
                      ys=ys if rank == p - 1 else None, shape=(cfg["mb"], cfg["d"]))
    return out, module


def engine_sweep(cfg: dict, ps, ms, names):
    """On every engine: each (p, m, schedule) `reps` times, ranks >= p waiting; return this rank's runs."""
    import torch.distributed as dist
    rank, runs = dist.get_rank(), []
    for p in ps:
        for m in ms:
            for name in names:
                for rep in range(cfg["reps"]):
                    dist.barrier()
                    if rank >= p:
                        continue
                    out, _ = engine_step(cfg, p, m, name, rank)
                    runs.append({"p": p, "m": m, "schedule": name, "rep": rep, **out})
    dist.barrier()
    return runs


def engine_grads(cfg: dict, p: int, m: int, names, die: tuple[int, int] | None = None):
    """On every engine: each schedule's gradients of this stage against one process on the whole batch.

    die: (stage, micro-batch): that stage's process exits at that micro-batch's forward, mid-step."""
    import torch
    import torch.distributed as dist
    from kit.mp import pipeline as pp
    rank, out = dist.get_rank(), {}
    ref = pp.make_model(p, cfg["d"], cfg["seed"])
    x, y = pp.data(m * cfg["mb"], cfg["d"], cfg["seed"])
    pp.loss_fn(ref(x), y).backward()
    for name in names:
        dist.barrier()
        if rank >= p:
            continue
        _, module = engine_step({**cfg, "tf": 0, "tb": 0}, p, m, name, rank,
                                die_at=die[1] if die is not None and die[0] == rank else None)
        out[name] = max(float((a.grad - b.grad).abs().max()) for a, b in zip(module.parameters(),
                                                                                ref[rank].parameters()))
    dist.barrier()
    return {"rank": rank, "err": out, "numel": sum(t.numel() for t in ref[rank].parameters()) if rank < p else 0,
            "dtype": str(torch.get_default_dtype())}


def engine_torch(cfg: dict, p: int, m: int, names, reps: int):
    """On every engine: torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B on the same stages."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from kit.mp import pipeline as pp
    rank, groups, out = dist.get_rank(), _groups(dist.get_world_size()), {}
    x, y = pp.data(m * cfg["mb"], cfg["d"], cfg["seed"])
    ref = pp.make_model(p, cfg["d"], cfg["seed"])
    pp.loss_fn(ref(x), y).backward()
    for name in names:
        cls = {"afab": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
        secs, err = [], None
        for _ in range(reps):
            dist.barrier()
            if rank >= p:
                continue
            model = pp.make_model(p, cfg["d"], cfg["seed"], cfg["tf"], cfg["tb"])
            stage = PipelineStage(model[rank], rank, p, torch.device("cpu"), group=groups[p])
            sched = cls(stage, n_microbatches=m, loss_fn=pp.loss_fn)
            t0 = time.perf_counter()
            if rank == 0:
                sched.step(x)
            elif rank == p - 1:
                sched.step(target=y, losses=[])
            else:
                sched.step()
            dist.barrier(groups[p])
            secs.append(time.perf_counter() - t0)
            err = max(float((a.grad - b.grad).abs().max()) for a, b in zip(model[rank].parameters(),
                                                                           ref[rank].parameters()))
        out[name] = {"seconds": secs, "err": err}
    dist.barrier()
    return out


def _run(cluster, fn, *args):
    return cluster.wait(cluster.view.apply_async(fn, *args))


def sweep(cluster, ps=(2, 3, 4), ms=(1, 2, 4, 8, 16), names=("afab", "1f1b"), cfg: dict | None = None) -> dict:
    """Run both schedules for every p and m on the engines; return rows (bubble measured and modelled, peaks)."""
    cfg = {**CFG, **(cfg or {})}
    if max(ps) > cluster.size:
        raise ValueError(f"ps={ps!r} needs {max(ps)} engines, the cluster has {cluster.size}")
    per_rank = _run(cluster, engine_sweep, cfg, list(ps), list(ms), list(names))
    rows, timelines = [], {}
    from kit.mp import pipeline as pp
    for p in ps:
        for m in ms:
            for name in names:
                reps = []
                for rep in range(cfg["reps"]):
                    runs = sorted([r for rank in per_rank for r in rank
                                   if (r["p"], r["m"], r["schedule"], r["rep"]) == (p, m, name, rep)],
                                  key=lambda r: r["events"][0]["stage"])
                    events = [e for r in runs for e in r["events"]]
                    reps.append({"bubble": pp.bubble_of(events), "events": events,
                                 "step_s": max(e["t1"] for e in events) - min(e["t0"] for e in events),
                                 **{k: [r[k] for r in runs] for k in ("peak", "peak_bytes", "mb_bytes")}})
                mid = sorted(reps, key=lambda r: r["bubble"])[len(reps) // 2]
                b = [r["bubble"] for r in reps]
                rows.append({"p": p, "m": m, "schedule": name, "bubble": statistics.median(b),
                             "bubble_range": [min(b), max(b)], "model": formulas.bubble(p, m),
                             "step_s": statistics.median(r["step_s"] for r in reps),
                             "model_step_s": formulas.step_time(p, m, cfg["tf"], cfg["tb"]),
                             "peak": mid["peak"], "peak_bytes": mid["peak_bytes"], "mb_bytes": mid["mb_bytes"],
                             "peak_model": [formulas.peak_in_flight(name, p, m, s) for s in range(p)]})
                t0 = min(e["t0"] for e in mid["events"])
                timelines[f"{name}:{p}:{m}"] = [{**e, "t0": e["t0"] - t0, "t1": e["t1"] - t0} for e in mid["events"]]
    return {"cfg": cfg, "rows": rows, "timelines": timelines}


def grads_check(cluster, p: int = 2, m: int = 4, names=("afab", "1f1b"), cfg: dict | None = None,
                tol: float = 1e-5, die: tuple[int, int] | None = None) -> dict:
    """Check both schedules' gradients against one process on the whole batch; return errors per stage.

    die=(stage, micro-batch) kills that stage mid-step: cluster.wait raises RankDiedError naming its rank."""
    cfg = {**CFG, **(cfg or {})}
    out = [r for r in _run(cluster, engine_grads, cfg, p, m, list(names), die) if r["rank"] < p]
    errs = {name: [r["err"][name] for r in out] for name in names}
    return {"p": p, "m": m, "errs": errs, "tol": tol, "ok": all(e <= tol for v in errs.values() for e in v)}


def torch_side_by_side(cluster, p: int = 2, m: int = 4, names=("afab", "1f1b"), cfg: dict | None = None) -> dict:
    """Time torch.distributed.pipelining's schedules on the same stages; return step times and gradient errors."""
    cfg = {**CFG, **(cfg or {})}
    out = _run(cluster, engine_torch, cfg, p, m, list(names), cfg["reps"])[:p]
    rows = {}
    for name in names:
        secs = [max(s) for s in zip(*[r[name]["seconds"] for r in out])]
        rows[name] = {"step_s": statistics.median(secs), "err": max(r[name]["err"] for r in out)}
    return {"p": p, "m": m, "rows": rows, "model_step_s": formulas.step_time(p, m, cfg["tf"], cfg["tb"])}


TP_CFG = dict(d=64, hidden=None, batch=32, seed=0, reps=5)


def _engine_class(name, default):
    """The class (or function) called `name` in this engine's namespace (what a %%px cell defined or
    cluster.view.push sent), or `default` if None."""
    if name is None:
        return default
    from IPython import get_ipython
    ns = get_ipython().user_ns
    if name not in ns:
        raise NameError(f"no {name!r} on this engine: define it in a %%px cell (or push it) first")
    return ns[name]


def engine_tp(cfg: dict, column: str | None = None, row: str | None = None):
    """On every engine: the TP MLP (reference layers, or the given classes) against the unsharded one; bytes
    handed to allreduce in one step, counted; then torch's parallelize_module on the same MLP; step times."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from kit.comm import dp
    from kit.mp import tensor
    column, row = _engine_class(column, tensor.ColumnParallelLinear), _engine_class(row, tensor.RowParallelLinear)
    x = torch.randn(cfg["batch"], cfg["d"], generator=torch.Generator().manual_seed(cfg["seed"] + 1))
    full = tensor.mlp(cfg["d"], cfg["hidden"], cfg["seed"])
    tp = tensor.parallel_mlp(full, column, row)
    with dp.counting() as calls:       # x stands for the output of earlier layers: it needs a gradient too (f)
        tp(x.clone().requires_grad_(True)).pow(2).sum().backward()
    out = {"calls": calls, "diff": tensor.compare(tensor.parallel_mlp(full, column, row), full, x),
           "held": sum(p.numel() * p.element_size() for p in tp.parameters()),
           "full": sum(p.numel() * p.element_size() for p in full.parameters())}
    try:   # uneven hidden sizes: torch 2.13's sharding propagation refuses the row layer's addmm
        torch_tp = parallelize_module(tensor.mlp(cfg["d"], cfg["hidden"], cfg["seed"]),
                                      init_device_mesh("cpu", (dist.get_world_size(),)),
                                      {"0": ColwiseParallel(), "2": RowwiseParallel()})
        ya = torch_tp(x)
        ya = ya.full_tensor() if hasattr(ya, "full_tensor") else ya
        out["torch_diff"], out["torch_error"] = float((ya - full(x)).abs().max()), None
    except RuntimeError as e:
        torch_tp, out["torch_diff"], out["torch_error"] = None, None, str(e).splitlines()[0]
    for name, model in (("full", tensor.mlp(cfg["d"], cfg["hidden"], cfg["seed"])), ("kit", tp), ("torch", torch_tp)):
        if model is None:
            out[f"{name}_s"] = None
            continue
        secs = []
        for _ in range(cfg["reps"] + 1):
            dist.barrier()
            t0 = time.perf_counter()
            model(x).pow(2).sum().backward()
            secs.append(time.perf_counter() - t0)
        out[f"{name}_s"] = statistics.median(secs[1:])
    return out


def tp_check(cluster, cfg: dict | None = None, column: str | None = None, row: str | None = None) -> dict:
    """Check a TP MLP (the reference, or the classes a %%px cell named `column`, `row`) against the unsharded
    one; count its allreduce bytes against the model; time it beside torch's parallelize_module."""
    cfg = {**TP_CFG, **(cfg or {})}
    out = _run(cluster, engine_tp, cfg, column, row)
    n, hidden = cluster.size, cfg["hidden"] or 4 * cfg["d"]
    handed = sum(b for c, b in out[0]["calls"] if c == "all_reduce")
    model = formulas.tp_handed_bytes(cfg["batch"], cfg["d"])
    return {"n": n, "cfg": {**cfg, "hidden": hidden}, "diff": [r["diff"] for r in out],
            "ok": all(r["diff"]["ok"] for r in out), "torch_error": out[0]["torch_error"],
            "torch_diff": None if out[0]["torch_error"] else max(r["torch_diff"] for r in out),
            "allreduces": len(out[0]["calls"]), "handed": handed, "model_handed": model,
            "sent": formulas.ring_sent(handed, n), "held": [r["held"] for r in out], "full": out[0]["full"],
            "ms": {k: None if out[0][f"{k}_s"] is None else 1e3 * max(r[f"{k}_s"] for r in out)
                   for k in ("full", "kit", "torch")}}


def engine_gather(cfg: dict, name: str) -> dict:
    """On every engine: the class `name` (a column-parallel linear that gathers its output) against nn.Linear."""
    import torch
    import torch.distributed as dist
    from kit.mp import tensor
    cls = _engine_class(name, None)
    n, d = dist.get_world_size(), cfg["d"]
    hidden = n * max(1, (cfg["hidden"] or 4 * d) // n)      # the exercise's layer: an output that divides by n
    gen = torch.Generator().manual_seed(cfg["seed"] + 2)
    x, w = torch.randn(cfg["batch"], d, generator=gen), torch.randn(cfg["batch"], hidden, generator=gen)
    full = tensor.mlp(d, hidden, cfg["seed"])[0]
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yb = full(xb)
    try:
        layer = cls(full)
        ya = layer(xa)
        if ya is None:
            return {"ok": False, "why": "forward returned None", "answered": False}
        if ya.shape != yb.shape:
            return {"ok": False, "why": f"output shape {tuple(ya.shape)}, the unsharded layer's {tuple(yb.shape)}",
                    "answered": True}
        (ya * w).sum().backward()
    except (RuntimeError, TypeError, ValueError, AttributeError) as e:     # a wrong answer, said as such
        return {"ok": False, "why": f"{type(e).__name__}: {str(e).splitlines()[0]}", "answered": True}
    (yb * w).sum().backward()
    parts = [None] * n
    dist.all_gather_object(parts, layer.weight.grad.detach())
    errs = {"output": float((ya - yb).abs().max()), "input gradient": float((xa.grad - xb.grad).abs().max()),
            "weight gradient": float((torch.cat(parts, 0) - full.weight.grad).abs().max())}
    bad = [k for k, v in errs.items() if not v <= 1e-5]
    return {"ok": not bad, "why": ", ".join(f"{k} off by {errs[k]:.1e}" for k in bad), "answered": True}


def gather_check(cluster, name: str, cfg: dict | None = None) -> dict:
    """Check a %%px-defined column-parallel linear with a gathered output against the unsharded nn.Linear."""
    cfg = {**TP_CFG, **(cfg or {})}
    out = _run(cluster, engine_gather, cfg, name)
    why = "; ".join(f"rank {i}: {r['why']}" for i, r in enumerate(out) if not r["ok"])
    return {"ok": all(r["ok"] for r in out), "answered": all(r["answered"] for r in out), "why": why}
