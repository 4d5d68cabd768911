"""Where tensor and pipeline parallelism go (notebook 06 section 9): 2 lab hosts x 2 engines, loopback inside a
host, a shaped link between hosts; TP inside the host and PP across it, against the reverse.

    with kit.netlab.start(hosts=2, rate="1gbit") as lab:
        with kit.cluster.start(n=4, backend="gloo", hosts=lab) as c:     # ranks 0, 1 on h1; 2, 3 on h2
            c.init_process_group()
            x = placement(c, rate="1gbit")        # step time and each host NIC's bytes, measured and modelled

Each stage is `blocks` tensor-parallel MLP blocks (kit.mp.tensor) on its TP pair; the two stages run 1F1B
(kit.mp.pipeline) over m micro-batches. Only traffic between hosts crosses a NIC (same-host ranks talk over lo).
"""
from __future__ import annotations

import statistics
import time

from kit.checks import Check
from kit.netlab.counters import payload, within

CFG = dict(d=128, mb=1024, m=4, blocks=2, seed=0, reps=6)
PLACEMENTS = {"tp_in_host": "TP inside a host, PP across hosts", "tp_across": "TP across hosts, PP inside a host"}


def layout(placement: str, rank: int) -> tuple[list[int], int, list[int]]:
    """Return (my TP group's ranks, my stage, the ranks of my pipeline, stage by stage) for 4 ranks on 2 hosts."""
    if placement == "tp_in_host":           # h1 = stage 0 (ranks 0, 1), h2 = stage 1 (ranks 2, 3)
        return ([0, 1] if rank < 2 else [2, 3]), rank // 2, [rank % 2, rank % 2 + 2]
    if placement == "tp_across":            # stage 0 = ranks 0, 2 (one per host), stage 1 = ranks 1, 3
        return ([0, 2] if rank % 2 == 0 else [1, 3]), rank % 2, [rank - rank % 2, rank - rank % 2 + 1]
    raise ValueError(f"placement must be one of {sorted(PLACEMENTS)}, got {placement!r}")


def engine_placement(cfg: dict, placements) -> dict:
    """On each of 4 engines: time `reps` 1F1B steps per placement, count this host NIC's bytes; time one K-byte
    allreduce across hosts and one K-byte send per TP rank across hosts (what the model needs)."""
    import socket
    import torch
    import torch.distributed as dist
    from kit.mp import pipeline as pp, tensor
    from kit.netlab.counters import counters
    rank = dist.get_rank()
    if dist.get_world_size() != 4:
        raise ValueError(f"the placement experiment needs 4 ranks (2 hosts x 2), got {dist.get_world_size()}")
    groups = {tuple(g): dist.new_group(g) for g in ([0, 1], [2, 3], [0, 2], [1, 3])}
    d, mb, m, blocks = cfg["d"], cfg["mb"], cfg["m"], cfg["blocks"]
    x, y = pp.data(m * mb, d, cfg["seed"])
    out = {"host": socket.gethostname(), "rank": rank, "runs": {}}
    setups = {}
    for name in placements:
        tp_ranks, stage, pipe = layout(name, rank)
        group = groups[tuple(tp_ranks)]
        full = [tensor.mlp(d, d, cfg["seed"] + i) for i in range(2 * blocks)]
        module = torch.nn.Sequential(*[tensor.parallel_mlp(b, group=group)
                                       for b in full[stage * blocks:(stage + 1) * blocks]])
        setups[name] = (module, stage, pipe)
        out["runs"][name] = {"secs": [], "tx": 0, "rx": 0, "tx_packets": 0, "retrans": 0, "stage": stage}
    for rep in range(cfg["reps"] + 1):                    # the placements take turns; the first round warms up
        for name in placements:
            module, stage, pipe = setups[name]
            c0 = counters()          # before the barrier: no rank of this host can send the step's bytes yet
            dist.barrier()
            t0 = time.perf_counter()
            r = pp.run_step(module, pp.one_f_one_b(2, m, stage), stage=stage, p=2, xs=x.chunk(m) if stage == 0
                            else None, ys=y.chunk(m) if stage == 1 else None, shape=(mb, d), ranks=pipe)
            t1 = time.perf_counter()
            dist.barrier()
            c1 = counters()
            if rep:
                run = out["runs"][name]
                run["secs"].append((t0, t1))
                run["tx"] += (c1["tx"] - c0["tx"]) / cfg["reps"]
                run["rx"] += (c1["rx"] - c0["rx"]) / cfg["reps"]
                run["tx_packets"] += (c1["tx_packets"] - c0["tx_packets"]) / cfg["reps"]
                run["retrans"] += (c1["retrans"] - c0["retrans"]) / cfg["reps"]
                run["loss"], run["events"] = r["loss"], r["events"]
    t = torch.randn(mb, d)
    ar, p2p = [], []
    for _ in range(cfg["reps"] + 1):
        dist.barrier()
        t0 = time.perf_counter()
        if rank in (0, 2):                                 # one allreduce across the link, nothing else running
            dist.all_reduce(t, group=groups[(0, 2)])
        ar.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        if rank < 2:                                       # both TP ranks of h1 send one activation to h2
            dist.send(t, rank + 2)
        else:
            dist.recv(t, rank - 2)
        p2p.append(time.perf_counter() - t0)
    out["t_allreduce"], out["t_p2p"] = statistics.median(ar[1:]), statistics.median(p2p[1:])
    return out


