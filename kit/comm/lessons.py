"""Notebooks 02 and 03's lessons, each checked on its run as a kit.checks.Check (rendered by kit.checks.markdown):
the algorithms equal one process, the bytes are the formula's, the times grow with N as the α–β model says, the
ring loses small messages to one server at large N, a straggler costs a synchronous server and not an asynchronous
one.

    display(Markdown(kit.checks.markdown([growth_check("one server", ps_rows, 2, 4), ...])))
"""
from __future__ import annotations

from kit.checks import Check
from kit.comm.costmodel import human

GROWTH_TOL = 0.25     # the step's growth from the smallest to the largest N, against the model's: within 25%


def equal_check(name: str, compared: dict[str, bool], bound: str) -> Check:
    """`compared`: {what was compared: equal?}; held when every comparison was equal."""
    wrong = [k for k, v in compared.items() if not v]
    return Check(name, measured=f"{len(compared) - len(wrong)} of {len(compared)} comparisons equal", bound=bound,
                 held=bool(compared) and not wrong,
                 reason=f"not equal: {', '.join(wrong[:5])}" if wrong else "" if compared else "nothing was compared")


def bytes_check(name: str, measured: list[int], model: float, slack: float, formula: str) -> Check:
    """Every rank's counted bytes equal the formula's `model`, within `slack` bytes (chunk rounding)."""
    off = [b for b in measured if abs(b - model) > slack]
    return Check(name, measured=f"{', '.join(f'{b:,}' for b in measured)} bytes per rank",
                 bound=f"{formula} = {model:,.0f} bytes" + (f", up to {slack:,.0f} bytes of rounding" if slack else ""),
                 held=not off, reason=f"{len(off)} rank(s) sent {off[0] - model:+,.0f} bytes off the formula" if off
                 else "")


def growth_check(label: str, rows: dict[int, dict], n_lo: int, n_hi: int, tol: float = GROWTH_TOL) -> Check:
    """`rows`: {N: {"seconds", "model_s"}} of one implementation at one K: its step grew from N = n_lo to n_hi by
    the model's factor, within `tol` (relative)."""
    lo, hi = rows[n_lo], rows[n_hi]
    grew, model = hi["seconds"] / lo["seconds"], hi["model_s"] / lo["model_s"]
    held = abs(grew / model - 1) <= tol
    return Check(f"{label} against N", measured=f"{1e3 * lo['seconds']:.0f} → {1e3 * hi['seconds']:.0f} ms from N = "
                                                f"{n_lo} to {n_hi}, {grew:.2f}×",
                 bound=f"the α–β model's {model:.2f}× within {100 * tol:.0f}%", held=held,
                 reason="" if held else f"measured/model was {lo['seconds'] / lo['model_s']:.2f} at N = {n_lo} and "
                                        f"{hi['seconds'] / hi['model_s']:.2f} at N = {n_hi}: one α and one B, "
                                        "measured once on this lab, do not fit both N")


def small_k_check(ring: dict[int, dict], server: dict[int, dict], K: int, a_ring: float, o: float) -> Check:
    """At small K and the largest N measured, the ring (2(N−1) messages in sequence) is slower than one server
    (N concurrent messages and a per-message overhead o): the regime where the ring loses, measured."""
    n = max(ring)
    loses = [k for k in sorted(ring) if ring[k]["seconds"] > server[k]["seconds"]]
    held = n in loses
    return Check(f"the ring loses at {human(K)}",
                 measured=f"at N = {n} the ring took {1e3 * ring[n]['seconds']:.2f} ms, one server "
                          f"{1e3 * server[n]['seconds']:.2f} ms (the ring slower at N = "
                          f"{', '.join(map(str, loses)) or 'none'})",
                 bound="the ring slower at the largest N", held=held,
                 reason="" if held else f"the ring's messages in sequence cost {1e6 * a_ring:.0f} µs each against "
                                        f"the server's {1e6 * o:.0f} µs per further message: at N = {n} the ring's "
                                        "sequence did not yet outweigh the server's serial overhead",
                 detail=f"The ring paid {1e6 * a_ring:.0f} µs per message in sequence, the server o = {1e6 * o:.0f} µs "
                        "per further message")


def straggler_check(sync_extra_ms: float, async_extra_ms: float, sleep_ms: float, staleness: float) -> Check:
    """A worker sleeping `sleep_ms` per step slows the other workers by at least half of it under the synchronous
    server (they wait at every pull) and by less than half under the asynchronous one (it never waits)."""
    held = sync_extra_ms >= sleep_ms / 2 and async_extra_ms < sleep_ms / 2
    why = ("the synchronous server's workers did not wait for it" if sync_extra_ms < sleep_ms / 2 else
           "the asynchronous server's workers slowed down too: they share the cores with the sleeper's engine")
    return Check("a straggler", measured=f"the other workers {sync_extra_ms:+.1f} ms per step under the synchronous "
                                         f"server, {async_extra_ms:+.1f} ms under the asynchronous one",
                 bound=f"sync ≥ half the {sleep_ms:.0f} ms sleep, async below half", held=held,
                 reason="" if held else why,
                 detail=f"The asynchronous server paid in stale gradients instead (mean staleness {staleness:.2f} "
                        "updates)")
