"""What each rank holds at its peak during a step (kit.comm.dp.PeakMeter), against ZeRO's formulas (notebook 05
section 6): stage 0 (DDP: everything replicated), 1 (the optimizer state sharded), 2 (+ the gradients), 3 (+ the
parameters: FSDP). With SGD + momentum the full state is 3K: parameters, gradients, momentum, K bytes each.

    memory_table(x)          # per stage: the formula's share of 3K, the measured peak's share, the parts
    memory_checks(x)         # [Check]: ZeRO-1 within its formula, FSDP2 (ZeRO-3) within 1/N
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


def peak_share(row: dict, K: int) -> float:
    """Return a row's peak (PeakMeter: params + grads + optimizer state + temporaries at once) over 3K."""
    return row["peak"]["total"] / (3 * K)


def _row(x: dict, kind: str) -> dict | None:
    return next((r for r in x["rows"] if r["scheme"].partition(":")[0] == kind), None)


def memory_table(x: dict) -> str:
    """The markdown table of ZeRO's stages: the formula's share of the full state against the measured peak."""
    N, K = x["N"], x["K"]
    out = [f"| ZeRO stage | sharded | formula (share of 3K, N = {N}) | measured by | peak share | params B | grads B "
           "| optimizer B | temporary B |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for stage, (what, kind, _) in STAGES.items():
        r = _row(x, kind) if kind else None
        if r is None or "peak" not in r:
            out.append(f"| {stage} | {what} | {formula(stage, N):.3f} | – (not implemented here) | – | – | – | – | – |")
            continue
        p = r["peak"]
        out.append(f"| {stage} | {what} | {formula(stage, N):.3f} | {r['label']} | {peak_share(r, K):.3f} | "
                   f"{p['params']:,} | {p['grads']:,} | {p['optimizer']:,} | {p['temporary']:,} |")
    return "\n".join(out)


def _stage_check(x: dict, stage: int, name: str) -> Check:
    N, K = x["N"], x["K"]
    r = _row(x, STAGES[stage][1])
    share, bound, p = peak_share(r, K), formula(stage, N), r["peak"]
    held = share <= bound * (1 + MEMORY_TOL)
    parts = (f"parameters {p['params']:,} B, gradients {p['grads']:,} B, optimizer state {p['optimizer']:,} B, "
             f"temporary buffers {p['temporary']:,} B")
    reason = "" if held else (
        f"at its peak the gradients were {p['grads'] / K:.2f}× K and the temporaries {p['temporary'] / K:.2f}× K, "
        f"where the formula has {'K' if stage < 2 else 'K/N'} and none")
    return Check(name, measured=f"{r['label']} held {share:.3f} of the full state {3 * K:,} B at its peak",
                 bound=f"ZeRO-{stage}'s {bound:.3f} (+{100 * MEMORY_TOL:.0f}%)", held=held, reason=reason,
                 detail=f"At that moment: {parts}")


def memory_checks(x: dict) -> list[Check]:
    """Each measured sharded scheme's peak against its ZeRO stage's formula (rows without a peak: none)."""
    out = []
    for stage, name in ((1, "ZeRO-1 memory"), (3, "FSDP2 memory")):
        r = _row(x, STAGES[stage][1])
        if r is not None and "peak" in r:
            out.append(_stage_check(x, stage, name))
    return out
