"""Notebooks 02 and 03's lessons, each checked on its run as a kit.checks.Check (rendered by kit.checks.markdown):
the algorithms equal one process, the bytes are the formula's, the times grow with N as the α–β model says, the
ring loses small messages to one server at large N, a straggler costs a synchronous server and not an asynchronous
one, the kit's ring beats the plain one; and the paragraphs that report a run's numbers (the lab's link, large and
small messages, the extrapolation), each a function of those numbers that returns Markdown.

    display(Markdown(kit.checks.markdown([growth_check("one server", ps_rows, 2, 4), ...])))
    display(Markdown(bandwidth_note(K, ps_rows, byteps_rows, ring_rows)))
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kit.checks import Check
from kit.comm.costmodel import crossover_bytes, human, latency_share, ring_bytes, t_comm_ps, t_comm_ring
from kit.comm.lab_latency import alpha_parts, colocated_note, ring_loss

GROWTH_TOL = 0.25     # the step's growth from the smallest to the largest N, against the model's: within 25%
SAME = (0.9, 1.1)     # plain ring's time / the kit's ring's within this band: "about the same"; above it the kit's won
SAME_STEP = 1.05      # the servers on the workers' step within 5% of the ring's: "equalled" (bandwidth_note)


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


def straggler_check(sync_extra_ms: float, async_extra_ms: float, sleep_ms: float,
                    staleness: float | None = None) -> Check:
    """A worker sleeping `sleep_ms` per step slows the other workers by at least half of it under the synchronous
    server (they wait at every pull) and by less than half under the asynchronous one (it never waits)."""
    held = sync_extra_ms >= sleep_ms / 2 and async_extra_ms < sleep_ms / 2
    why = ("the synchronous server's workers did not wait for it" if sync_extra_ms < sleep_ms / 2 else
           "the asynchronous server's workers slowed down too: they share the cores with the sleeper's engine")
    return Check("a straggler", measured=f"the other workers {sync_extra_ms:+.1f} ms per step under the synchronous "
                                         f"server, {async_extra_ms:+.1f} ms under the asynchronous one",
                 bound=f"sync ≥ half the {sleep_ms:.0f} ms sleep, async below half", held=held,
                 reason="" if held else why,
                 detail="" if staleness is None else f"The asynchronous server paid in stale gradients instead (mean "
                                                     f"staleness {staleness:.2f} updates)")


def straggler_demo_check(worker: int, sleep_ms: float, sync_extra_ms: float, async_extra_ms: float) -> Check:
    """Return notebook 02's straggler_check as section 5 shows it: the detail says what each server does."""
    return replace(straggler_check(sync_extra_ms, async_extra_ms, sleep_ms),
                   detail=f"Worker {worker} slept {sleep_ms:.0f} ms per step: the synchronous server's other workers "
                          "wait for it at every pull; the asynchronous server never waits, and pays in stale gradients "
                          "instead (left plot above)")


def accuracy_note(acc: dict[str, float], steps: int, batch: int, lr: float, async_updates: int,
                  workers: int = 3) -> str:
    """Return notebook 02's accuracy paragraph: sync against async, and why they are not the same optimisation."""
    return (f"Accuracy: sync {acc['sync']:.1%}, async {acc['async']:.1%}, async + straggler "
            f"{acc['async + straggler']:.1%} (above). They are not the same optimisation: the synchronous server "
            f"applied {steps} updates, each averaging a batch of {batch} at LR = {lr}; the asynchronous one applied "
            f"{async_updates} updates, each one worker's {batch // workers} samples at LR/{workers} (more, noisier "
            "steps, some of them stale). Which reaches the higher accuracy after the same samples depends on the run; "
            "neither is the better algorithm by these numbers alone.")


# ----------------------------------------------------------------------------- the lab's runs, as Markdown
def _ms(r: dict) -> str:
    """Return a row's step time in whole ms ("854 ms")."""
    return f"{r['seconds'] * 1e3:.0f} ms"