def model_tx(placement: str, cfg: dict) -> float:
    """Return the bytes each host's NIC sends per step by the model (payload, no headers).

    tp_in_host: per micro-batch, each of a host's 2 TP ranks sends its copy of the activation (h1) or of its
    gradient (h2): 2 m K. tp_across: each TP pair allreduces K (the ring sends K per rank for 2 ranks) once per block
    forward (g) and once per block backward (f), except f of the first block (the data needs no gradient): a host
    holds one rank of each stage, so (2 blocks + 2 blocks - 1) m K."""
    K = cfg["mb"] * cfg["d"] * 4
    if placement == "tp_in_host":
        return 2 * cfg["m"] * K
    layout(placement, 0)
    return (4 * cfg["blocks"] - 1) * cfg["m"] * K


def model_steps(cfg: dict, events: list[dict], t_allreduce: float, t_p2p: float) -> dict:
    """Return the model's step time of each placement (seconds), from the compute of the TP-inside run.

    The mean forward and backward of a stage in the tp_in_host run (its allreduces over loopback are nearly free)
    are the compute; tp_in_host adds t_p2p, both TP ranks' activation crossing the link, to every dependency between
    the stages; tp_across adds `blocks` allreduces across the link (t_allreduce each, measured alone) to every
    forward and blocks - 1/2 to every backward (stage 0's first f has nothing to reduce). kit.mp.pipeline.simulate
    plays 1F1B with those times."""
    from kit.mp import pipeline as pp
    tf = statistics.mean(e["t1"] - e["t0"] for e in events if e["kind"] == "F")
    tb = statistics.mean(e["t1"] - e["t0"] for e in events if e["kind"] == "B")
    span = lambda ev: max(e["t1"] for e in ev) - min(e["t0"] for e in ev)   # noqa: E731
    m, k = cfg["m"], cfg["blocks"]
    return {"tp_in_host": span(pp.simulate(pp.one_f_one_b, 2, m, tf, tb, link=t_p2p)),
            "tp_across": span(pp.simulate(pp.one_f_one_b, 2, m, tf + k * t_allreduce, tb + (k - 0.5) * t_allreduce)),
            "tf": tf, "tb": tb}


