"""The formulas of model parallelism: the pipeline bubble, activations held, tensor-parallel bytes, memory per rank."""
from __future__ import annotations

SCHEDULES = ("afab", "1f1b")


def _check(p: int, m: int):
    for name, v in (("p", p), ("m", m)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1 (stages p, micro-batches m), got {v!r}")


def bubble(p: int, m: int) -> float:
    """Return the idle share of a pipeline step, (p-1)/(m+p-1), for AFAB and 1F1B alike (equal stage times)."""
    _check(p, m)
    return (p - 1) / (m + p - 1)


def step_time(p: int, m: int, tf: float, tb: float) -> float:
    """Return a step's time with p equal stages, m micro-batches, forward tf and backward tb each: (m+p-1)(tf+tb)."""
    _check(p, m)
    return (m + p - 1) * (tf + tb)


def peak_in_flight(schedule: str, p: int, m: int, stage: int) -> int:
    """Return how many micro-batches' activations stage `stage` holds at most: AFAB all m, 1F1B min(m, p - stage)."""
    _check(p, m)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in 0..{p - 1} for p={p} stages, got {stage!r}")
    return m if schedule == "afab" else min(m, p - stage)


def tp_handed_bytes(batch: int, hidden: int, blocks: int = 1, itemsize: int = 4) -> int:
    """Return the bytes a tensor-parallel MLP hands to allreduce per step: 2 allreduces (g forward, f backward) of
    batch x hidden per block."""
    return 2 * blocks * batch * hidden * itemsize


def ring_sent(handed: float, n: int) -> float:
    """Return the bytes one rank sends for allreduces of `handed` bytes over n ranks by the ring: 2(n-1)/n each."""
    return 2 * (n - 1) / n * handed if n > 1 else 0.0


def memory_per_rank(params: int, activations: int, *, n: int = 1, scheme: str = "dp", whole: int | None = None,
                    itemsize: int = 4, opt_states: int = 2) -> dict:
    """Return bytes per rank of params, grads, optimizer state and activations for `scheme` over n ranks, all on
    one global batch (`activations`: what one process keeps for that batch).

    "dp": state whole, activations 1/n (each rank 1/n of the batch); "zero3"/"fsdp": state and activations 1/n;
    "pp": each rank 1/n of the layers, so 1/n of both; "tp" (Megatron, no sequence parallelism): state 1/n, but
    each block's input and output are whole on every rank: `whole` (their bytes) stays, the rest splits."""
    allowed = ("dp", "zero3", "fsdp", "tp", "pp")
    if scheme not in allowed:
        raise ValueError(f"scheme must be one of {allowed}, got {scheme!r}")
    if scheme == "tp" and whole is None:
        raise ValueError("scheme='tp' keeps each block's input and output whole on every rank: pass whole= their "
                         "bytes (the rest of the activations splits n ways)")
    state = {"params": params * itemsize, "grads": params * itemsize, "optimizer": opt_states * params * itemsize}
    out = {k: v * (1 if scheme == "dp" else 1 / n) for k, v in state.items()}
    out["activations"] = whole + (activations - whole) / n if scheme == "tp" else activations / n
    out["total"] = sum(out.values())
    return out