def _grew(rows: dict[int, dict], lo: int, hi: int, key: str = "seconds") -> float:
    """Return rows[hi][key] / rows[lo][key]: how much the step (or the model's, key="model_s") grew from N = lo."""
    return rows[hi][key] / rows[lo][key]


def link_note(alpha: float, B: float, link: dict, rate: str) -> str:
    """Return notebook 02's line on the lab's one link measurement: α (median and range of its rounds) and B, and
    how much of α is the link's (`alpha_parts`)."""
    lo, hi = link.get("alpha_range", [alpha, alpha])
    return (f"**One α and one B for every N**: α = {alpha * 1e6:.0f} µs (median of {link.get('rounds', 1)} ping-pong "
            f"rounds; they ranged {lo * 1e6:.0f}–{hi * 1e6:.0f} µs), B = {B / 1e6:.0f} MB/s over {rate} links."
            + alpha_parts(alpha, link))


def bandwidth_note(K: int, ps: dict[int, dict], byteps: dict[int, dict], ring: dict[int, dict]) -> str:
    """Return notebook 02's large-message paragraph: each implementation's step from the smallest to the largest N
    against the model's growth, and the bytes its NICs sent against the model's. Rows: {N: row of the run}."""
    lo, hi = min(ps), max(ps)
    srv = ps[hi]
    r_s, b_s = ring[hi]["seconds"], byteps[hi]["seconds"]
    spread = lambda r: (f" ({r['range'][0] * 1e3:.0f}–{r['range'][1] * 1e3:.0f} over its calls)"   # noqa: E731
                        if r.get("range") else "")
    faster = ("the two were level within " f"{SAME_STEP - 1:.0%}" if max(r_s, b_s) <= SAME_STEP * min(r_s, b_s) else
              "the ring was faster" if r_s < b_s else "the servers on the workers were faster")
    return (f"**Large messages, K = {human(K)}: bandwidth.** One server took {_ms(ps[lo])} per step at N = {lo} "
            f"and {_ms(srv)} at N = {hi}, {_grew(ps, lo, hi):.2f}× (the model: {_grew(ps, lo, hi, 'model_s'):.2f}×; "
            f"measured/model {ps[lo]['seconds'] / ps[lo]['model_s']:.2f} and {srv['seconds'] / srv['model_s']:.2f}). "
            f"At N = {hi} the server's NIC sent {srv['tx'][0] / (hi * K):.3f}× and received "
            f"{srv['rx'][0] / (hi * K):.3f}× N·K per step: every byte passes through its one link. The servers on the "
            f"workers sent {np.mean(byteps[hi]['tx']) / byteps[hi]['model_bytes']:.3f}× 2(N−1)/N·K per host and took "
            f"{_ms(byteps[lo])} → {_ms(byteps[hi])} ({_grew(byteps, lo, hi):.2f}×, model "
            f"{_grew(byteps, lo, hi, 'model_s'):.2f}×); the ring {_ms(ring[lo])} → {_ms(ring[hi])} "
            f"({_grew(ring, lo, hi):.2f}×, model {_grew(ring, lo, hi, 'model_s'):.2f}×). Same bytes, so the model puts "
            f"those two within their latency terms of each other; at N = {hi} {faster} (ring {_ms(ring[hi])}"
            f"{spread(ring[hi])}, servers on the workers {_ms(byteps[hi])}{spread(byteps[hi])}). "
            + _sharded_vs_ring(byteps, ring))


def _sharded_vs_ring(byteps: dict[int, dict], ring: dict[int, dict]) -> str:
    """Return where the servers on the workers equalled (within SAME_STEP) or beat the ring, and what BytePS adds."""
    level = [n for n in sorted(ring) if n in byteps and byteps[n]["seconds"] <= SAME_STEP * ring[n]["seconds"]]
    where = (f"equalled the ring (within {SAME_STEP - 1:.0%}) or beat it at N = {', '.join(map(str, level))}" if level
             else f"were more than {SAME_STEP - 1:.0%} slower than the ring at every N")
    return (f"The sharded servers {where}. BytePS's own gain, K each way per worker instead of 2(N−1)/N·K, needs "
            "servers on extra machines and pushes pipelined with pulls (`t_comm_ps(..., pipelined=True)` in the "
            "model); this lab does not run that arrangement.")