def placement(cluster, cfg: dict | None = None, rate: str | None = None, placements=tuple(PLACEMENTS)) -> dict:
    """Run both placements on a 4-engine cluster on 2 lab hosts; return step times, NIC bytes, the model's numbers."""
    cfg = {**CFG, **(cfg or {})}
    hosts = [s.hostname for s in sorted(cluster.slots.values(), key=lambda s: s.rank)]
    if cluster.size != 4 or hosts[0] != hosts[1] or hosts[2] != hosts[3] or hosts[0] == hosts[2]:
        raise ValueError(f"placement needs 4 engines on 2 hosts, ranks 0, 1 on one and 2, 3 on the other; got {hosts}")
    per = cluster.wait(cluster.view.apply_async(engine_placement, cfg, list(placements)))
    t_ar = statistics.median(r["t_allreduce"] for r in per if r["rank"] in (0, 2))
    t_p2p = max(r["t_p2p"] for r in per)
    rows = []
    for name in placements:
        steps = [max(r["runs"][name]["secs"][i][1] for r in per) - min(r["runs"][name]["secs"][i][0] for r in per)
                 for i in range(cfg["reps"])]
        by_host = {r["host"]: r["runs"][name]["tx"] for r in per}
        busiest = max(by_host, key=by_host.get)
        packets, retrans = next((r["runs"][name]["tx_packets"], r["runs"][name]["retrans"]) for r in per
                                if r["host"] == busiest)
        rows.append({"placement": name, "label": PLACEMENTS[name], "step_ms": 1e3 * statistics.median(steps),
                     "step_ms_range": [1e3 * min(steps), 1e3 * max(steps)], "nic_tx_by_host": by_host,
                     "nic_tx": by_host[busiest], "nic_tx_packets": packets, "nic_retrans": retrans,
                     "nic_payload": payload(by_host[busiest], packets), "model_tx": model_tx(name, cfg),
                     "loss": max(r["runs"][name]["loss"] for r in per)})
    a, b = (next(r for r in rows if r["placement"] == n) for n in ("tp_in_host", "tp_across"))
    model = model_steps(cfg, [e for r in per for e in r["runs"]["tp_in_host"]["events"]], t_ar, t_p2p)
    for r in rows:
        r["model_step_ms"] = 1e3 * model[r["placement"]]
    return {"cfg": cfg, "rate": rate, "rows": rows, "t_allreduce_ms": 1e3 * t_ar, "t_p2p_ms": 1e3 * t_p2p,
            "compute_ms": [1e3 * model["tf"], 1e3 * model["tb"]], "delta_ms": b["step_ms"] - a["step_ms"],
            "model_delta_ms": b["model_step_ms"] - a["model_step_ms"],
            "timelines": {n: [e for r in per for e in r["runs"][n]["events"] if r["rank"] % 2 == 0 or n == "tp_across"]
                          for n in placements}}


def claims(x: dict, bytes_tol: float = 0.03, factor: float = 2.0) -> list[Check]:
    """Return the placement run's lessons as checks: the busiest host NIC's payload (its bytes less each packet's
    headers, and less at most one MSS for each segment TCP sent again) over the model's, within `bytes_tol`; TP
    across the link slower than TP inside a host, by the model's difference within `factor` either way; both
    placements compute the same loss."""
    a, b = (next(r for r in x["rows"] if r["placement"] == n) for n in ("tp_in_host", "tp_across"))
    out = [Check(f"NIC payload / model ({r['placement']})", measured=r["nic_payload"] / r["model_tx"],
                 bound=f"1 ± {bytes_tol:g}", held=within(r["nic_payload"], r["model_tx"], r["nic_retrans"], bytes_tol))
           for r in (a, b)]
    ratio = x["delta_ms"] / x["model_delta_ms"] if x["model_delta_ms"] > 0 else float("nan")
    rel = abs(a["loss"] - b["loss"]) / max(1.0, abs(a["loss"]))
    return out + [
        Check("step TP across / TP inside", measured=b["step_ms"] / a["step_ms"], bound="> 1",
              held=b["step_ms"] > a["step_ms"], unit="×"),
        Check("step difference / model's", measured=ratio, bound=f"{1 / factor:g}–{factor:g}",
              held=1 / factor <= ratio <= factor, unit="×"),
        Check("loss of the two placements (relative)", measured=rel, bound="≤ 1e-05", held=rel <= 1e-5)]
