"""Notebook 05's schemes on real links (notebook 05 section 8; `python -m kit.bench ddp_lab` runs it for N = 2..4):
one engine on each host of a kit.netlab lab, links shaped to `rate`, the bytes counted on each host's NIC.

    x = experiment(cluster)       # on a gloo cluster whose engines sit on lab hosts (one per host)
    claims(x)                     # each lesson checked on the run: [kit.checks.Check]
    table(x)                      # step time and bytes on the wire per scheme against the ring model
    rounds_rows(x), timeline_rows(x)    # the interleaved rounds and the median overlapped step, as table rows
    kit.plots.ddp.plot_overlap_step(x)  # the median overlapped step

On loopback (section 4) nothing limits the bytes, so overlap and compression show little. Here the link does: a
step's allreduces of K bytes need at least 2(N−1)/N·K/B on the wire. What the lessons predict, checked:
  overlap   the overlapped step takes about max(compute, comm), not compute + comm: measured in interleaved rounds
            (`paired`: compute alone, its forward and its optimizer step alone, the per-gradient allreduces alone,
            naive, overlapped), and with a sleep added to each layer's backward: a longer backward that leaves the
            cores free;
  fp16      DDP's fp16 compress hook halves the bytes each NIC sends;
  bytes     what each NIC sends per step is the ring model's 2(N−1)/N per allreduced byte (its payload: the
            bytes less each packet's headers);
  memory    at its peak during a step, FSDP2 (ZeRO-3) holds 1/N of the parameters, gradients and momentum, and
            ZeRO-1 its formula's share (kit.ddp.memory);
  fsdp bytes  FSDP2's bytes against the ring model with Gloo's reduce-scatter counted as the allreduce it is.
"""
from __future__ import annotations

import time

import numpy as np

from kit.checks import Check
from kit.ddp import schemes
from kit.ddp.horovod import horovod_timeline
from kit.ddp.memory import memory_checks
from kit.comm import dp
from kit.netlab.counters import within

SCHEMES = ["local", "naive", "overlap", f"buckets:{4 << 20}", f"ddp:{schemes.DDP_BUCKET}",
           f"ddp_fp16:{schemes.DDP_BUCKET}", "horovod", "zero", "fsdp"]
CFG = dict(reps=15, nic=True)     # on top of kit.ddp.schemes.CFG (its model and batch): NIC counters on
# What the checks allow: the overlapped step within 15% of max(compute, comm); fp16 bytes 0.5 within 3%; NIC bytes
# within 3% of the ring model (the memory checks' bound: kit.ddp.memory).
OVERLAP_SLACK, BYTES_TOL = 0.15, 0.03
SLEEP_S = 0.004                   # the sleep added to each Linear's backward in the `*_sleep` rounds


