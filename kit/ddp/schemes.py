"""From the ring to DDP and ZeRO (notebook 05; `python -m kit.bench ddp` runs it at benchmark size).

    x = experiment(cluster, cfg={"reps": 10})   # every scheme on the engines: step time, correctness, memory, bytes
    table(x)                                    # what the notebook shows and docs/benchmarks/ddp.md holds
    kit.plots.ddp.plot_schemes(x)               # its figure

The schemes: `local` (no communication: the compute alone), the learner's `naive`, `overlap` and `buckets:<bytes>`
(kit.comm.dp), `ddp:<bytes>` (torch's DistributedDataParallel, bucket_cap_mb) and `ddp_fp16:<bytes>` (with the
fp16 compress comm hook), `horovod` (Horovod's DistributedOptimizer: its tensor fusion and cycle time, at the
engines' Horovod settings), `zero` and `zero:<bytes>` (kit.comm.dp.ZeroSGD; its ring's pieces of 4 MiB, or of
<bytes>) and `fsdp` (FSDP2, torch.distributed.fsdp.fully_shard).
Each starts from the same seeded MLP and trains on its rank's slice of the same global batches; its final weights
are compared with one process training on the N× batch.
"""
from __future__ import annotations

import os
import time

import numpy as np

from kit.comm import costmodel, dp
from kit.netlab.counters import counters, payload

CFG = dict(sizes=(256, 384, 384, 384, 384, 384, 384, 10), batch=64, lr=0.01, momentum=0.9, seed=0, warmup=2, reps=10)
BUCKETS = (16 << 10, 256 << 10, 1 << 20, 4 << 20)      # the bucket-size sweep (bytes)
DDP_BUCKET = 1 << 20                                   # bucket_cap_mb for DDP, in bytes
SMALL_PIECE = 64 << 10                                 # ZeRO-1's ring pieces in its second row (bytes)
# max |w - w_ref| allowed after warmup + reps steps. float32 sums in another order differ by ~1e-7 per step; with
# lr = 0.01 that stayed below 1e-6 over 32 steps (with lr = 0.05 it grew to 2e-5). The fp16 hook rounds
# every gradient to float16 (~5e-4 relative), far above that.
TOL = {"ddp_fp16": 1e-3}
TOL_FLOAT32 = 1e-5
LABELS = {"local": "compute only (no communication)", "naive": "naive: one allreduce per gradient",
          "overlap": "overlap: async, wait before step", "buckets": "buckets", "ddp": "DDP",
          "ddp_fp16": "DDP + fp16 compress hook", "horovod": "Horovod DistributedOptimizer (tensor fusion)",
          "zero": "ZeRO-1 (reduce-scatter, all-gather)", "zero:": "ZeRO-1, ring pieces of",
          "fsdp": "FSDP2 fully_shard"}


def all_schemes(buckets=BUCKETS, ddp_bucket=DDP_BUCKET, piece=SMALL_PIECE) -> list[str]:
    """The schemes of one experiment, in the order they run and are shown."""
    return ["local", "naive", "overlap", *[f"buckets:{b}" for b in buckets], f"ddp:{ddp_bucket}",
            f"ddp_fp16:{ddp_bucket}", "horovod", "zero", f"zero:{piece}", "fsdp"]


def label(scheme: str) -> str:
    """Return a scheme's name as the tables and figures write it."""
    kind, colon, arg = scheme.partition(":")
    return LABELS[kind + colon * (kind == "zero")] + (f" {costmodel.human(int(arg))}" if arg else "")


