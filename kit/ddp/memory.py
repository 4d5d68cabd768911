"""What each rank holds at its peak during a step (kit.comm.dp.PeakMeter), against ZeRO's formulas (notebook 05
section 6): stage 0 (DDP: everything replicated), 1 (the optimizer state sharded), 2 (+ the gradients), 3 (+ the
parameters: FSDP). With SGD + momentum the full state is 3K: parameters, gradients, momentum, K bytes each.

    print(memory_table(x))   # per stage: the formula's share of 3K (+ the step's temporaries), the measured peak
    memory_checks(x)         # [Check]: each sharded scheme's peak within its bound; ZeRO-1 with small pieces < DDP

ZeRO's formulas count the state; a step also holds temporaries: FSDP2 gathers one layer (its unit) at a time,
so at its peak a rank holds 3K/N plus that layer's full parameters and gradients (Zhao et al., VLDB 2023: the peak
is the shards plus the largest unsharded unit); ZeroSGD's scatter-reduce receives into two buffers of a piece (or
a chunk, if smaller); dp.Buckets holds its flat copies until finish().
"""
from __future__ import annotations

from kit.checks import Check
from kit.comm.dp import ZeroSGD
from kit.comm.ring import scratch_numel

MEMORY_TOL = 0.20            # the measured peak may exceed the formula's share by 20% (padding, small tensors)
# stage -> the share of 3K per rank as a function of N: 0 nothing sharded (DDP), 1 the optimizer state, 2 + the
# gradients, 3 + the parameters (FSDP)
STAGES = {0: lambda N: 1.0, 1: lambda N: (2 + 1 / N) / 3, 2: lambda N: (1 + 2 / N) / 3, 3: lambda N: 1 / N}
UNSEEN = ("horovod", "ddp_fp16")     # schemes with temporaries the meter cannot see (C++ buffers): "≥"


def formula(stage: int, N: int) -> float:
    """Return ZeRO stage `stage`'s bytes per rank as a share of the full state (params + grads + momentum)."""
    return STAGES[stage](N)


def unit_bytes(x: dict) -> int:
    """Return the bytes of the model's largest Linear (weight and bias, float32): FSDP2's largest unit here."""
    sizes = x["cfg"]["sizes"]
    return max(4 * (a * b + b) for a, b in zip(sizes, sizes[1:]))


def scratch_bytes(x: dict, piece_bytes: int = ZeroSGD.PIECE_BYTES) -> int:
    """Return the bytes of ZeroSGD's two ring receive buffers (kit.comm.ring.make_scratch) for this model and N."""
    return 2 * 4 * scratch_numel(-(-x["K"] // 4 // x["N"]) * x["N"], x["N"], piece_bytes // 4)


def stage_of(row: dict) -> int:
    """Return the ZeRO stage a scheme's row measures: 1 for ZeroSGD, 3 for FSDP2, else 0."""
    return {"zero": 1, "fsdp": 3}.get(row["scheme"].partition(":")[0], 0)


def temporary_share(row: dict, x: dict) -> float:
    """Return the share of 3K a row's step holds beyond its stage's formula: for ZeRO-1 its ring's two receive
    buffers (its row's pieces), for ZeRO-3 (FSDP2) one unsharded unit's parameters and gradients, for dp.Buckets
    its flat copies of every gradient (K), else nothing seen."""
    kind, _, arg = row["scheme"].partition(":")
    if kind == "zero":
        return scratch_bytes(x, int(arg) if arg else ZeroSGD.PIECE_BYTES) / (3 * x["K"])
    return {"fsdp": 2 * unit_bytes(x), "buckets": x["K"]}.get(kind, 0) / (3 * x["K"])


def bound(row: dict, x: dict) -> float:
    """Return the share of 3K a row's rank may hold at its peak: its stage's formula plus its temporaries."""
    return formula(stage_of(row), x["N"]) + temporary_share(row, x)


def peak_share(row: dict, K: int) -> float:
    """Return a row's peak (PeakMeter: params + grads + optimizer state + temporaries at once) over 3K."""
    return row["peak"]["total"] / (3 * K)


def memory_table(x: dict) -> str:
    """The Markdown table of each measured scheme's peak: its ZeRO stage, the formula's share of 3K plus its step's
    temporaries, the measured share and its parts in bytes (≥: a scheme with buffers in C++ the meter cannot
    see); stage 2 (not implemented here) as its formula alone."""
    N, K = x["N"], x["K"]
    rows = sorted((r for r in x["rows"] if r.get("peak") and r["scheme"] != "local"), key=stage_of)
    out = [f"| stage | scheme | formula (N = {N}) | + temporaries | predicted | peak share | params B | grads B "
           "| optimizer B | temporary B |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if stage_of(r) == 3 and not any(row.startswith("| 2 ") for row in out):
            out.append(f"| 2 | – | {formula(2, N):.3f} | – | – | – | – | – | – | – |")
        p, ge = r["peak"], "≥ " * (r["scheme"].partition(":")[0] in UNSEEN)
        out.append(f"| {stage_of(r)} | {r['label']} | {formula(stage_of(r), N):.3f} | {temporary_share(r, x):.3f} | "
                   f"{bound(r, x):.3f} | {ge}{peak_share(r, K):.3f} | {p['params']:,} | {p['grads']:,} | "
                   f"{p['optimizer']:,} | {ge}{p['temporary']:,} |")
    return "\n".join(out)


def memory_checks(x: dict) -> list[Check]:
    """Each measured sharded scheme's peak share within MEMORY_TOL of its bound (the formula + its temporaries), and
    each ZeRO-1 row with pieces smaller than its chunk below DDP's peak (rows without a peak: none)."""
    out, ddp = [], next((r for r in x["rows"] if r["scheme"].startswith("ddp:") and r.get("peak")), None)
    for r in x["rows"]:
        if stage_of(r) and r.get("peak"):
            share, limit = peak_share(r, x["K"]), bound(r, x) * (1 + MEMORY_TOL)
            out.append(Check(f"peak share: {r['label']}", share, f"≤ {limit:.3f}", share <= limit))
            if r["scheme"].startswith("zero:") and ddp:
                ratio = r["peak"]["total"] / ddp["peak"]["total"]
                out.append(Check(f"peak / DDP's: {r['label']}", ratio, "< 1", ratio < 1))
    return out
