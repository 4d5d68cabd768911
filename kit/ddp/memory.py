"""What each rank holds at its peak during a step (kit.comm.dp.PeakMeter), against ZeRO's formulas (notebook 05
section 6): stage 0 (DDP: everything replicated), 1 (the optimizer state sharded), 2 (+ the gradients), 3 (+ the
parameters: FSDP). With SGD + momentum the full state is 3K: parameters, gradients, momentum, K bytes each.

    memory_table(x)          # per stage: the formula's share of 3K, the measured peak's share, the parts
    memory_checks(x)         # [Check]: ZeRO-1 within its formula, FSDP2 (ZeRO-3) within 1/N + one unsharded layer

ZeRO's formulas count the state; a step also holds temporaries: FSDP2 gathers one layer (its unit) at a time,
so at its peak a rank holds 3K/N plus that layer's full parameters and gradients (Zhao et al., VLDB 2023: the peak
is the shards plus the largest unsharded unit); dp.Buckets holds its flat copies until finish().
"""
from __future__ import annotations

from kit.checks import Check

MEMORY_TOL = 0.20            # the measured peak may exceed the formula's share by 20% (padding, small tensors)
# stage -> (what is sharded, the scheme that measures it, the share of 3K per rank as a function of N)
STAGES = {0: ("nothing (DDP)", "ddp", lambda N: 1.0),
          1: ("optimizer state", "zero", lambda N: (2 + 1 / N) / 3),
          2: ("+ gradients", None, lambda N: (1 + 2 / N) / 3),
          3: ("+ parameters (FSDP)", "fsdp", lambda N: 1 / N)}


def formula(stage: int, N: int) -> float:
    """Return ZeRO stage `stage`'s bytes per rank as a share of the full state (params + grads + momentum)."""
    return STAGES[stage][2](N)


def unit_bytes(x: dict) -> int:
    """Return the bytes of the model's largest Linear (weight and bias, float32): FSDP2's largest unit here."""
    sizes = x["cfg"]["sizes"]
    return max(4 * (a * b + b) for a, b in zip(sizes, sizes[1:]))


def unsharded_share(stage: int, x: dict) -> float:
    """Return the share of 3K a stage's step holds beyond its formula: for ZeRO-3 (FSDP2) one unsharded unit's
    parameters and gradients, else nothing."""
    return 2 * unit_bytes(x) / (3 * x["K"]) if stage == 3 else 0.0


def bound(stage: int, x: dict) -> float:
    """Return the share of 3K a rank may hold at its peak: the stage's formula plus its unsharded share."""
    return formula(stage, x["N"]) + unsharded_share(stage, x)


def peak_share(row: dict, K: int) -> float:
    """Return a row's peak (PeakMeter: params + grads + optimizer state + temporaries at once) over 3K."""
    return row["peak"]["total"] / (3 * K)


def _row(x: dict, kind: str) -> dict | None:
    return next((r for r in x["rows"] if r["scheme"].partition(":")[0] == kind), None)


def memory_table(x: dict) -> str:
    """The markdown table of ZeRO's stages, the formula's share of the full state against the measured peak, then
    every other scheme's peak (each stage 0: nothing sharded)."""
    N, K = x["N"], x["K"]
    out = [f"| ZeRO stage | sharded | formula (share of 3K, N = {N}) | measured by | peak share | params B | grads B "
           "| optimizer B | temporary B |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    shown = set()
    for stage, (what, kind, _) in STAGES.items():
        r = _row(x, kind) if kind else None
        f = f"{formula(stage, N):.3f}" + (f" + {unsharded_share(3, x):.3f} (one layer unsharded)"
                                          if stage == 3 else "")
        if r is None or "peak" not in r:
            out.append(f"| {stage} | {what} | {f} | – (not implemented here) | – | – | – | – | – |")
            continue
        shown.add(r["scheme"])
        out.append(_table_row(stage, what, f, r, K))
    out += [_table_row(0, "nothing", "1.000", r, K) for r in x["rows"]
            if "peak" in r and r["scheme"] not in shown and r["scheme"] != "local"]
    return "\n".join(out)


def _table_row(stage: int, what: str, f: str, r: dict, K: int) -> str:
    p = r["peak"]
    return (f"| {stage} | {what} | {f} | {r['label']} | {peak_share(r, K):.3f} | {p['params']:,} | {p['grads']:,} | "
            f"{p['optimizer']:,} | {p['temporary']:,} |")


def _stage_check(x: dict, stage: int, name: str) -> Check:
    N, K = x["N"], x["K"]
    r = _row(x, STAGES[stage][1])
    share, limit, p = peak_share(r, K), bound(stage, x), r["peak"]
    held = share <= limit * (1 + MEMORY_TOL)
    parts = (f"parameters {p['params']:,} B, gradients {p['grads']:,} B, optimizer state {p['optimizer']:,} B, "
             f"temporary buffers {p['temporary']:,} B")
    reason = "" if held else (
        f"at its peak the gradients were {p['grads'] / K:.2f}× K and the temporaries {p['temporary'] / K:.2f}× K, "
        f"where the formula has {'K' if stage < 2 else 'K/N'} and " +
        (f"one layer's parameters and gradients ({3 * unsharded_share(3, x):.2f}× K)" if stage == 3 else "none"))
    what = f"ZeRO-{stage}'s {formula(stage, N):.3f}" + (
        f" + one layer unsharded {unsharded_share(stage, x):.3f}" if stage == 3 else "")
    return Check(name, measured=f"{r['label']} held {share:.3f} of the full state {3 * K:,} B at its peak",
                 bound=f"{what} (+{100 * MEMORY_TOL:.0f}%)", held=held, reason=reason,
                 detail=f"At that moment: {parts}")


def memory_checks(x: dict) -> list[Check]:
    """Each measured sharded scheme's peak against its ZeRO stage's formula (rows without a peak: none)."""
    out = []
    for stage, name in ((1, "ZeRO-1 memory"), (3, "FSDP2 memory")):
        r = _row(x, STAGES[stage][1])
        if r is not None and "peak" in r:
            out.append(_stage_check(x, stage, name))
    return out