def latency_table(K: int, reps: int, ps: dict[int, dict], byteps: dict[int, dict], ring: dict[int, dict],
                  ring_alpha: dict[int, float]) -> str:
    """Return notebook 02's small-message table: ms per step of each implementation and the ring's time per
    message in sequence (`ring_alpha`: {N or str(N): seconds}), one row per N."""
    ring_alpha = {int(n): s for n, s in ring_alpha.items()}       # a run read back from JSON has str keys
    rows = "\n".join(f"| {n} | {ps[n]['seconds'] * 1e3:.2f} | {byteps[n]['seconds'] * 1e3:.2f} | "
                     f"{ring[n]['seconds'] * 1e3:.2f} | {ring_alpha[n] * 1e6:.0f} |" for n in sorted(ring))
    return (f"**Small messages, K = {human(K)}: latency.** Median ms per step ({reps} calls each):\n\n"
            f"| N | one server | servers on the workers | ring | ring's time / 2(N−1), µs |\n|---|---|---|---|---|\n"
            f"{rows}\n\n" + colocated_note(ps, byteps, ring_alpha))


def latency_note(o_fit: float, alpha: float, o: float, a_ring: float, loses: list[int], n: int, k_star: float) -> str:
    """Return notebook 02's small-message paragraph: the server's fitted o (`o_fit`, and `o` = max(o_fit, 0)), the
    ring's time per message in sequence `a_ring`, the N where the ring was slower, the model's crossover at N = n."""
    server = ("its N messages' latencies overlap and only o is paid per message." if o < alpha else
              "each further worker cost the server more than the link's whole α, so a serial per-message cost, not "
              "the link's latency, set its step: on this machine, mostly waiting for that worker's process to be "
              "scheduled on one of the 2 shared cores.")
    lost = ring_loss(loses, alpha, o, a_ring, said=True)
    return (f"The server's steps against N, with the ping-pong's α, fit 2(α + (N−1)·o) with o = {o_fit * 1e6:.0f} µs, "
            f"{o / alpha:.1f}× α: {server} The ring paid its 2(N−1) messages in sequence, {a_ring * 1e6:.0f} µs each "
            f"(median over N), {a_ring / alpha:.0f}× the ping-pong's α, for the same reason: each step waits until N "
            f"processes have run. {lost} In the model, the ring loses small messages when what each of its messages "
            f"in sequence pays exceeds what each further message costs the server (for large N: {a_ring * 1e6:.0f} "
            f"against {o * 1e6:.0f} µs here); with these numbers it puts the crossover at K* = {human(k_star)} for "
            f"N = {n}. On a cluster, where a message waits for the link rather than for a core, the ring's α is the "
            "link's and o is the server's own CPU time per message (not measured here: this lab's o is what its "
            "shared cores made it); there one server beats the ring below K* = B·((N−2)α − (N−1)o)/(N − (N−1)/N).")