def md(rows: list[dict]) -> str:
    """A list of dicts with the same keys as a Markdown table, one row each (numbers as kit.checks.fmt writes them)."""
    from kit.checks import fmt
    if not rows:
        return ""
    keys = list(rows[0])
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
                      *("| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows)])


# ----------------------------------------------------------------------------------- on every engine
def make_model(cfg):
    """The MLP of the experiment, the same on every rank (seeded)."""
    import torch
    torch.manual_seed(cfg["seed"])
    layers = []
    for a, b in zip(cfg["sizes"], cfg["sizes"][1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def batch(cfg, step: int, rank: int | None, world: int):
    """Step `step`'s global batch of world × cfg["batch"] samples; rank r gets rows r·B..(r+1)·B (None: all)."""
    import torch
    g = torch.Generator().manual_seed(1000 * cfg["seed"] + step)
    x = torch.randn(world * cfg["batch"], cfg["sizes"][0], generator=g)
    y = torch.randint(0, cfg["sizes"][-1], (world * cfg["batch"],), generator=g)
    if rank is None:
        return x, y
    rows = slice(rank * cfg["batch"], (rank + 1) * cfg["batch"])
    return x[rows], y[rows]


def sgd(params, cfg):
    """Return the experiment's optimizer (SGD with momentum) over `params`."""
    import torch
    return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg["momentum"])


def train_step(model, opt, finish, x, y):
    """One step: forward, backward (the hooks communicate), finish() (wait), the optimizer's step."""
    import torch.nn.functional as F
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    finish()
    opt.step()


def reference(cfg, world: int, steps: int):
    """One process, no communication: `steps` steps of SGD on the whole world × B batch."""
    model = make_model(cfg)
    opt = sgd(model.parameters(), cfg)
    for step in range(steps):
        train_step(model, opt, lambda: None, *batch(cfg, step, None, world))
    return model


def max_diff(model, ref) -> float:
    """Largest |w - w_ref| over all weights (a sharded FSDP2 parameter is gathered first: call on every rank)."""
    out = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out = max(out, float((full.detach() - q.detach()).abs().max()))
    return out


def setup(scheme: str, model, cfg):
    """Wrap `model` for `scheme`; return (model, optimizer, finish), finish() to call between backward and step."""
    import torch
    kind, _, arg = scheme.partition(":")
    finish = lambda: None   # noqa: E731
    if kind == "naive":
        dp.naive_allreduce_hooks(model)
    elif kind == "overlap":
        finish = dp.Overlap(model).finish
    elif kind == "buckets":
        finish = dp.Buckets(model, int(arg)).finish
    elif kind in ("ddp", "ddp_fp16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        # gradient_as_bucket_view: each .grad a view of DDP's bucket, not a copy: K bytes of gradients, as counted
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=int(arg) / 2**20,
                                                          gradient_as_bucket_view=True)
        # allreduce_hook is DDP's default, written in Python: so dp.counting() sees its calls
        model.register_comm_hook(None, default_hooks.fp16_compress_hook if kind == "ddp_fp16"
                                 else default_hooks.allreduce_hook)
    elif kind == "horovod":     # hooks that hand each gradient to Horovod's background thread; step() waits
        import horovod.torch as hvd
        return model, hvd.DistributedOptimizer(sgd(model.parameters(), cfg),
                                               named_parameters=model.named_parameters()), finish
    elif kind == "zero":
        piece = {"piece_bytes": int(arg)} if arg else {}
        return model, dp.ZeroSGD(model.parameters(), cfg["lr"], cfg["momentum"], **piece), finish
    elif kind == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)                       # each Linear: its own all-gather and reduce-scatter
        fully_shard(model)
    elif kind != "local":
        raise ValueError(f"unknown scheme {scheme!r}")
    return model, sgd(model.parameters(), cfg), finish


def run_schemes(names: list[str], cfg: dict) -> list[dict]:
    """On every engine: run each scheme for warmup + reps steps; time each step (after a barrier), count one
    step's collectives, measure what this rank holds, compare the weights with the one-process reference."""
    import torch.distributed as dist
    from kit.mnist.timeline import HorovodTimeline
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = cfg["warmup"] + cfg["reps"]
    ref = reference(cfg, world, steps)
    out = []
    for name in names:
        model, opt, finish = setup(name, make_model(cfg), cfg)
        seconds, calls, c0, peak = [], [], None, None
        trace = HorovodTimeline() if name == "horovod" else None      # records only where the engines allow it
        for step in range(steps):
            x, y = batch(cfg, step, rank, world)
            if step == cfg["warmup"] and trace:
                trace.start()                             # Horovod's own timeline of the timed steps
            if step == cfg["warmup"] and cfg.get("nic"):   # on lab hosts: the NIC's counters around the timed steps
                dist.barrier()
                c0 = counters()
            dist.barrier()
            t0 = time.perf_counter()
            measured = step == cfg["warmup"] - 1                                         # a warmed-up step
            temporaries = getattr(getattr(finish, "__self__", None), "temporaries", None)   # dp.Buckets' flats
            with dp.counting() if measured else _nothing() as seen, \
                    dp.PeakMeter(model, opt, temporaries) if measured else _nothing() as meter:
                train_step(model, opt, finish, x, y)
            seconds.append(time.perf_counter() - t0)
            calls = seen if seen is not None else calls
            peak = meter.peak if meter is not None else peak
        hvd_steps = trace.stop() if trace else None
        nic = None
        if c0 is not None:
            dist.barrier()
            nic = {k: (v - c0[k]) / cfg["reps"] for k, v in counters().items()}     # bytes per timed step
        out.append({"scheme": name, "seconds": seconds[cfg["warmup"]:], "calls": calls, "nic": nic,
                    "held": dp.held_bytes(model, opt), "peak": peak,
                    "err": max_diff(model, ref), "horovod_steps": hvd_steps})
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ----------------------------------------------------------------------------------- the experiment
def experiment(cluster=None, n: int = 3, cfg: dict | None = None, names: list[str] | None = None,
               alpha_beta: bool = True) -> dict:
    """Run every scheme on the engines of `cluster` (or of a gloo job of n engines started, and stopped, here);
    with alpha_beta, also measure B by ping-pong and α as an allreduce of one float pays it on these engines
    (kit.comm.costmodel; the ping-pong's own α is kept beside it). Return the rows and settings."""
    from kit import cluster as kc
    cfg = {**CFG, **(cfg or {})}
    names = names or all_schemes()
    own = cluster is None
    try:
        if own:
            cluster = kc.start(n=n, backend="gloo", quiet=True)
            cluster.init_process_group()
        per_rank = cluster.wait(cluster.view.apply_async(run_schemes, names, cfg))
        ab = costmodel.measure_alpha_beta(cluster, repeats=5, rounds=1) if alpha_beta else None
        if ab is not None:                      # the model's α: what each allreduce pays here, not one message
            ab["allreduce"] = costmodel.measure_allreduce_alpha(cluster)
            ab["pingpong_alpha"], ab["alpha"] = ab["alpha"], ab["allreduce"]["alpha"]
        N = cluster.size
    finally:
        if own and cluster is not None:
            cluster.stop()
    model = make_model(cfg)
    K = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = [scheme_row(name, [r[i] for r in per_rank], N, K, ab) for i, name in enumerate(names)]
    return {"N": N, "cfg": cfg, "K": K, "tensors": len(list(model.parameters())), "rows": rows,
            "alpha_s": ab and ab["alpha"], "B_bytes_per_s": ab and ab["B"], "cores": os.cpu_count(),
            "alpha_pingpong_s": ab and ab["pingpong_alpha"], "allreduce_1float": ab and ab["allreduce"]}


def scheme_row(name: str, ranks: list[dict], N: int, K: int, ab) -> dict:
    """One scheme's row of a run from its per-rank records: the slowest rank's step times, collectives, bytes,
    what each rank held, its error against one process (ab: α and B for the model's time, or None)."""
    kind = name.partition(":")[0]
    err = max(r["err"] for r in ranks)
    calls = ranks[0]["calls"]
    held = {k: max(r["held"][k] for r in ranks) for k in ("params", "grads", "optimizer")}
    slowest = 1e3 * np.max([r["seconds"] for r in ranks], axis=0)          # each step's slowest rank, ms
    row = {"scheme": name, "label": label(name), "step_ms": float(np.median(slowest)),
           "step_ms_range": [float(slowest.min()), float(slowest.max())], "steps_ms": np.round(slowest, 3).tolist(),
           "err": err, "ok": None if kind == "local" else err <= TOL.get(kind, TOL_FLOAT32),
           "calls": len(calls), "handed": sum(b for _, b in calls), "sent": dp.sent_per_step(calls, N),
           "handed_by": {c: sum(b for name, b in calls if name == c) for c, _ in calls},
           "held": held, "state_share": sum(held.values()) / (3 * K),
           "peak": max((r["peak"] for r in ranks), key=lambda p: p["total"])}
    if ranks[0].get("horovod_steps"):             # Horovod's timeline, rank 0's record of every rank's collectives
        ms = ("span", "wire", "negotiation", "idle")
        row["horovod_steps"] = [{k: 1e3 * v if k in ms else v for k, v in st.items()}
                                for st in ranks[0]["horovod_steps"]]
    if ranks[0].get("nic"):                        # lab hosts: what each host's NIC sent and received per step
        row["nic_tx"], row["nic_rx"] = [r["nic"]["tx"] for r in ranks], [r["nic"]["rx"] for r in ranks]
        row["nic_payload"] = [payload(r["nic"]["tx"], r["nic"].get("tx_packets", 0)) for r in ranks]  # less headers
        row["nic_retrans"] = [r["nic"].get("retrans", 0) for r in ranks]                            # segments resent
    if ab is not None and calls and all(c == "all_reduce" for c, _ in calls):
        row["model_comm_ms"] = 1e3 * dp.t_comm_buckets(N, [b for _, b in calls], ab["alpha"], ab["B"])
    return row


def by_scheme(x: dict) -> dict:
    """Return a run's rows keyed by scheme."""
    return {r["scheme"]: r for r in x["rows"]}


def first(x: dict, kind: str) -> dict:
    """The first row of a scheme kind, whatever its bucket size: first(x, "ddp") is the `ddp:<bytes>` row."""
    return next(r for r in x["rows"] if r["scheme"].partition(":")[0] == kind)


def table(x: dict) -> str:
    """The markdown table of every scheme: step time, collectives and bytes per step, correctness."""
    out = ["| scheme | step ms | collectives / step | bytes handed / step | sent per rank (ring model) | "
           "max abs(w − w_ref) |", "|---|---:|---:|---:|---:|---:|"]
    for r in x["rows"]:
        same = "–" if r["ok"] is None else f"{r['err']:.1e} ({'ok' if r['ok'] else 'NOT equal'})"
        out.append(f"| {r['label']} | {r['step_ms']:.1f} | {calls_cell(r)} | {r['handed']:,} | {r['sent']:,.0f} | "
                   f"{same} |")
    return "\n".join(out)


def calls_cell(r: dict) -> str:
    """A row's collectives per step; Horovod's are the gradients handed to it, fused on its own thread."""
    return f"{r['calls']} handed, fused" if r["scheme"] == "horovod" else str(r["calls"])
