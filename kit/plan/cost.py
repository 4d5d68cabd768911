"""Step time and memory per rank of a strategy: `predict(model, cluster, strategy, global_batch)` returns one row of
numbers; `plan(model, cluster, global_batch)` one row per strategy the cluster can hold; `table(rows)` prints them.

The formulas are the notebooks' own, called from where they live: the ring's and the servers' α–β times
(`kit.comm.costmodel`, notebooks 02-03), the pipeline's step and bubble and the micro-batches 1F1B keeps
(`kit.mp.model`, notebook 06); ZeRO's shares of the state (Rajbhandari et al. 2020) are written here once, per
part, in bytes. TERMS says in one line what each term of a row counts.
"""
from __future__ import annotations

import math

from kit.comm import costmodel
from kit.mp import model as mpm
from kit.plan.describe import KINDS, Cluster, Model, PlanError, Strategy, check

TERMS = {
    "compute_s": "forward + backward of this rank's samples through its layers (its 1/tp share of each), s",
    "exposed_comm_s": "communication not hidden behind compute: DP's gradients (all of it, or what outlasts "
                      "backward when overlapped), ZeRO-3/FSDP's gathers, TP's allreduces, PP's sends, s",
    "bubble_s": "a pipeline's idle time: (p−1) micro-batch slots of fill and drain, (p−1)/(m+p−1) of the step, s",
    "step_s": "compute_s + exposed_comm_s + bubble_s",
    "params_bytes": "parameters one rank holds: Ψ·bytes_per_param/(tp·pp), /dp under ZeRO-3 and FSDP",
    "grads_bytes": "gradients one rank holds: as the parameters, /dp from ZeRO-2 on",
    "optimizer_bytes": "optimizer state one rank holds: Ψ·optimizer_bytes_per_param/(tp·pp), /dp from ZeRO-1 on",
    "activations_bytes": "activations kept for backward: samples in flight × layers of the stage × bytes per "
                         "sample and layer (TP: the block's inputs and outputs whole, the rest /tp)",
    "memory_bytes_per_rank": "params + grads + optimizer + activations",
    "fits": "memory_bytes_per_rank <= Cluster.device_memory_bytes",
}


