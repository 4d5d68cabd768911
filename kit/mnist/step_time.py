"""Notebook 04a's prose: where a Horovod step's time goes (when the gradients' allreduces start, from the timeline;
the waiting and the exchange per step) and what the appendix's run measured.

    at_end = together >= n_tensors - 1          # all (but one) started within 2 ms of the last: at the end
    Markdown(kit.mnist.step_time.overlap_note(together, n_tensors, at_end, per_step))
    Markdown(kit.mnist.step_time.measured(together, n_tensors, at_end, per_step, thr_1, thr_n, 2, predicted, True))

`per_step` maps a timeline phase to (seconds summed over tensors, wall-clock seconds) per step; the notes read its
NEGOTIATE_ALLREDUCE (some tensor waiting for the other rank) and GLOO_ALLREDUCE (the exchange itself).
"""
from __future__ import annotations


def waiting(per_step: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """Return the wall-clock seconds per step of NEGOTIATE (waiting for the other rank) and of the Gloo exchange."""
    return per_step["NEGOTIATE_ALLREDUCE"][1], per_step["GLOO_ALLREDUCE"][1]


def overlap_clause(together: int, n_tensors: int, at_end: bool) -> str:
    """Return what the median step's start times say: the allreduces went out together at the end of the step, or
    the others started while backward still ran."""
    if at_end:
        return ("so communication barely overlaps the backward pass here: the allreduces go out together at the end "
                "of the step (Horovod's background thread fuses the tensors that are ready in the same cycle into one "
                "buffer, the MEMCPY phases above)")
    return (f"so the other {n_tensors - together} started earlier, while backward still ran: part of the "
            "communication does overlap the backward pass")


def overlap_note(together: int, n_tensors: int, at_end: bool, per_step: dict[str, tuple[float, float]]) -> str:
    """Return the timeline's account of a step: how many of `n_tensors` allreduces started `together` at the end,
    then the time per step spent negotiating and exchanging, and why NEGOTIATE waits."""
    neg, exch = waiting(per_step)
    return (f"In the median step, **{together} of the {n_tensors}** gradient tensors started their allreduce within "
            f"2 ms of the last one, {overlap_clause(together, n_tensors, at_end)}. In wall-clock time per step, some "
            f"tensor was waiting for the other rank (NEGOTIATE) during {1e3 * neg:.1f} ms, and the Gloo exchange "
            f"itself ran during {1e3 * exch:.1f} ms (summed over tensors the NEGOTIATE bars add up to "
            f"{1e3 * per_step['NEGOTIATE_ALLREDUCE'][0]:.1f} ms, which counts the same waiting once per tensor). "
            "NEGOTIATE is the time until the other rank has produced the same gradient: the ranks compute at "
            "slightly different speeds, and on 2 cores Horovod's background thread shares a core with a compute "
            "thread, so each exchange also waits for the scheduler.")


def measured(together: int, n_tensors: int, at_end: bool, per_step: dict[str, tuple[float, float]], thr_1: float,
             thr_n: float, n: int, predicted: float, identical: bool) -> str:
    """Return the appendix's numbered summary: the allreduces' start times and waiting per step, the samples/s of
    1 and `n` workers against the no-overlap model's `predicted`, and whether the PyTorch replicas ended identical."""
    neg, exch = waiting(per_step)
    when = ("together at the end of the step, barely overlapping backward; " if at_end else
            f"the other {n_tensors - together} started earlier, overlapping backward; ")
    return (f"1. Per step (median), {together} of {n_tensors} gradient allreduces started within 2 ms of the last "
            f"one: {when}NEGOTIATE (waiting for the other rank) covered {1e3 * neg:.1f} ms of wall clock, the "
            f"exchange {1e3 * exch:.1f} ms.\n"
            f"2. Throughput: 1 worker {thr_1:,.0f} samples/s, {n} workers {thr_n:,.0f} samples/s "
            f"({thr_n / thr_1:.2f}x, efficiency {thr_n / (n * thr_1):.0%}); the no-overlap model predicted "
            f"{predicted:,.0f}.\n"
            f"3. The PyTorch replicas ended identical: {identical}.")