def extrapolation_note(ns, t_one, share: dict[int, float], compute_s: float, o: float, K: float, alpha: float,
                       B: float, a_ring: float | None = None) -> str:
    """Return notebook 02's extrapolation paragraph: one server's time (`t_one`, one per N of `ns`) against the
    compute, the k = 64 column's latency `share` ({N: fraction}), and at the largest N the ring against k = 64 servers
    charged alike: as the lab paid each message (the server α and o, the ring `a_ring` per message in sequence), and
    with the link's α for every message and no o."""
    n = ns[-1]
    wire, o_part = t_comm_ps(n, K, 0, B, 1, 0), t_one[-1] - t_comm_ps(n, K, alpha, B, 1, 0)   # bytes; the lab's o
    a_ring = alpha if a_ring is None else a_ring

    def versus(a_r, o_s):
        ring, k64 = t_comm_ring(n, K, a_r, B), t_comm_ps(n, K, alpha, B, 64, o_s)
        return (f"the ring {ring:.2f} s ({latency_share('ring', n, K, a_r, B):.0%} of it latency) against {k64:.2f} s "
                f"for k = 64 servers: the ring {'loses' if ring > k64 else 'wins'}")
    lab = "" if a_ring == alpha else (
        f"Charged as this lab paid each message (the ring {a_ring * 1e6:.0f} µs per message in sequence, the servers "
        f"α and o as above), at N = {n} {versus(a_ring, o)}. ")
    return (f"One server: already at N={ns[0]} communication takes {t_one[0]:.2f} s per step, "
            f"{t_one[0] / compute_s:.1f}× the assumed {compute_s} s of compute; at N={n} it takes {t_one[-1]:.0f} s, "
            f"so {n} workers train at {compute_s / (compute_s + t_one[-1]):.2%} efficiency. The time grows linearly "
            "in N because every byte passes through the one server's link. k servers divide the bytes by k but need "
            "k links and still grow linearly in N/k. Latency is not negligible everywhere: in the k = 64 column it is "
            f"{share[64]:.0%} of the time at N = 64 and {share[n]:.0%} at N = {n}, with this lab's o = "
            f"{o * 1e6:.0f} µs paid once per worker. That o is what this lab's shared cores made of each further "
            f"message; of one server's {t_one[-1]:.2f} s at N = {n} it is {o_part:.2f} s, the bytes {wire:.2f} s: "
            f"{'the bytes, not o,' if wire > o_part else 'o, more than the bytes,'} make the server collapse. "
            "Notebook 03's ring keeps each link's traffic at 2(N−1)/N·K each way, under 2K whatever N, and pays in "
            f"latency: 2(N−1) messages one after another per step. {lab}Charged the link's α ({alpha * 1e6:.0f} µs) "
            f"for every message and no o, as on a cluster where a message waits for the link rather than for a core, "
            f"{versus(alpha, 0.0)}. Which one wins at scale turns on what a message costs: the ring pays 2(N−1) of "
            "them in sequence.")


# ----------------------------------------------------------------------------- notebook 03
def kit_ring_check(plain_ms: float, kit_ms: float, engines: int, cores: int) -> Check:
    """The kit's ring beats the plain ring on the same 16 MB: over SAME[1]× as fast (best of 3, median over ranks)."""
    speedup = plain_ms / kit_ms
    held = speedup > SAME[1]
    verdict = (f"the kit's ring is {speedup:.2f}× as fast" if held else
               f"the plain ring is {1 / speedup:.2f}× as fast" if speedup < SAME[0] else "about the same")
    return Check("the kit's ring", measured=f"16 MB on {engines} engines, best of 3 (median over ranks): the plain "
                                            f"ring {plain_ms:.1f} ms, the kit's ring {kit_ms:.1f} ms: {verdict}",
                 bound=f"over {SAME[1]}× as fast as the plain ring", held=held,
                 reason="" if held else "the kit's extras (additions overlapping the next receive, pieces passed on "
                                        f"early) need a core to overlap on, and {engines} engines on {cores} cores "
                                        "left none free: on this run they did not pay",
                 detail="Same algorithm, same bytes on the wire" + (
                     "; what the kit adds is fewer copies (the plain ring copies every chunk and allocates every "
                     "incoming one), additions that overlap the next receive, and pieces passed on as soon as they "
                     "are added" if held else ""))


