"""Notebook 05's schemes on real links (notebook 05 section 8; `python -m kit.bench ddp_lab` runs it for N = 2..4):
one engine on each host of a kit.netlab lab, links shaped to `rate`, the bytes counted on each host's NIC.

    x = experiment(cluster)       # on a gloo cluster whose engines sit on lab hosts (one per host)
    claims(x)                     # each lesson checked on the run: [kit.checks.Check]
    table(x)                      # step time and bytes on the wire per scheme against the ring model
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
from kit.netlab.counters import HEADER_BYTES, within

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
    """Each lesson of section 8 checked on the run (kit.checks.Check): overlap, fp16, bytes, fsdp bytes, and the
    memory checks of kit.ddp.memory when the run measured peaks."""
    return [overlap_check(x), fp16_check(x), bytes_check(x), fsdp_bytes_check(x), *memory_checks(x)]


def overlap_check(x: dict) -> Check:
    """The overlapped step within OVERLAP_SLACK of max(compute, comm), read from the interleaved rounds."""
    p = {k: v["ms"] for k, v in x["paired"].items()}
    local, fwd, opt, comm, naive, over = p["local"], p["forward"], p["step"], p["comm"], p["naive"], p["overlap"]
    held = over <= (1 + OVERLAP_SLACK) * max(local, comm)
    hidden, hidden_sleep = local + comm - over, p["local_sleep"] + comm - p["overlap_sleep"]
    bwd = local - fwd - opt                  # only backward can overlap the allreduces: forward and the step cannot
    best = fwd + max(bwd, comm) + opt
    lo, hi = x["paired"]["comm"]["range"]
    detail = (f"Compute alone {local:.1f} ms, the allreduces alone {comm:.1f} ms ({lo:.0f}–{hi:.0f} over the "
              f"rounds), naive step {naive:.1f} ms. The forward pass ({fwd:.1f} ms) runs before any gradient exists "
              f"and the optimizer's step ({opt:.1f} ms) after the last allreduce, so no step can beat forward + "
              f"max(backward, comm) + step = {best:.1f} ms; the overlapped step took {over / best:.2f}× that, and "
              + _hid(hidden, min(bwd, comm)) + ". " + _rounds_vs_table(x, p))
    reason = ""
    if not held:
        could = min(p["local_sleep"] - fwd - opt, comm)
        reason = (_hid(hidden, min(bwd, comm)) + f"; with a {1e3 * SLEEP_S:.0f} ms sleep added to each layer's "
                  f"backward (a longer backward that leaves the cores free: {p['local_sleep']:.1f} ms alone) "
                  + _hid(hidden_sleep, could)
                  + (": here the cores, not the method, were missing; compute and the allreduces' threads share "
                     "them" if hidden_sleep >= max(0.5 * could, hidden + 0.25 * could) else
                     ": even with free cores it hid less than half, so the cores alone do not explain this run"
                     if hidden_sleep > 0 else ""))
    return Check("overlap", measured=f"overlapped step {over:.1f} ms = {over / max(local, comm):.2f}× max(compute, "
                 "comm)", bound=f"≤ {1 + OVERLAP_SLACK:.2f}×", held=held, reason=reason, detail=detail)


def _rounds_vs_table(x: dict, p: dict) -> str:
    """Why the check's times differ from the table's: the rounds interleave their kinds, the table ran one scheme
    after another (each kind's numbers from this run)."""
    rows = schemes.by_scheme(x)
    table = {k: rows[k]["step_ms"] for k in ("local", "naive", "overlap") if k in rows}
    if len(table) < 3:
        return ""
    return (f"These times come from rounds that run compute alone, the allreduces alone, a naive and an overlapped "
            f"step back to back, so each round compares them on the same machine; the table above ran each scheme's "
            f"steps one scheme after another, at other moments, and gave compute alone {table['local']:.1f} ms, "
            f"naive {table['naive']:.1f} and overlapped {table['overlap']:.1f} (here {p['local']:.1f}, "
            f"{p['naive']:.1f}, {p['overlap']:.1f}): the difference is the spread between moments on a shared "
            "machine, which the interleaving keeps out of the comparison")


def fp16_check(x: dict) -> Check:
    """DDP's fp16 compress hook halves the bytes each NIC sends, within BYTES_TOL."""
    ddp, fp16 = schemes.first(x, "ddp"), schemes.first(x, "ddp_fp16")
    with_hook, without = float(np.mean(fp16["nic_tx"])), float(np.mean(ddp["nic_tx"]))
    ratio = with_hook / without
    held = abs(ratio - 0.5) <= BYTES_TOL * 0.5
    return Check("fp16", measured=f"{ratio:.3f}× DDP's bytes on each NIC", bound=f"0.500 ± {BYTES_TOL * 0.5:.3f}",
                 held=held, reason="" if held else f"each NIC sent {with_hook:,.0f} bytes per step with the hook "
                 f"against {without:,.0f} without, not half",
                 detail=f"Each NIC sent {with_hook:,.0f} bytes per step with the fp16 hook, {without:,.0f} without")


def bytes_check(x: dict) -> Check:
    """Every allreduce scheme's (and ZeRO's) NIC payload within BYTES_TOL of the ring model (up to one MSS more for
    each segment TCP resent)."""
    ring = [r for r in x["rows"] if r["sent"] and r["scheme"] != "fsdp"]
    worst = max(ring, key=lambda r: abs(wire_ratio(r) - 1))
    off = wire_ratio(worst) - 1
    held = _within(worst, worst["sent"])
    return Check("bytes", measured=f"the worst scheme ({worst['label']}) sent {1 + off:.3f}× the ring model",
                 bound=f"1 ± {BYTES_TOL:.2f}", held=held, reason="" if held else
                 f"{worst['label']}'s busiest NIC sent {_busiest(worst)[0]:,.0f} bytes of payload per step against "
                 f"the ring model's {worst['sent']:,.0f}",
                 detail=f"Every allreduce scheme's and ZeRO's NIC payload per step (its bytes less {HEADER_BYTES} "
                 f"bytes of headers a packet) within {100 * abs(off):.1f}% of the ring model's 2(N−1)/N per "
                 "allreduced byte")


def fsdp_bytes_check(x: dict) -> Check:
    """FSDP2's NIC payload against the ring model with Gloo's reduce-scatter counted as the allreduce it is."""
    f = schemes.by_scheme(x)["fsdp"]
    gloo = gloo_bytes(f, x["N"])
    ratio = _busiest(f)[0] / gloo
    held = _within(f, gloo)
    return Check("fsdp bytes", measured=f"{ratio:.3f}× the ring model with Gloo's reduce-scatter as an allreduce",
                 bound=f"1 ± {BYTES_TOL:.2f}", held=held, reason="" if held else
                 f"FSDP2's busiest NIC sent {_busiest(f)[0]:,.0f} bytes of payload per step against {gloo:,.0f}",
                 detail=f"FSDP2 sent {wire_ratio(f):.2f}× the ring model's 3(N−1)/N·K: Gloo's reduce-scatter is an "
                 "allreduce whose other chunks are dropped (pytorch/pytorch#118911), so its gradients cost "
                 "2(N−1)/N·K, not (N−1)/N·K (NCCL's reduce-scatter is a real one)")


def _busiest(row: dict) -> tuple[float, float]:
    """The payload per step of the host NIC that sent the most bytes, and the TCP segments it resent per step (a run
    recorded before the kit counted packets: its bytes, headers included, and none)."""
    i = max(range(len(row["nic_tx"])), key=lambda k: row["nic_tx"][k])
    return row.get("nic_payload", row["nic_tx"])[i], row.get("nic_retrans", [0] * len(row["nic_tx"]))[i]


def _within(row: dict, model: float) -> bool:
    """The busiest NIC's payload within BYTES_TOL of `model`, allowing one MSS more for each segment resent."""
    sent, resent = _busiest(row)
    return within(sent, model, resent, BYTES_TOL)


def _hid(ms: float, could: float) -> str:
    if ms < 0:
        return f"nothing was hidden (the overlapped step took {-ms:.1f} ms more than compute + comm)"
    return f"the overlap hid {ms:.1f} of the {could:.1f} ms it could hide"


def timeline_text(x: dict) -> str:
    """What the median overlapped step's timeline shows (`timeline`), in a sentence from its numbers."""
    t, comm = x["timeline"], x["paired"]["comm"]["ms"]
    ar = t["allreduces"]
    first, last = ar[0], max(ar, key=lambda a: a["done"])
    during = sum(a["done"] <= t["backward"] for a in ar)
    span = last["done"] - first["launched"]
    return (f"one overlapped step of rank {t['rank']} (of each step the slowest rank, the median step: {t['end']:.1f} "
            f"ms): forward ended at {t['forward']:.1f} ms and backward at {t['backward']:.1f} ms, its hooks having "
            f"launched all {len(ar)} allreduces; the first ({first['bytes']:,} bytes), launched at "
            f"{first['launched']:.1f} ms, was done at {first['done']:.1f} ms, and {during} of the {len(ar)} were "
            f"done before backward ended; the last was done at {last['done']:.1f} ms, and the step ended at "
            f"{t['end']:.1f} ms. From the first launch to the last sum the allreduces took {span:.1f} ms beside the "
            f"compute, {span / comm:.2f}× the {comm:.1f} ms they took alone (median of the rounds). These steps "
            f"were timed in runs of their own, so this {t['end']:.1f} ms is a third measurement of the overlapped "
            f"step, beside the table's {schemes.by_scheme(x)['overlap']['step_ms']:.1f} and the rounds' "
            f"{x['paired']['overlap']['ms']:.1f}: their spread is the machine's from one moment to the next")


def gloo_bytes(row: dict, N: int) -> float:
    """What one rank sends for a row's collectives on Gloo: the ring model, a reduce-scatter costing an allreduce."""
    return sum(dp.wire_bytes("all_reduce" if c.startswith("reduce_scatter") else c, b, N)
               for c, b in row["handed_by"].items())


def wire_ratio(row: dict) -> float:
    """The busiest NIC's payload per step (its bytes less each packet's headers; barriers included) over the ring
    model's bytes per rank."""
    return _busiest(row)[0] / row["sent"]


def table(x: dict, loopback: dict | None = None) -> str:
    """The markdown table of the lab run: step time, bytes on each NIC against the ring model; with `loopback`
    (notebook 05's section 4 run on one host), a line on the two runs' compute alone."""
    out = [f"| scheme (N = {x['N']}, {x.get('rate') or 'lab'}) | step ms | collectives / step | NIC sent per host "
           "per step | ring model | payload / model |", "|---|---:|---:|---:|---:|---:|"]
    for r in x["rows"]:
        ratio = f"{wire_ratio(r):.3f}" if r["sent"] else "–"
        out.append(f"| {r['label']} | {r['step_ms']:.1f} | {schemes.calls_cell(r)} | {max(r['nic_tx']):,.0f} | "
                   f"{r['sent']:,.0f} | {ratio} |")
    out.append(f"| the overlap scheme's allreduces alone (no compute) | {x['paired']['comm']['ms']:.1f} | "
               f"{schemes.by_scheme(x)['overlap']['calls']} | – | – | – |")
    if loopback and "local" in schemes.by_scheme(loopback):
        here, there = schemes.by_scheme(x)["local"]["step_ms"], schemes.by_scheme(loopback)["local"]["step_ms"]
        out.append(f"\nCompute alone took {here:.1f} ms a step here and {there:.1f} ms in section 4 on loopback "
                   f"({here / there:.1f}×): the same model, batch and framework threads, and no message in either. "
                   f"{x['N']} engines computing at once on this machine's shared cores run at the pace the "
                   "scheduler gives them, which moves from one moment to the next; the rounds below time it again.")
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
