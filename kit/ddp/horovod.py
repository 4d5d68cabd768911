"""Horovod against DDP in notebook 05: Horovod's own timeline of its steps, recorded in a job of its own, and the
two compared as table rows.

    x["horovod_timeline"] = kit.ddp.horovod_timeline(n=3)   # the horovod scheme alone, with hvd.start_timeline
    horovod_rows(x)           # Horovod's steps against DDP's (median, fastest, slowest ms; the same weights)
    negotiation_rows(x)       # where Horovod's time went by its timeline: on the wire, negotiating, neither
"""
from __future__ import annotations

import os

import numpy as np

from kit.ddp.schemes import CFG, by_scheme, first, make_model, run_schemes, scheme_row


def horovod_timeline(n: int = 3, cfg: dict | None = None, hosts=None) -> dict:
    """The horovod scheme alone, in a job of its own whose engines start with HOROVOD_TIMELINE=DYNAMIC, with
    Horovod's own timeline of its timed steps (kit.mnist.timeline.per_step of rank 0's record, in ms). A job of its
    own because Horovod reads the variable at init and, with it set, its background threads exchange more while
    idle (measured here: 48 KB more per PS call on a lab worker's NIC), which would disturb every other scheme.
    `hosts`: a lab (kit.netlab) or host list, as for kit.cluster.start. Return the scheme's row."""
    from kit import cluster as kc
    cfg = {**CFG, **(cfg or {})}
    before = os.environ.get("HOROVOD_TIMELINE")
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"          # the engines started now inherit it (a lab's: CARRY)
    try:
        with kc.start(n=n, backend="gloo", hosts=hosts, quiet=True) as c:
            c.init_process_group()
            per_rank = c.wait(c.view.apply_async(run_schemes, ["horovod"], cfg))
    finally:
        if before is None:
            os.environ.pop("HOROVOD_TIMELINE", None)
        else:
            os.environ["HOROVOD_TIMELINE"] = before
    K = sum(p.numel() * p.element_size() for p in make_model(cfg).parameters())
    return scheme_row("horovod", [r[0] for r in per_rank], n, K, None)


def horovod_rows(x: dict) -> list[dict]:
    """Horovod's DistributedOptimizer against DDP on a run: per scheme its median, fastest and slowest step (ms)
    and whether it ended with one process's weights; and Horovod in a job of its own with its timeline on, where
    x["horovod_timeline"] holds a horovod_timeline() run."""
    runs = [by_scheme(x)["horovod"], first(x, "ddp"), *([x["horovod_timeline"]] if x.get("horovod_timeline") else [])]
    return [{"run": r["label"] + " (timeline on)" * (i == 2), "median ms": r["step_ms"],
             "fastest": r["step_ms_range"][0], "slowest": r["step_ms_range"][1], "same weights": r["ok"]}
            for i, r in enumerate(runs)]


def negotiation_rows(x: dict) -> list[dict]:
    """Horovod's own timeline (x["horovod_timeline"]), from each step's first gradient to its last sum (span, ms):
    the time with a fused allreduce on the wire, with a gradient still negotiating, with neither, and the fused
    allreduces; the median over the timed steps, then the longest step. [] without a timeline run."""
    hs = (x.get("horovod_timeline") or {}).get("horovod_steps") or []
    keys = ("span", "wire", "negotiation", "idle", "allreduces")
    if not hs:
        return []
    worst = max(hs, key=lambda st: st["span"])
    return [{"steps": f"median of {len(hs)}", **{k: float(np.median([st[k] for st in hs])) for k in keys}},
            {"steps": "longest", **{k: worst[k] for k in keys}}]
