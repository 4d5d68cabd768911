"""Horovod against DDP in notebook 05: Horovod's own timeline of its steps, recorded in a job of its own, and the
sentence that compares the two from a run's numbers.

    row = kit.ddp.horovod_timeline(n=3)          # the horovod scheme alone, its engines allowing hvd.start_timeline
    x["horovod_timeline"] = row
    kit.ddp.horovod_note(x)                      # Horovod's steps against DDP's, and where Horovod's time went
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


def horovod_note(x: dict) -> str:
    """Horovod's DistributedOptimizer against DDP on a run, from its numbers: median and spread of the steps, and
    where Horovod's time went by its own timeline (on the wire, negotiating), when x["horovod_timeline"] holds a
    horovod_timeline() run."""
    h, d = by_scheme(x)["horovod"], first(x, "ddp")
    (lo, hi), (dlo, dhi) = h["step_ms_range"], d["step_ms_range"]
    out = (f"Horovod's DistributedOptimizer handed the {h['calls']} gradients one by one to its background thread, "
           f"which fuses whatever is ready each cycle: {h['step_ms']:.1f} ms per step (median; {lo:.0f}–{hi:.0f} over "
           f"the steps) against DDP's {d['step_ms']:.1f} ({dlo:.0f}–{dhi:.0f}), "
           + ("with the same weights." if h["ok"] else "and NOT the same weights."))
    if lo <= 1.2 * d["step_ms"] < h["step_ms"] / 1.5:
        out += " Its fastest steps match DDP's median; its median is set by steps that wait."
    t = x.get("horovod_timeline")
    hs = t and t.get("horovod_steps")
    if not hs:
        return out
    med = lambda key: float(np.median([st[key] for st in hs]))   # noqa: E731
    worst = max(hs, key=lambda st: st["span"])
    ratio = t["step_ms"] / h["step_ms"]
    versus = (f"{1 / ratio:.1f}× faster than in the run above, where the timeline was off: so much does Horovod's "
              "step move from one job to the next on this machine, more than any cost of the timeline"
              if ratio < 1 / 1.2 else f"{ratio:.1f}× the run above, where the timeline was off" if ratio > 1.2 else
              "about as in the run above, where the timeline was off")
    out += (f" In a job of its own with Horovod's timeline on (rank 0 records every rank's collectives), Horovod took "
            f"{t['step_ms']:.1f} ms a step (median), {versus}. Its timeline says where the time between a step's "
            f"first gradient and its last sum went, per step (median of {len(hs)}): {med('span'):.1f} ms in all, "
            f"{med('wire'):.1f} ms with a fused allreduce on the wire ({med('allreduces'):.0f} of them), and "
            f"{med('negotiation'):.1f} ms with a gradient still negotiating, that is waiting until every rank's "
            "background thread had reported it ready (one coordination round a cycle; one gradient can negotiate "
            "while another is summed), and "
            f"{med('idle'):.1f} ms with neither (the thread between cycles, or waiting to run); its longest such "
            f"step, {worst['span']:.0f} ms, negotiated for {worst['negotiation']:.0f} and did neither for "
            f"{worst['idle']:.0f}. DDP negotiates nothing: every rank launches the same buckets in the same order.")
    if x.get("cores"):
        out += (f" Here {x['N']} engines, each with a Horovod thread and Gloo's, share {x['cores']} cores, so a "
                "background thread can wait for a core before it reports; this run does not measure how much.")
    return out
