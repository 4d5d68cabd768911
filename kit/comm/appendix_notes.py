"""Appendices 02a and 03a's sentences about their runs, from the runs' numbers: 02a's exchanges against the plain
and the refined one-host model (which was the closer, a kit.checks.Check) and notebook 02's MLP exchanges against
the empty ones (mlp_note); 03a's ring on one box against the α–β
model (the gap at N = 2, the ring's own fitted line and its growth with N, as Checks) and 03a's summary.

    print(exchange_fit_line(ab, errs, plain))
    display(Markdown(kit.checks.markdown([refined_check(closer, len(errs), refined_med, plain_med, ...)])))
    display(Markdown(ring_gap_note(K, alpha, B, t2, m2, a_eff, b_eff) + "\n\n" + kit.checks.markdown([...])))
"""
from __future__ import annotations

import json
import os

import numpy as np

from kit.checks import Check
from kit.comm.costmodel import human
from kit.env import KIT_ROOT

WITHIN = 0.25           # an exchange "within 25%" of a model: |measured / predicted − 1| ≤ this
OWN_LINE = (0.8, 1.25)  # the ring's call / what its own sweep's fitted line predicts, inside this band: the line fits
RUN_TO_RUN = 1.3        # the fresh cluster's call / the sweep's same call above this: a run-to-run difference
SAME_PER_TENSOR = (0.9, 1.1)   # fusion off / on, one tensor at a time, inside this band: "about the same"


# ----------------------------------------------------------------------------- appendix 02a
def exchange_fit_line(ab: dict, errs, plain) -> str:
    """Return appendix 02a's line on the exchanges: α, B, B_max, and how many exchanges each model put within 25%
    (`errs`: the refined model's relative errors, `plain`: the plain 2α + 2NK/B's)."""
    errs, plain = np.abs(np.asarray(errs)), np.abs(np.asarray(plain))
    return (f"alpha = {ab['alpha'] * 1e6:.0f} us, B = {ab['B'] / 1e9:.2f} GB/s, B_max = {ab['B_max'][1] / 1e9:.2f} / "
            f"{ab['B_max'][2] / 1e9:.2f} GB/s (1 / 2 hubs); {len(errs)} exchanges: t_empty + 2NK/min(B_max, NB) within "
            f"25% for {np.sum(errs <= WITHIN)}/{len(errs)} (median |error| {np.median(errs):.0%}); the plain "
            f"2 alpha + 2NK/B: {np.sum(plain <= WITHIN)}/{len(plain)} (median |error| {np.median(plain):.0%})")


def refined_check(closer: int, n: int, refined_med: float, plain_med: float, slower: int, n_multi: int,
                  gain: float) -> Check:
    """Appendix 02a's verdict: the refined model was nearer the measurement than the plain one for ≥ 2/3 of the `n`
    exchanges (`closer` of them); for ≤ 1/3 the plain one was the closer, between them neither. `slower` of the
    `n_multi` exchanges with N ≥ 2 took longer than the refined model said; `gain` = B_max / B."""
    held = closer >= 2 * n / 3
    neither = not held and closer > n / 3
    if held:
        reason = ""
    elif neither:
        reason = (f"neither model was clearly the closer one: the plain one was nearer for the other {n - closer}; "
                  "on this machine the difference is inside the run's spread")
    else:
        reason = (f"the plain model was the closer one, nearer for {n - closer} of the {n}: the refinement did not "
                  f"earn its two extra measurements here. The run says why: with N ≥ 2 workers the refined model "
                  f"lets the streams share B_max, {gain:.2f}× one stream's B, and adds t_empty; {slower} of the "
                  f"{n_multi} exchanges with N ≥ 2 took longer than it predicted, so the streams did not reach B_max "
                  "here")
    detail = ("The refined model was the closer one in this run" if held else "" if neither else
              "The fan test that measures B_max moves bare buffers, while a server also sums and updates between its "
              "receives and its sends; this run does not measure that difference")
    return Check("the refined model", measured=f"nearer the measurement for {closer} of the {n} exchanges (median "
                                               f"|error| {refined_med:.0%} against the plain model's {plain_med:.0%})",
                 bound="nearer for at least 2/3 of them; for at most 1/3 the plain one is the closer, between them "
                       "neither", held=held, reason=reason, detail=detail)


