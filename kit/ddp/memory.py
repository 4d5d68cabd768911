"""What each rank holds at its peak during a step (kit.comm.dp.PeakMeter), against ZeRO's formulas (notebook 05
section 6): stage 0 (DDP: everything replicated), 1 (the optimizer state sharded), 2 (+ the gradients), 3 (+ the
parameters: FSDP). With SGD + momentum the full state is 3K: parameters, gradients, momentum, K bytes each.

    memory_table(x)          # per stage: the formula's share of 3K, the measured peak's share, the parts
    memory_checks(x)         # [Check]: ZeRO-1 within its formula + its ring's scratch, FSDP2 within 1/N + one layer

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


def scratch_bytes(x: dict) -> int:
    """Return the bytes of ZeroSGD's two ring receive buffers (kit.comm.ring.make_scratch) for this model and N."""
    return 2 * 4 * scratch_numel(-(-x["K"] // 4 // x["N"]) * x["N"], x["N"], ZeroSGD.PIECE_BYTES // 4)


def temporary_share(stage: int, x: dict) -> float:
    """Return the share of 3K a stage's step holds beyond its formula: for ZeRO-1 the ring's two receive buffers,
    for ZeRO-3 (FSDP2) one unsharded unit's parameters and gradients, else nothing."""
    return {1: scratch_bytes(x), 3: 2 * unit_bytes(x)}.get(stage, 0) / (3 * x["K"])


TEMPORARY = {1: "the ring's two receive buffers", 3: "one layer unsharded"}


def bound(stage: int, x: dict) -> float:
    """Return the share of 3K a rank may hold at its peak: the stage's formula plus its unsharded share."""
    return formula(stage, x["N"]) + temporary_share(stage, x)


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
        f = f"{formula(stage, N):.3f}" + (f" + {temporary_share(stage, x):.3f} ({TEMPORARY[stage]})"
                                          if stage in TEMPORARY else "")
        if r is None or "peak" not in r:
            out.append(f"| {stage} | {what} | {f} | – (not implemented here) | – | – | – | – | – |")
            continue
        shown.add(r["scheme"])
        out.append(_table_row(stage, what, f, r, K))
    out += [_table_row(0, "nothing", "1.000", r, K) for r in x["rows"]
            if "peak" in r and r["scheme"] not in shown and r["scheme"] != "local"]
    if any(r["scheme"].partition(":")[0] in UNSEEN for r in x["rows"] if "peak" in r):
        out.append("\n≥: a lower bound. Horovod's fusion buffer and the fp16 hook's half-size copies are allocated "
                   "in C++, where the meter does not see them.")
    return "\n".join(out)


UNSEEN = ("horovod", "ddp_fp16")     # schemes with temporaries the meter cannot see (C++ buffers)


def _table_row(stage: int, what: str, f: str, r: dict, K: int) -> str:
    p, at_least = r["peak"], "≥ " if r["scheme"].partition(":")[0] in UNSEEN else ""
    return (f"| {stage} | {what} | {f} | {r['label']} | {at_least}{peak_share(r, K):.3f} | {p['params']:,} | "
            f"{p['grads']:,} | {p['optimizer']:,} | {at_least}{p['temporary']:,} |")


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
        (f"one layer's parameters and gradients ({3 * temporary_share(3, x):.2f}× K)" if stage == 3 else
         f"the ring's two receive buffers ({3 * temporary_share(1, x):.2f}× K)"))
    what = f"ZeRO-{stage}'s {formula(stage, N):.3f}" + (
        f" + {TEMPORARY[stage]} {temporary_share(stage, x):.3f}" if stage in TEMPORARY else "")
    return Check(name, measured=f"{r['label']} held {share:.3f} of the full state {3 * K:,} B at its peak",
                 bound=f"{what} (+{100 * MEMORY_TOL:.0f}%)", held=held, reason=reason,
                 detail=f"At that moment: {parts}" + (_scratch_note(x) if stage == 1 else ""))


def _scratch_note(x: dict) -> str:
    """Say what ZeRO-1's ring scratch is, and why it does not grow with the model."""
    chunk = 4 * -(-x["K"] // 4 // x["N"])
    piece = ZeroSGD.PIECE_BYTES
    size = (f"a chunk each ({chunk:,} B), because this model's chunk is smaller than a {piece >> 20} MiB piece"
            if chunk < piece else f"a {piece >> 20} MiB piece each")
    return (f". The temporaries are the ring's two receive buffers, {size}: at most two pieces whatever the "
            f"model's size, so on a model whose chunks are many pieces they shrink against the state and ZeRO-1's "
            f"peak tends to its formula's {formula(1, x['N']):.3f} (arithmetic from the two fixed pieces, not "
            "measured here)")


def memory_checks(x: dict) -> list[Check]:
    """Each measured sharded scheme's peak against its ZeRO stage's formula (rows without a peak: none)."""
    out = []
    for stage, name in ((1, "ZeRO-1 memory"), (3, "FSDP2 memory")):
        r = _row(x, STAGES[stage][1])
        if r is not None and "peak" in r:
            out.append(_stage_check(x, stage, name))
    return out