def ring_s(n: int, nbytes: float, link, calls: int = 1) -> float:
    """Seconds of `calls` ring allreduces over n ranks moving nbytes in all: 2(n−1)(calls·α + nbytes/(n·B))."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return float(costmodel.t_comm_ring(n, nbytes, calls * link.alpha_s, link.bandwidth_Bps))


def grad_comm_s(model: Model, cluster: Cluster, s: Strategy, grad_bytes: float) -> tuple[float, float]:
    """Return (seconds of the DP gradient exchange, seconds of its last call) over s.dp ranks."""
    link = cluster.link(s.dp, s.strides["dp"])
    if s.kind == "ps":
        srv = cluster.inter or cluster.intra
        t = float(costmodel.t_comm_ps(s.dp, grad_bytes, srv.alpha_s, srv.bandwidth_Bps, s.servers, srv.overhead_s))
        return t, t
    if s.kind == "ps_colocated":
        t = float(costmodel.t_comm_colocated(s.dp, grad_bytes, link.alpha_s, link.bandwidth_Bps, link.overhead_s))
        return t, t
    if s.kind in ("zero3", "fsdp"):      # gather in forward, gather in backward, reduce-scatter: 1.5x DP's bytes
        t = 1.5 * ring_s(s.dp, grad_bytes, link, calls=model.layers)
        return t, t
    if s.kind in ("zero1", "zero2"):     # reduce-scatter + all-gather: an allreduce's bytes and steps
        t = ring_s(s.dp, grad_bytes, link)
        return t, t
    calls = (math.ceil(grad_bytes / s.bucket_bytes) if s.kind == "dp_bucketed" else model.calls)
    calls = max(1, min(calls, model.calls))
    t = ring_s(s.dp, grad_bytes, link, calls)
    return t, t / calls


def memory(model: Model, s: Strategy, samples_in_flight: float) -> dict:
    """Bytes one rank holds: params, grads, optimizer state (ZeRO's sharding by stage) and activations."""
    split = s.tp * s.pp
    stage = {"zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}.get(s.kind, 0)
    shard = {part: (s.dp if stage >= k else 1) for part, k in (("optimizer", 1), ("grads", 2), ("params", 3))}
    a, whole = model.act_bytes_per_sample_layer, model.tp_whole_bytes_per_sample_layer
    per_layer = whole + (a - whole) / s.tp
    out = {"params_bytes": model.params * model.bytes_per_param / split / shard["params"],
           "grads_bytes": model.params * model.bytes_per_param / split / shard["grads"],
           "optimizer_bytes": model.params * model.optimizer_bytes_per_param / split / shard["optimizer"],
           "activations_bytes": samples_in_flight * model.layers / s.pp * per_layer}
    out["memory_bytes_per_rank"] = sum(out.values())
    return out


def predict(model: Model, cluster: Cluster, strategy: Strategy, global_batch: float) -> dict:
    """Return one row: the strategy's degrees, compute_s, exposed_comm_s, bubble_s, step_s, the memory per rank
    (params, grads, optimizer, activations; bytes) and fits (see TERMS)."""
    s = strategy
    check(model, cluster, s, global_batch)
    batch = global_batch / s.dp                           # samples per DP replica
    mb = batch / s.microbatches                           # samples per micro-batch
    slot = mb * model.layers / s.pp * model.compute_s_per_sample_layer / s.tp   # one micro-batch through one stage
    tp_link, pp_link = cluster.link(s.tp, s.strides["tp"]), cluster.link(s.pp, s.strides["pp"])
    tp_one = ring_s(s.tp, mb * model.boundary_bytes_per_sample, tp_link)       # one TP allreduce of a micro-batch
    p2p = (pp_link.alpha_s + mb * model.boundary_bytes_per_sample / pp_link.bandwidth_Bps) if s.pp > 1 else 0.0
    comm = model.tp_allreduces_per_layer * model.layers / s.pp * tp_one + 2 * p2p   # per slot: TP + send, receive
    tf = slot * (1 - model.backward_share) + comm / 2
    tb = slot * model.backward_share + comm / 2
    step = mpm.step_time(s.pp, s.microbatches, tf, tb)     # (m+p−1)(tf+tb): p = m = 1 is one slot
    bubble = mpm.bubble(s.pp, s.microbatches) * step
    compute, slot_comm = s.microbatches * slot, s.microbatches * comm
    held = mpm.peak_in_flight(s.schedule, s.pp, s.microbatches, 0) * mb
    grad_bytes = model.params * model.bytes_per_param / (s.tp * s.pp)
    dp_s, last_s = grad_comm_s(model, cluster, s, grad_bytes) if s.dp > 1 or s.kind == "ps" else (0.0, 0.0)
    if s.kind in ("dp_overlap", "dp_bucketed"):           # hidden behind backward, except what outlasts it
        dp_s = max(dp_s - model.backward_share * compute, last_s)
    exposed = dp_s + slot_comm
    row = {"kind": s.kind, "dp": s.dp, "tp": s.tp, "pp": s.pp, "microbatches": s.microbatches,
           "schedule": s.schedule if s.pp > 1 else "", "placement": s.placement if s.tp > 1 and s.pp > 1 else "",
           "compute_s": compute, "exposed_comm_s": exposed, "bubble_s": bubble,
           "step_s": step + dp_s, **memory(model, s, held)}
    row["fits"] = row["memory_bytes_per_rank"] <= cluster.device_memory_bytes
    return row


def candidates(model: Model, cluster: Cluster) -> list[Strategy]:
    """One strategy of each kind on all the cluster's ranks: DP family dp = ranks; TP inside one host; PP over
    min(ranks, layers) stages with m = 4p; DP×PP with a stage per host and TP×PP with TP filling each host (where
    a host has more than one rank)."""
    R, H, r = cluster.ranks, cluster.hosts, cluster.ranks_per_host
    p = min(R, model.layers)
    out = [Strategy(k, dp=R) for k in ("dp", "dp_overlap", "dp_bucketed", "zero1", "zero2", "zero3", "fsdp")]
    out += [Strategy("tp", tp=r)] if R == r else []
    out += [Strategy("pp", pp=p, microbatches=4 * p, schedule=sch) for sch in ("afab", "1f1b")]
    if H > 1 and r > 1:                                    # one rank per host: these are PP's row again
        out.append(Strategy("dp_pp", dp=r, pp=H, microbatches=4 * H, placement="tp_across"))
        out.append(Strategy("tp_pp", tp=r, pp=H, microbatches=4 * H))
    return out


def plan(model: Model, cluster: Cluster, global_batch: float, strategies=None) -> list[dict]:
    """Return predict()'s row for each strategy (default: `candidates`) that the cluster can hold, fastest first."""
    rows = []
    for s in strategies if strategies is not None else candidates(model, cluster):
        try:
            rows.append(predict(model, cluster, s, global_batch))
        except PlanError:
            continue
    return sorted(rows, key=lambda r: r["step_s"])


COLUMNS = (("kind", "{}"), ("dp", "{}"), ("tp", "{}"), ("pp", "{}"), ("microbatches", "{}"), ("schedule", "{}"),
           ("compute_s", "{:.4g}"), ("exposed_comm_s", "{:.4g}"), ("bubble_s", "{:.4g}"), ("step_s", "{:.4g}"),
           ("memory_bytes_per_rank", "{:.4g}"), ("fits", "{}"))


def table(rows: list[dict], columns=COLUMNS) -> str:
    """Return the rows as an aligned text table of numbers (one line per row, a header first)."""
    cells = [[name for name, _ in columns]] + [[f.format(r[name]) for name, f in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)


__all__ = ["KINDS", "TERMS", "predict", "plan", "table", "candidates", "memory", "ring_s"]