def mlp_note(rows: list[dict], empty_ms, B: float) -> str:
    """Return appendix 02a's account of notebook 02's MLP exchanges (`rows`: ps_measure.summarise rows with
    `empty_ms`, the empty exchange at the same N and k) against the empty exchanges `empty_ms` and K/B."""
    ratio = [r["measured_ms"] / r["empty_ms"] for r in rows]
    err = [r["error"] for r in rows]
    K = rows[0]["K"]
    return (f"The empty exchanges of this run took {min(empty_ms):.2f} to {max(empty_ms):.2f} ms over the N, k "
            f"tried. The MLP's exchanges, with compute between them, took {min(r['measured_ms'] for r in rows):.1f} "
            f"to {max(r['measured_ms'] for r in rows):.1f} ms: {min(ratio):.1f}× to {max(ratio):.1f}× the empty "
            f"exchange at the same N and k, while its K = {human(K)} is {1e3 * K / B:.2f} ms of bandwidth at this "
            f"run's B. The model missed them by {min(err):+.0%} to {max(err):+.0%}, against the 25% the large "
            "exchanges were held to.")


# ----------------------------------------------------------------------------- appendix 03a
def ring_gap_note(K: float, alpha: float, B: float, t2: float, m2: float, a_eff: float, b_eff: float) -> str:
    """Return appendix 03a's paragraph on the ring's N = 2 call `t2` against the ping-pong's model `m2`, and what the
    α and B fitted to the ring's own sweep (`a_eff`, `b_eff`) say about the gap."""
    return (f"At N = 2 and {human(K)} the model with the ping-pong's α and B predicts {m2 * 1e3:.1f} ms; the ring "
            f"took {t2 * 1e3:.1f} ms on a fresh cluster, {t2 / m2:.1f}× the model. What the run shows about the gap: "
            f"the ring's own sweep (section 1, the same two ranks) fits B = {b_eff / 1e9:.2f} GB/s, {b_eff / B:.0%} "
            "of the ping-pong's: in the ring both ranks send, receive and add at once on the same cores, where the "
            f"ping-pong keeps one direction busy at a time. Its fitted α = {a_eff * 1e6:.0f} µs is "
            f"{a_eff / alpha:.0f}× the ping-pong's {alpha * 1e6:.0f} µs: each step of a ring call pays more than one "
            "message's latency (the call's Python loop, its shape check, the adds), so α and B from a two-parameter "
            "fit describe this ring's sweep, not a link.")


def own_line_check(K: float, t2: float, m2: float, own: float, swept: float | None) -> Check:
    """The ring's N = 2 call `t2` within OWN_LINE of `own`, what its own sweep's fitted α and B predict; `swept`: the
    sweep's call at the same size (None when the sweep did not time K)."""
    ratio = t2 / own
    held = OWN_LINE[0] < ratio < OWN_LINE[1]
    apart = bool(swept) and t2 / swept > RUN_TO_RUN
    sweep = "" if not swept else (f"in that sweep the same call at the same size took {swept * 1e3:.1f} ms: the "
                                  f"fresh cluster's point is {t2 / swept:.1f}× the sweep's" +
                                  (", a run-to-run difference on this shared machine that no model of the call "
                                   "explains" if apart else ""))
    reason = "" if held else f"even the ring's own straight line misses its {human(K)} call" + (
        f"; {sweep}" if apart else "")
    detail = "; ".join(([f"the ring's own line fits its call, the ping-pong's ({t2 / m2:.1f}×) does not"] if held
                        else []) + ([sweep] if sweep and not (apart and not held) else []))
    return Check("the ring's own line", measured=f"the fresh cluster's {human(K)} call took {t2 * 1e3:.1f} ms, "
                                                 f"{ratio:.1f}× the {own * 1e3:.1f} ms that α and B fitted to the "
                                                 "ring's own sweep predict",
                 bound=f"between {OWN_LINE[0]}× and {OWN_LINE[1]}× of it", held=held, reason=reason,
                 detail=detail[:1].upper() + detail[1:])