def ring_lab_note(K: int, ring: dict[int, dict], ps: dict[int, dict], alpha: float, B: float, link: dict, rate: str,
                  busbw: dict[str, float], reps: int, ranges: bool) -> str:
    """Return notebook 03's large-message paragraph: the ring's and one server's step from the smallest to the
    largest N against the model, the ring's NIC bytes against 2(N−1)/N·K, `busbw` ({label: share of the link})
    at the largest N; with `ranges`, each median's range over the `reps` calls (the committed JSON has none)."""
    lo, hi = min(ring), max(ring)
    a_lo, a_hi = link.get("alpha_range", [alpha, alpha])
    spread = lambda r: (f" ({r['range'][0] * 1e3:.0f}–{r['range'][1] * 1e3:.0f} over {reps} calls)"   # noqa: E731
                        if "range" in r and reps > 1 and ranges else "")
    fit = lambda r: f"{r['seconds'] / r['model_s']:.2f}"                                            # noqa: E731
    sent = np.mean(ring[hi]["tx"]) / ring[hi]["model_bytes"]
    return (f"The links: {rate} (ping-pong: α = {alpha * 1e6:.0f} µs, median of {link.get('rounds', 1)} rounds that "
            f"ranged {a_lo * 1e6:.0f}–{a_hi * 1e6:.0f} µs; B = {B / 1e6:.0f} MB/s; the same for every N)."
            f"{alpha_parts(alpha, link)} "
            f"K = {human(K)}: the kit's ring took {_ms(ring[lo])}{spread(ring[lo])} at N = {lo} and "
            f"{_ms(ring[hi])}{spread(ring[hi])} at N = {hi} (medians), {_grew(ring, lo, hi):.2f}× (the model: "
            f"{_grew(ring, lo, hi, 'model_s'):.2f}×; its bandwidth term 2(N−1)/N alone: "
            f"{ring_bytes(hi, 1) / ring_bytes(lo, 1):.2f}×). The one-server parameter server took "
            f"{_ms(ps[lo])}{spread(ps[lo])} → {_ms(ps[hi])}{spread(ps[hi])}, {_grew(ps, lo, hi):.2f}× (model "
            f"{_grew(ps, lo, hi, 'model_s'):.2f}×). Measured/model at N = {lo}, {hi}: ring {fit(ring[lo])}, "
            f"{fit(ring[hi])}; PS {fit(ps[lo])}, {fit(ps[hi])}. Each ring host's NIC sent {sent:.3f}× the model's "
            f"2(N−1)/N·K at N = {hi}; busbw at N = {hi}, as a share of the link: "
            f"{', '.join(f'{label} {v:.0%}' for label, v in busbw.items())}.")


def ring_latency_note(K: int, reps: int, ring: dict[int, dict], ps: dict[int, dict], alpha: float, o: float,
                      a_ring: float, loses: list[int], n: int, B: float,
                      gloo: dict[int, dict] | None = None) -> str:
    """Return notebook 03's small-message paragraph: the ring against one server at each N, where the ring was
    slower, its time per message in sequence at each N and their median `a_ring`, Gloo's own C++ ring (`gloo`:
    torch.distributed's rows, when run) against the same server, the server's o and the model's crossover at N = n
    with the link's B (computed here, so that no visible cell computes exercise 3's answer at another N)."""
    k_star = crossover_bytes(n, alpha, B, o, alpha_ring=a_ring)
    times = ", ".join(f"N = {m}: ring {ring[m]['seconds'] * 1e3:.2f} ms, one server {ps[m]['seconds'] * 1e3:.2f} ms"
                      for m in sorted(ring))
    per_msg = ", ".join(f"{ring[m]['seconds'] / (2 * (m - 1)) * 1e6:.0f}" for m in sorted(ring) if m > 1)
    lost = ring_loss(loses, alpha, o, a_ring, said=True) + " "
    c_ring = ""
    if gloo and loses:
        slower = [m for m in sorted(gloo) if m in ps and gloo[m]["seconds"] > ps[m]["seconds"]]
        at = ", ".join(f"N = {m}: {gloo[m]['seconds'] * 1e3:.2f} ms" for m in sorted(gloo))
        c_ring = (f"Gloo's own ring (`torch.distributed`, C++, no Python per step) at the same points: {at}; " + (
            f"slower than one server at N = {', '.join(map(str, slower))}: the loss is the ring's, not only the "
            "kit's Python ring's. " if slower else "slower than one server at none of them: this loss is the kit's "
            "Python ring's per-step cost, not the ring's. "))
    return (f"At K = {human(K)} latency decides ({reps} calls per point, medians): {times}. {lost}Its 2(N−1) "
            f"messages in sequence cost {per_msg} µs each at N = {', '.join(str(m) for m in sorted(ring) if m > 1)} "
            f"(median {a_ring * 1e6:.0f} µs, {a_ring / alpha:.0f}× the ping-pong's α; one N to the next moves it, "
            "and K* below with it): on two shared cores each step waits until N processes have been scheduled. "
            + c_ring + "The server's "
            f"steps fit 2(α + (N−1)·o) with o = {o * 1e6:.0f} µs per further worker, " + (
                f"more than the link's whole α ({alpha * 1e6:.0f} µs): a serial per-message cost, not the link's "
                "latency, set the server's step; each further worker was paid in turn, at the pace the shared cores "
                "ran the processes. " if o > alpha else
                f"less than the link's α ({alpha * 1e6:.0f} µs): the further messages' latencies overlapped, and only "
                "o was paid in turn. ") + "For large N the ring loses small "
            "messages when what each of its messages in sequence pays exceeds the server's o "
            f"({a_ring * 1e6:.0f} against {o * 1e6:.0f} µs here); the model with these numbers puts the crossover at "
            f"K* = {human(k_star)} for N = {n}.")


