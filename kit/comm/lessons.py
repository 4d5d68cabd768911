"""Notebooks 02 and 03's (and appendices 02a and 03a's) lessons checked on a run: each function returns a
kit.checks.Check of numbers; the claim and why it should hold are static Markdown in the notebook.

    kit.checks.show([growth_check("one server", ps_rows, 2, 4), small_k_check(ring_rows, ps_rows), ...])
"""
from __future__ import annotations

import math

from kit.checks import Check

GROWTH_TOL = 0.25     # a step's growth from the smallest to the largest N against the model's: within 25%
NOISE = 1.1           # one time over another by more than 10%: a difference; within it: noise, no ranking
BYTES_TOL = 0.02      # NIC bytes against the model's payload: within 2% (headers and ACKs ride along)
OWN_LINE = (0.8, 1.25)  # the ring's call / its own sweep's fitted line: inside this band the line fits


def equal_check(name: str, compared: dict[str, bool]) -> Check:
    """`compared`: {what was compared: equal?}; held when there was something to compare and all of it was equal."""
    equal = sum(bool(v) for v in compared.values())
    return Check(name, measured=f"{equal} of {len(compared)}", bound=f"{len(compared)} of {len(compared)}",
                 held=bool(compared) and equal == len(compared))


def bytes_check(name: str, measured: list[int], model: float, slack: float) -> Check:
    """Every rank's counted bytes equal the formula's `model`, within `slack` bytes (chunk rounding)."""
    worst = max(abs(b - model) for b in measured)
    return Check(name, measured=round(worst, 1), bound=f"≤ {slack:g}", held=worst <= slack, unit=" B off")


def nic_check(name: str, sent: float, model: float, tol: float = BYTES_TOL) -> Check:
    """Bytes a NIC counted against the model's payload: their ratio within 1 ± `tol`."""
    ratio = sent / model
    return Check(name, measured=ratio, bound=f"1 ± {tol:g}", held=abs(ratio - 1) <= tol, unit="×")


def growth_check(label: str, rows: dict[int, dict], n_lo: int, n_hi: int, tol: float = GROWTH_TOL) -> Check:
    """`rows`: {N: {"seconds", "model_s"}}: the step grew from N = n_lo to n_hi by the model's factor, within `tol`."""
    grew = rows[n_hi]["seconds"] / rows[n_lo]["seconds"]
    model = rows[n_hi]["model_s"] / rows[n_lo]["model_s"]
    return Check(f"{label}: t(N={n_hi}) / t(N={n_lo})", measured=grew, bound=f"{model:.2f} ± {tol:.0%}",
                 held=abs(grew / model - 1) <= tol, unit="×")


def slower_check(name: str, slow: float, fast: float, noise: float = NOISE) -> Check:
    """`slow` took longer than `fast` by more than the noise band: slow / fast > `noise`."""
    return Check(name, measured=slow / fast, bound=f"> {noise:g}", held=slow / fast > noise, unit="×")


def same_check(name: str, a: float, b: float, noise: float = NOISE) -> Check:
    """`a` and `b` equal within the noise band: 1/noise ≤ a / b ≤ noise."""
    return Check(name, measured=a / b, bound=f"{1 / noise:.2f}–{noise:.2f}", held=1 / noise <= a / b <= noise,
                 unit="×")


def small_k_check(ring: dict[int, dict], server: dict[int, dict]) -> Check:
    """At the largest N and a small K the ring (2(N−1) messages in sequence) is slower than one server."""
    n = max(ring)
    return slower_check(f"small K, N={n}: ring / one server", ring[n]["seconds"], server[n]["seconds"])


def straggler_checks(sync_extra_ms: float, async_extra_ms: float, sleep_ms: float) -> list[Check]:
    """A worker sleeping `sleep_ms` per step slows the others by at least half of it under the synchronous server
    (they wait at every pull) and by less than half under the asynchronous one (it never waits)."""
    half = sleep_ms / 2
    return [Check("straggler, sync: the others' extra step", measured=sync_extra_ms, bound=f"≥ {half:g}",
                  held=sync_extra_ms >= half, unit=" ms"),
            Check("straggler, async: the others' extra step", measured=async_extra_ms, bound=f"< {half:g}",
                  held=async_extra_ms < half, unit=" ms")]


def refined_check(closer: int, n: int) -> Check:
    """Appendix 02a: the refined one-host model was nearer the measurement than the plain one for ≥ 2/3 of the `n`
    exchanges (`closer` of them)."""
    need = math.ceil(2 * n / 3)
    return Check("exchanges the refined model predicts better", measured=closer, bound=f"≥ {need} of {n}",
                 held=closer >= need)


def own_line_check(t2: float, own: float, band: tuple[float, float] = OWN_LINE) -> Check:
    """Appendix 03a: the ring's N = 2 call `t2` within `band` of `own`, what its own sweep's fitted α and B predict."""
    return Check("ring at N=2 / its own sweep's line", measured=t2 / own, bound=f"{band[0]:g}–{band[1]:g}",
                 held=band[0] <= t2 / own <= band[1], unit="×")


def above_model_check(name: str, grew: float, model_grew: float) -> Check:
    """Appendix 03a: on one box the ring's step grows with N by more than the model's factor."""
    return Check(name, measured=grew, bound=f"> {model_grew:.2f}", held=grew > model_grew, unit="×")