def paired(cfg: dict, reps: int, sleep_s: float = SLEEP_S) -> dict[str, list[float]]:
    """On every engine, interleaved so that each round sees the same machine: one step of the compute alone
    (`local`), its forward pass alone (`forward`), its optimizer step alone (`step`, on the gradients the `local`
    round left), the overlap scheme's allreduces alone (`comm`: one async
    allreduce per gradient, last layer first), the naive and the overlapped step; then the same compute-alone and
    overlapped steps with `sleep_s` of sleep added to each Linear's backward (`*_sleep`: a longer backward that
    leaves the cores free). Return the seconds of each round."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    rank, world = dist.get_rank(), dist.get_world_size()

    def model(hooks=None, sleep=False):
        m = schemes.make_model(cfg)
        for layer in m if sleep else []:
            if isinstance(layer, torch.nn.Linear):
                layer.register_full_backward_hook(lambda *_: time.sleep(sleep_s))
        finish = hooks(m).finish if hooks else (lambda: None)
        return m, schemes.sgd(m.parameters(), cfg), finish
    steps = {"local": model(), "naive": model(), "overlap": model(dp.Overlap), "local_sleep": model(sleep=True),
             "overlap_sleep": model(dp.Overlap, sleep=True)}
    dp.naive_allreduce_hooks(steps["naive"][0])
    grads = [torch.ones_like(p) for p in steps["local"][0].parameters()][::-1]

    def comm(*_):
        for h in [dist.all_reduce(g, async_op=True) for g in grads]:
            h.wait()
    def forward(x, y):                    # what comes before any gradient exists: no allreduce can overlap it
        F.cross_entropy(steps["local"][0](x), y)
    out = {k: [] for k in ("local", "forward", "step", "comm", "naive", "overlap", "local_sleep", "overlap_sleep")}
    timed = {"comm": comm, "forward": forward, "step": lambda x, y: steps["local"][1].step()}
    for step in range(cfg["warmup"] + reps):
        x, y = schemes.batch(cfg, step, rank, world)
        for key in out:
            dist.barrier()
            t0 = time.perf_counter()
            timed[key](x, y) if key in timed else schemes.train_step(*steps[key], x, y)
            out[key].append(time.perf_counter() - t0)
    return {k: v[cfg["warmup"]:] for k, v in out.items()}


def timeline(cfg: dict, reps: int) -> list[dict]:
    """On every engine: `reps` overlapped steps (after cfg["warmup"]), each as a timeline in ms from its start: when
    forward and backward ended, when finish() returned (every sum in) and when the optimizer's step ended; and
    each gradient's allreduce: when its hook launched it and when Gloo's thread completed it (a callback on the
    Work's future, so a completion during backward is seen when it happens, not when finish() waits for it)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    rank, world = dist.get_rank(), dist.get_world_size()
    t0, grads, chained = [0.0], [], []

    class Timed(dp.Overlap):
        def _launch(self, p):
            super()._launch(p)
            grads.append({"bytes": p.grad.numel() * p.grad.element_size(), "launched": _ms(t0[0])})
            rec = grads[-1]
            chained.append(self.pending[-1][1].get_future().then(lambda _: rec.__setitem__("done", _ms(t0[0]))))
    model = schemes.make_model(cfg)
    hooks, opt, out = Timed(model), schemes.sgd(model.parameters(), cfg), []
    for step in range(cfg["warmup"] + reps):
        x, y = schemes.batch(cfg, step, rank, world)
        grads.clear()
        chained.clear()
        dist.barrier()
        t0[0] = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        forward = _ms(t0[0])
        loss.backward()
        backward = _ms(t0[0])
        hooks.finish()
        summed = _ms(t0[0])
        opt.step()
        end = _ms(t0[0])
        for fut in chained:                 # every completion callback has run
            fut.wait()
        out.append({"rank": rank, "forward": forward, "backward": backward, "summed": summed, "end": end,
                    "allreduces": [dict(g) for g in grads]})
    hooks.remove()
    return out[cfg["warmup"]:]


def _ms(t0: float) -> float:
    return 1e3 * (time.perf_counter() - t0)


def median_step(per_rank: list[list[dict]]) -> dict:
    """Of each step, the timeline of its slowest rank; of those, the step whose end is the median."""
    slowest = [max(ranks, key=lambda t: t["end"]) for ranks in zip(*per_rank)]
    return sorted(slowest, key=lambda t: t["end"])[len(slowest) // 2]


def experiment(cluster, cfg: dict | None = None, names: list[str] | None = None, rate: str | None = None) -> dict:
    """Run `names` (default SCHEMES) on `cluster` (engines on lab hosts), then the interleaved overlap rounds
    (`paired`) and the timed overlapped steps (`timeline`); return kit.ddp.schemes.experiment's result with each
    row's NIC bytes per step, `paired`: per round kind the slowest rank's median ms and its range over the rounds,
    and `timeline`: the median step's slowest rank's timeline."""
    cfg = {**schemes.CFG, **CFG, **(cfg or {})}
    x = schemes.experiment(cluster, cfg=cfg, names=names or SCHEMES, alpha_beta=False)   # the link's B is set
    per_rank = cluster.wait(cluster.view.apply_async(paired, cfg, cfg["reps"]))
    x["paired"] = {}
    for key in per_rank[0]:
        slowest = 1e3 * np.max([r[key] for r in per_rank], axis=0)
        x["paired"][key] = {"ms": float(np.median(slowest)), "range": [float(slowest.min()), float(slowest.max())]}
    x["timeline"] = median_step(cluster.wait(cluster.view.apply_async(timeline, cfg, cfg["reps"])))
    x["rate"] = rate
    return x


def claims(x: dict) -> list[Check]:
    """Each lesson of section 8 checked on the run (kit.checks.Check): overlap (with real compute and with free
    cores), fp16, bytes, fsdp bytes, and the memory checks of kit.ddp.memory when the run measured peaks."""
    return [*overlap_checks(x), fp16_check(x), bytes_check(x), fsdp_bytes_check(x), *memory_checks(x)]


def rounds_rows(x: dict) -> list[dict]:
    """The interleaved rounds (`paired`): per kind the slowest rank's median ms and its range over the rounds; then
    backward (compute − forward − step) and the best step any overlap can reach, forward + max(backward, comm) +
    step."""
    p = x["paired"]
    out = [{"round": k, "median ms": v["ms"], "fastest": v["range"][0], "slowest": v["range"][1]} for k, v in p.items()]
    bwd = p["local"]["ms"] - p["forward"]["ms"] - p["step"]["ms"]
    best = p["forward"]["ms"] + max(bwd, p["comm"]["ms"]) + p["step"]["ms"]
    return out + [{"round": k, "median ms": v, "fastest": "–", "slowest": "–"} for k, v in (("backward", bwd),
                                                                                            ("best overlap", best))]


def overlap_checks(x: dict) -> list[Check]:
    """The overlapped step within OVERLAP_SLACK of max(compute, comm), and, with a sleep in each layer's backward
    (free cores), at least half of what overlap could hide, min(backward, comm), hidden; from the interleaved
    rounds."""
    p = {k: v["ms"] for k, v in x["paired"].items()}
    ratio = p["overlap"] / max(p["local"], p["comm"])
    could = min(p["local_sleep"] - p["forward"] - p["step"], p["comm"])
    hid = (p["local_sleep"] + p["comm"] - p["overlap_sleep"]) / could
    return [Check("overlap: overlapped / max(compute, comm)", ratio, f"≤ {1 + OVERLAP_SLACK:.2f}",
                  ratio <= 1 + OVERLAP_SLACK),
            Check("overlap, backward sleeping: share hidden", hid, "≥ 0.50", hid >= 0.5)]


def fp16_check(x: dict) -> Check:
    """DDP's fp16 compress hook halves the bytes each NIC sends, within BYTES_TOL."""
    ratio = float(np.mean(schemes.first(x, "ddp_fp16")["nic_tx"])) / float(np.mean(schemes.first(x, "ddp")["nic_tx"]))
    return Check("fp16 hook: NIC bytes / DDP's", ratio, f"0.500 ± {BYTES_TOL * 0.5:.3f}",
                 abs(ratio - 0.5) <= BYTES_TOL * 0.5)


def bytes_check(x: dict) -> Check:
    """Every allreduce scheme's (and ZeRO's) NIC payload within BYTES_TOL of the ring model (up to one MSS more for
    each segment TCP resent); the row shows the scheme farthest from it."""
    ring = [r for r in x["rows"] if r["sent"] and r["scheme"] != "fsdp"]
    worst = max(ring, key=lambda r: abs(wire_ratio(r) - 1))
    return Check(f"NIC payload / ring model: {worst['label']}", wire_ratio(worst), f"1 ± {BYTES_TOL:.2f}",
                 _within(worst, worst["sent"]))


def fsdp_bytes_check(x: dict) -> Check:
    """FSDP2's NIC payload against the ring model with Gloo's reduce-scatter counted as the allreduce it is."""
    f = schemes.by_scheme(x)["fsdp"]
    gloo = gloo_bytes(f, x["N"])
    return Check("FSDP2: NIC payload / model (Gloo's reduce-scatter)", _busiest(f)[0] / gloo, f"1 ± {BYTES_TOL:.2f}",
                 _within(f, gloo))


def _busiest(row: dict) -> tuple[float, float]:
    """The payload per step of the host NIC that sent the most bytes, and the TCP segments it resent per step (a run
    recorded before the kit counted packets: its bytes, headers included, and none)."""
    i = max(range(len(row["nic_tx"])), key=lambda k: row["nic_tx"][k])
    return row.get("nic_payload", row["nic_tx"])[i], row.get("nic_retrans", [0] * len(row["nic_tx"]))[i]


def _within(row: dict, model: float) -> bool:
    """The busiest NIC's payload within BYTES_TOL of `model`, allowing one MSS more for each segment resent."""
    sent, resent = _busiest(row)
    return within(sent, model, resent, BYTES_TOL)


def timeline_rows(x: dict) -> list[dict]:
    """The median overlapped step's timeline (`timeline`) in ms from its start: forward's and backward's ends, the
    first allreduce's launch and completion, how many of the allreduces were done when backward ended, the last
    one's completion, the step's end, and the allreduces' span (first launch to last sum) over their time alone."""
    t, comm = x["timeline"], x["paired"]["comm"]["ms"]
    ar = t["allreduces"]
    last = max(a["done"] for a in ar)
    return [{"rank": t["rank"], "forward": t["forward"], "backward": t["backward"], "1st launched": ar[0]["launched"],
             "1st done": ar[0]["done"], "done in backward": sum(a["done"] <= t["backward"] for a in ar),
             "allreduces": len(ar), "last done": last, "step end": t["end"],
             "span / alone": (last - ar[0]["launched"]) / comm}]


def gloo_bytes(row: dict, N: int) -> float:
    """What one rank sends for a row's collectives on Gloo: the ring model, a reduce-scatter costing an allreduce."""
    return sum(dp.wire_bytes("all_reduce" if c.startswith("reduce_scatter") else c, b, N)
               for c, b in row["handed_by"].items())


def wire_ratio(row: dict) -> float:
    """The busiest NIC's payload per step (its bytes less each packet's headers; barriers included) over the ring
    model's bytes per rank."""
    return _busiest(row)[0] / row["sent"]


def table(x: dict, loopback: dict | None = None) -> str:
    """The Markdown table of the lab run: step time, bytes on each NIC against the ring model; the overlap scheme's
    allreduces alone; with `loopback` (section 4's run on one host), its compute alone."""
    out = [f"| scheme (N = {x['N']}, {x.get('rate') or 'lab'}) | step ms | collectives / step | NIC sent per host "
           "per step | ring model | payload / model |", "|---|---:|---:|---:|---:|---:|"]
    for r in x["rows"]:
        ratio = f"{wire_ratio(r):.3f}" if r["sent"] else "–"
        out.append(f"| {r['label']} | {r['step_ms']:.1f} | {schemes.calls_cell(r)} | {max(r['nic_tx']):,.0f} | "
                   f"{r['sent']:,.0f} | {ratio} |")
    out.append(f"| the overlap scheme's allreduces alone | {x['paired']['comm']['ms']:.1f} | "
               f"{schemes.by_scheme(x)['overlap']['calls']} | – | – | – |")
    if loopback and "local" in schemes.by_scheme(loopback):
        out.append(f"| compute only, on loopback (section 4) | {schemes.by_scheme(loopback)['local']['step_ms']:.1f} "
                   "| 0 | – | – | – |")
    return "\n".join(out)


def run(ns=(2, 3, 4), rate: str = "1gbit", cfg: dict | None = None, names: list[str] | None = None,
        timeout: float = 120, say=lambda message: None) -> list[dict]:
    """For each N: a lab of N hosts at `rate`, one engine per host; return one experiment per N (`say` hears
    which N starts)."""
    from kit import cluster as kc
    from kit import netlab
    out = []
    for N in ns:
        say(f"ddp_lab: N = {N}, a lab of {N} hosts at {rate}")
        with netlab.start(hosts=N, rate=rate) as lab:
            with kc.start(n=N, backend="gloo", hosts=lab, timeout=timeout, quiet=True) as c:
                c.init_process_group()
                out.append(experiment(c, cfg, names, rate))
            out[-1]["horovod_timeline"] = horovod_timeline(n=N, cfg={**CFG, **(cfg or {})}, hosts=lab)
    return out