def ring_growth_check(K: float, n_lo: int, n_hi: int, grew: float, model_grew: float, gap: float) -> Check:
    """The ring's step grew from N = n_lo to n_hi by more than the model's factor (`grew`, `model_grew`: t(n_hi) /
    t(n_lo)): on one box the points leave the model more as N grows; `gap`: the N = 2 call / the model's."""
    held = grew > model_grew
    return Check("the ring against N", measured=f"from N = {n_lo} to {n_hi} at {human(K)} the ring grew by "
                                                f"{grew - 1:.0%}",
                 bound=f"more than the model's {model_grew - 1:.0%}", held=held,
                 reason="" if held else f"it grew less than the model in this run, but from an N = 2 point already "
                                        f"{gap:.1f}× the model: the points are set by what the shared cores give the "
                                        "processes, not by the model's terms",
                 detail="More than the model: the flat ring of the lesson is not what a single machine shows"
                 if held else "")


def one_host_summary(top: int, at: dict[str, float], count: int, fused: dict[str, float], K: float, n_lo: int,
                     n_hi: int, grew: float, model_grew: float, gap: float) -> str:
    """Return appendix 03a's summary bullets: busbw at the largest size `top` (`at`: {implementation: GB/s}), the
    kit ring's `count` small tensors one by one and fused, and the ring's growth with N against the model's."""
    return "\n".join([
        f"- At {human(top)}, N = 2: kit ring busbw {at['kit ring']:.2f} GB/s, Horovod {at['Horovod (Gloo)']:.2f} "
        f"(Gloo) / {at['Horovod (MPI)']:.2f} (MPI) GB/s, torch.distributed {at['torch.distributed (gloo)']:.2f} GB/s.",
        f"- {count} tensors of 4 KB: one by one {fused['one_by_one'] * 1e3:.0f} ms, fused {fused['fused'] * 1e3:.1f} "
        "ms with the kit's ring: small messages are latency-bound, so batch them.",
        f"- The ring on one box grew {grew - 1:.0%} from N = {n_lo} to {n_hi} at {human(K)}, the model "
        f"{model_grew - 1:.0%}, and at N = 2 it was {gap:.1f}× the model: here the cores, not links, set the time."])


def committed_fusion() -> dict | None:
    """Return the committed `python -m kit.bench allreduce` run's fusion timings (results/allreduce.json's
    fusion_100x4KB_s), or None where the file is missing."""
    path = os.path.join(KIT_ROOT, "results", "allreduce.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("fusion_100x4KB_s")


def fusion_off_note(run: dict, bench: dict | None, count: int) -> str:
    """Return appendix 03a's sentence on Horovod (Gloo) one tensor at a time with fusion on and off: this run's
    per-tensor times against the committed benchmark's (`bench`: results/allreduce.json's fusion_100x4KB_s, or
    None): the same order in both (inside SAME_PER_TENSOR: about the same), or runs that disagree."""
    key_on, key_off = "Horovod (Gloo)", "Horovod (Gloo), fusion off"
    per = lambda f, k: f[k]["one_by_one"] / count * 1e3                                  # noqa: E731
    on, off = per(run, key_on), per(run, key_off)
    out = (f"Horovod (Gloo) one tensor at a time: {on:.2f} ms per tensor with fusion on, {off:.2f} ms with it off "
           f"({off / on:.2f}×). A lone tensor has nothing to fuse with; each blocking call waits for a cycle of "
           "Horovod's background thread.")
    if not bench or key_off not in bench:
        return out
    b_on, b_off = per(bench, key_on), per(bench, key_off)
    side = lambda r: 0 if SAME_PER_TENSOR[0] <= r <= SAME_PER_TENSOR[1] else 1 if r > 1 else -1     # noqa: E731
    here, there = side(off / on), side(b_off / b_on)
    out += (f" The committed benchmark (`python -m kit.bench allreduce`) measured {b_on:.2f} and {b_off:.2f} ms "
            f"({b_off / b_on:.2f}×)")
    if here == there:
        return out + (": about the same in both runs." if here == 0 else
                      f": fusion off was the {'slower' if here > 0 else 'faster'} one tensor at a time in both runs; "
                      "this appendix does not measure why.")
    return out + (". The two runs disagree, so they do not settle which setting is the faster one tensor at a time on "
                  "this shared machine.")
