"""The lab's committed runs predicted by kit.plan from their own inputs (N, α, bandwidth, compute): each point's
measured and predicted seconds and its error, (predicted − measured) / measured.

    points(results_dir)         step- and exchange-time points of results/ps.json, network.json, ddp_lab.json, mp.json
    memory_points(results_dir)  ddp_lab.json's parameters + gradients + optimizer state per rank against ZeRO's shares

Inputs, per file: ps.json (one host, loopback): its ping-pong α and B and its latency probe's o. network.json (one
rank per lab host at its rate): its link's α and B and its latency probe's o. ddp_lab.json records no link of its
own: network.json's link at the same rate (the same lab), the compute-only row of the same run as compute, and
the run's timeline's backward share. mp.json: the pipeline sweep's stand-in stage times (its cfg) on loopback
(ps.json's link); the placement run's measured compute per stage on loopback and the 1 Gbit/s link between hosts.
ring_cpu.json is skipped: it records no α or bandwidth.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from kit.plan.cost import predict
from kit.plan.describe import Cluster, Link, Model, Strategy

DDP_KINDS = {"naive": ("dp", {}), "overlap": ("dp_overlap", {}), "zero": ("zero1", {}), "fsdp": ("fsdp", {}),
             "horovod": ("dp_bucketed", {"bucket_bytes": 64 * 2**20})}     # Horovod's 64 MB fusion buffer


def _load(results: Path, name: str) -> dict | None:
    path = Path(results) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _point(source: str, label: str, n: int, measured_s: float, predicted_s: float) -> dict:
    return {"source": source, "point": label, "N": n, "measured_s": measured_s, "predicted_s": predicted_s,
            "error": (predicted_s - measured_s) / measured_s}


def _exchange(nbytes: float, cluster: Cluster, strategy: Strategy) -> float:
    """Predicted seconds of one gradient exchange of nbytes (no compute: the benchmarks time the exchange alone)."""
    model = Model(params=max(1, round(nbytes / 4)), layers=1, act_bytes_per_sample_layer=0,
                  compute_s_per_sample_layer=0, tensors=1)
    return predict(model, cluster, strategy, strategy.dp)["step_s"]


def ps_points(x: dict) -> list[dict]:
    ab, o = x["pingpong"], x["latency"]["o"]
    link = Link(ab["alpha"], ab["B"], o)
    out = []
    for part in ("exchange", "training"):
        for r in x[part]:
            c = Cluster(hosts=1, ranks_per_host=r["N"] + r["k"], intra=link)
            t = _exchange(r["K"], c, Strategy("ps", dp=r["N"], servers=r["k"]))
            out.append(_point("ps", f"{part} N={r['N']} k={r['k']} K={r['K']}", r["N"], r["measured_ms"] / 1e3, t))
    return out


NETWORK_KINDS = {"ring": "dp", "torch": "dp", "horovod": "dp", "horovod_mpi": "dp", "byteps": "ps_colocated",
                 "ps": "ps"}


def network_points(x: dict) -> list[dict]:
    link = Link(x["link"]["alpha"], x["link"]["B"], x["latency"]["o"])
    out = []
    for r in x["rows"]:
        kind = NETWORK_KINDS[r["impl"]]
        c = Cluster(hosts=r["N"] + (kind == "ps"), ranks_per_host=1, intra=link, inter=link)
        t = _exchange(r["bytes"], c, Strategy(kind, dp=r["N"]))
        out.append(_point("network", f"{r['impl']} N={r['N']} K={r['bytes']}", r["N"], r["seconds"], t))
    return out


def ddp_model(run: dict, bytes_per_param: float = 4) -> Model:
    """The ddp_lab run's model: its K bytes in `tensors` tensors, its compute-only step, its timeline's backward."""
    local = next(r for r in run["rows"] if r["scheme"] == "local")
    tl, layers = run["timeline"], len(run["cfg"]["sizes"]) - 1
    return Model(params=run["K"] // 4, layers=layers, act_bytes_per_sample_layer=0,
                 compute_s_per_sample_layer=local["step_ms"] / 1e3 / run["cfg"]["batch"] / layers,
                 tensors=run["tensors"], backward_share=tl["backward"] / (tl["forward"] + tl["backward"]),
                 bytes_per_param=bytes_per_param, optimizer_bytes_per_param=4)


def ddp_strategy(scheme: str, n: int) -> tuple[Strategy, float]:
    """The kit.plan strategy of a ddp_lab scheme and the gradient bytes per parameter it sends."""
    kind, _, arg = scheme.partition(":")
    if kind in ("buckets", "ddp", "ddp_fp16"):
        return Strategy("dp_bucketed", dp=n, bucket_bytes=int(arg)), 2 if kind == "ddp_fp16" else 4
    k, kw = DDP_KINDS[kind]
    return Strategy(k, dp=n, **kw), 4


def ddp_points(x: dict, link: Link) -> list[dict]:
    out = []
    for run in x["runs"]:
        c = Cluster(hosts=run["N"], ranks_per_host=1, intra=link, inter=link)
        for r in run["rows"]:
            if r["scheme"] == "local":
                continue                                  # the compute-only row is an input, not a prediction
            s, bpp = ddp_strategy(r["scheme"], run["N"])
            t = predict(ddp_model(run, bpp), c, s, run["cfg"]["batch"] * run["N"])["step_s"]
            out.append(_point("ddp_lab", f"{r['scheme']} N={run['N']}", run["N"], r["step_ms"] / 1e3, t))
    return out


def mp_points(x: dict, loopback: Link, wire: Link | None) -> list[dict]:
    out, cfg = [], x["sweep"]["cfg"]
    for r in x["sweep"]["rows"]:               # stand-in stages: each sleeps tf forward and tb backward
        model = Model(params=cfg["d"] * cfg["d"] * r["p"], layers=r["p"], act_bytes_per_sample_layer=0,
                      compute_s_per_sample_layer=(cfg["tf"] + cfg["tb"]) / cfg["mb"],
                      backward_share=cfg["tb"] / (cfg["tf"] + cfg["tb"]), boundary_bytes_per_sample=4 * cfg["d"])
        c = Cluster(hosts=1, ranks_per_host=r["p"], intra=loopback)
        s = Strategy("pp", pp=r["p"], microbatches=r["m"], schedule=r["schedule"])
        t = predict(model, c, s, r["m"] * cfg["mb"])["step_s"]
        out.append(_point("mp", f"pp {r['schedule']} p={r['p']} m={r['m']}", r["p"], r["step_s"], t))
    pl = x.get("placement")
    if pl and wire is not None:                 # 2 hosts × 2 engines, 2 TP blocks per stage, 1F1B
        cfg = pl["cfg"]
        tf, tb = (v / 1e3 for v in pl["compute_ms"])
        layers = 2 * cfg["blocks"]
        model = Model(params=2 * cfg["d"] * 4 * cfg["d"] * layers, layers=layers, act_bytes_per_sample_layer=0,
                      compute_s_per_sample_layer=2 * (tf + tb) / (cfg["mb"] * cfg["blocks"]),
                      backward_share=tb / (tf + tb), boundary_bytes_per_sample=4 * cfg["d"],
                      tp_allreduces_per_layer=2)
        c = Cluster(hosts=2, ranks_per_host=2, intra=loopback, inter=wire)
        for r in pl["rows"]:
            s = Strategy("tp_pp", tp=2, pp=2, microbatches=cfg["m"], placement=r["placement"])
            t = predict(model, c, s, cfg["m"] * cfg["mb"])["step_s"]
            out.append(_point("mp", f"tp_pp {r['placement']}", 4, r["step_ms"] / 1e3, t))
    return out


def links(results: Path) -> tuple[Link | None, Link | None]:
    """(loopback: ps.json's ping-pong α, B and o; the lab's wire: network.json's α, B and o)."""
    ps, net = _load(results, "ps"), _load(results, "network")
    loop = Link(ps["pingpong"]["alpha"], ps["pingpong"]["B"], ps["latency"]["o"]) if ps else None
    wire = Link(net["link"]["alpha"], net["link"]["B"], net["latency"]["o"]) if net else None
    return loop, wire


def points(results: Path = Path("results")) -> list[dict]:
    """Every time point of the committed lab runs that exist in `results`, predicted."""
    loop, wire = links(results)
    out = []
    if (x := _load(results, "ps")) is not None:
        out += ps_points(x)
    if (x := _load(results, "network")) is not None:
        out += network_points(x)
    if (x := _load(results, "ddp_lab")) is not None and wire is not None:
        out += ddp_points(x, wire)
    if (x := _load(results, "mp")) is not None and loop is not None:
        out += mp_points(x, loop, wire)
    return out


def memory_points(results: Path = Path("results")) -> list[dict]:
    """ddp_lab's parameters + gradients + optimizer state per rank (what each scheme holds between steps) against
    kit.plan's params + grads + optimizer bytes."""
    x, out = _load(results, "ddp_lab"), []
    for run in (x or {}).get("runs", []):
        for r in run["rows"]:
            if r["scheme"] == "local" or "held" not in r:
                continue
            s, bpp = ddp_strategy(r["scheme"], run["N"])
            p = predict(ddp_model(run), Cluster(run["N"], 1, Link(0, 1)), s, run["cfg"]["batch"] * run["N"])
            measured = sum(r["held"][k] for k in ("params", "grads", "optimizer"))
            predicted = p["params_bytes"] + p["grads_bytes"] + p["optimizer_bytes"]
            out.append({"source": "ddp_lab", "point": f"{r['scheme']} N={run['N']}", "N": run["N"],
                        "measured_bytes": measured, "predicted_bytes": predicted,
                        "error": (predicted - measured) / measured})
    return out


def summary(pts: list[dict]) -> dict:
    """Median and worst |error| of the points, and their count."""
    errs = [abs(p["error"]) for p in pts]
    return {"n": len(errs), "median_abs_error": statistics.median(errs) if errs else None,
            "worst_abs_error": max(errs) if errs else None}


def ranking(results: Path = Path("results")) -> list[dict]:
    """Pairs of strategies measured in one run whose step ranges do not overlap (ddp_lab's schemes at each N, mp's
    two placements): whether the prediction orders them as measured."""
    pts = {(p["source"], p["point"]): p for p in points(results)}
    groups = []
    for run in (_load(results, "ddp_lab") or {}).get("runs", []):
        groups.append([(f"{r['scheme']} N={run['N']}", r["step_ms_range"]) for r in run["rows"]
                       if r["scheme"] != "local"])
    pl = (_load(results, "mp") or {}).get("placement")
    if pl:
        groups.append([(f"tp_pp {r['placement']}", r["step_ms_range"]) for r in pl["rows"]])
    out = []
    for group in groups:
        for i, (a, ra) in enumerate(group):
            for b, rb in group[i + 1:]:
                pa, pb = (pts.get(("ddp_lab", k)) or pts.get(("mp", k)) for k in (a, b))
                if pa is None or pb is None or not (ra[1] < rb[0] or rb[1] < ra[0]):
                    continue                              # not predicted, or the ranges overlap: within noise
                same = (pa["measured_s"] < pb["measured_s"]) == (pa["predicted_s"] < pb["predicted_s"])
                out.append({"faster_measured": a if pa["measured_s"] < pb["measured_s"] else b,
                            "slower_measured": b if pa["measured_s"] < pb["measured_s"] else a, "held": same})
    return out


def run_checks(kind: str, predicted_s: float, measured_s: float, predicted_bytes: float, measured_bytes: float,
               step_bound: float, memory_bound: float) -> list:
    """Notebook 07's checks of one strategy run on the lab: its step's error, (predicted − measured) / measured,
    within ±step_bound; its parameters + gradients + optimizer state per rank within ±memory_bound."""
    from kit.checks import Check
    err = (predicted_s - measured_s) / measured_s
    mem = (predicted_bytes - measured_bytes) / measured_bytes
    return [Check(f"{kind}: step error, (predicted − measured) / measured", round(err, 3), f"within ±{step_bound}",
                  abs(err) <= step_bound),
            Check(f"{kind}: parameters + gradients + optimizer state per rank, error", round(mem, 4),
                  f"within ±{memory_bound}", abs(mem) <= memory_bound)]