def at_scale_note(engines: int, plain_ms: float, kit_ms: float, alpha: float, B: float, K: float, n: int = 1024,
                  small: int = 4096, o: float = 0.0, a_ring: float | None = None, lab_alpha: float | None = None,
                  lab_B: float | None = None) -> str:
    """Return notebook 03's closing paragraph: the live rings' 16 MB times, then the model at N = n with this box's
    α and B: the ring against one server at K and at `small` bytes (o = 0), and the crossover below which it loses;
    with the lab's costs (`o` > 0 for the server and `a_ring` per ring message, both as the lab paid them, as
    notebook 02 charges them), the same crossover on that footing, with the lab's α and B (`lab_alpha`, `lab_B`;
    else this box's)."""
    a_lab, b_lab = alpha if lab_alpha is None else lab_alpha, B if lab_B is None else lab_B
    a_r = a_lab if a_ring is None else a_ring
    with_o = crossover_bytes(n, a_lab, b_lab, o, alpha_ring=a_r)
    lab_o = "" if o <= 0 else (
        f" Charged both sides what the lab paid per message (section 6: the server o = {o * 1e6:.0f} µs per further "
        f"worker, the ring {a_r * 1e6:.0f} µs per message in sequence; the lab's α = {a_lab * 1e6:.0f} µs and B = "
        f"{b_lab / 1e6:.0f} MB/s), at "
        f"N = {n} the ring "
        + (f"loses below {human(with_o)}." if with_o > 0 else "never loses.") + " Those are what this box's shared "
        "cores made of each message, not a cluster's.")
    return (f"16 MB on {engines} engines: the plain ring {plain_ms:.1f} ms, the kit's ring {kit_ms:.1f} ms. At scale "
            f"(the model, this box's α = {alpha * 1e6:.0f} µs and B = {B / 1e9:.2f} GB/s), N = {n}, K = {human(K)}: "
            f"ring {t_comm_ring(n, K, alpha, B):.2f} s ({latency_share('ring', n, K, alpha, B):.0%} of it its "
            f"2(N−1) latencies) against {t_comm_ps(n, K, alpha, B):.1f} s for one parameter server; at "
            f"{human(small)} the ring {t_comm_ring(n, small, alpha, B) * 1e3:.0f} ms against "
            f"{t_comm_ps(n, small, alpha, B) * 1e3:.1f} ms (o = 0): its latencies in sequence lose below "
            f"{human(crossover_bytes(n, alpha, B))}." + lab_o)

