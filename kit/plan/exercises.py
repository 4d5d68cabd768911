"""Graders of notebook 07's exercises: the learner writes a term of the plan, the grader calls it on synthetic inputs
and compares it with kit.plan's own (`kit.plan.memory`, `kit.plan.predict`). A verdict names the first input where
the answer is wrong, whether it is too high or too low, and the mistake it matches; never the right value.

    grade_state_bytes(fn)   exercise 1: fn(model, stage, dp), bytes of parameters + gradients + optimizer state
                            one rank holds under ZeRO-`stage` (0: plain DP) over dp ranks
    grade_overlap(fn)       exercise 2: fn(n, nbytes, calls, alpha_s, bandwidth_Bps, backward_s), the seconds of
                            an overlapped DP exchange (a ring of `calls` allreduces) not hidden behind backward
"""
from __future__ import annotations

import math

from kit.plan.cost import memory, predict, ring_s
from kit.plan.describe import Cluster, Link, Model, Strategy

OPEN = "exercise {}: not answered yet"
STAGES = {0: "dp", 1: "zero1", 2: "zero2", 3: "zero3"}
PARTS = ("params", "grads", "optimizer")
# synthetic models: float32 with SGD momentum, float32 with Adam, mixed precision with Adam (K = 12)
MODELS = (Model(params=1_000_000, layers=4, act_bytes_per_sample_layer=0, compute_s_per_sample_layer=1e-3),
          Model(params=3_000_000, layers=6, act_bytes_per_sample_layer=0, compute_s_per_sample_layer=1e-3,
                optimizer_bytes_per_param=8),
          Model(params=7_000_000, layers=8, act_bytes_per_sample_layer=0, compute_s_per_sample_layer=1e-3,
                bytes_per_param=2, optimizer_bytes_per_param=12))
# (n, nbytes, calls, alpha_s, bandwidth_Bps, backward_s): nothing to hide behind, latency-bound, bandwidth-bound,
# a backward shorter than the exchange, a backward longer than it
OVERLAP_CASES = ((4, 4e6, 1, 1e-4, 1e8, 0.0), (8, 4e3, 10, 1e-3, 1e9, 0.0), (3, 64e6, 1, 0.0, 1e8, 0.0),
                 (4, 4e6, 8, 1e-4, 1e8, 0.02), (4, 4e6, 8, 1e-4, 1e8, 10.0))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _call(n: int, fn, *args):
    """fn(*args) as a float; (None, verdict) when it is unanswered or raises or returns no number."""
    try:
        out = fn(*args)
    except NotImplementedError:
        return None, OPEN.format(n)
    except Exception as e:                          # the learner's bug, said plainly
        return None, f"exercise {n}: your function raised {type(e).__name__}: {e}"
    if isinstance(out, bool) or not isinstance(out, (int, float)) or not math.isfinite(out):
        return None, f"exercise {n}: your function returned {type(out).__name__} {out!r}, not a finite number"
    return float(out), None


def _direction(got: float, want: float) -> str:
    return "too high" if got > want else "too low"


def state_bytes(model: Model, stage: int, dp: int) -> float:
    """kit.plan's bytes of parameters + gradients + optimizer state per rank (the reference)."""
    m = memory(model, Strategy(STAGES[stage], dp=dp), 0)
    return sum(m[f"{p}_bytes"] for p in PARTS)


def _variants(model: Model, stage: int, dp: int) -> dict[str, float]:
    """The totals of the usual mistakes: one part sharded when it should not be, or whole when it should be
    sharded; the optimizer state counted at the parameters' bytes."""
    sharded = {p: stage >= k for p, k in zip(("optimizer", "grads", "params"), (1, 2, 3))}
    per = {"params": model.bytes_per_param, "grads": model.bytes_per_param,
           "optimizer": model.optimizer_bytes_per_param}
    wrong_opt = {**per, "optimizer": model.bytes_per_param}
    out = {"the optimizer state counted at the parameters' bytes per parameter (see optimizer_bytes_per_param)": sum(
        model.params * wrong_opt[p] / (dp if sharded[p] else 1) for p in PARTS)}
    name = f"ZeRO-{stage}" if stage else "plain DP"
    for flip in PARTS:
        total = sum(model.params * per[p] / (dp if sharded[p] != (p == flip) else 1) for p in PARTS)
        what = "divided over the dp ranks, which" if not sharded[flip] else "not divided over the dp ranks, which"
        out[f"the {flip} {what} {name} {'does not shard' if not sharded[flip] else 'shards'}"] = total
    return out


def grade_state_bytes(fn) -> str:
    """Exercise 1: fn(model, stage, dp) against kit.plan on 3 models × stages 0-3 × dp 2, 4, 8."""
    for model in MODELS:
        for stage in STAGES:
            for dp in (2, 4, 8):
                got, verdict = _call(1, fn, model, stage, dp)
                if verdict:
                    return verdict
                want = state_bytes(model, stage, dp)
                if _close(got, want):
                    continue
                where = (f"stage {stage}, dp = {dp}, params = {model.params:,}, bytes_per_param = "
                         f"{model.bytes_per_param}, optimizer_bytes_per_param = {model.optimizer_bytes_per_param}")
                like = [k for k, v in _variants(model, stage, dp).items() if _close(got, v)]   # equal totals: all
                return (f"exercise 1: wrong at {where}: {_direction(got, want)}"
                        + (f"; it matches {' or '.join(like)}" if like else ""))
    return "exercise 1: correct"


def overlap_exposed_s(n: int, nbytes: float, calls: int, alpha_s: float, bandwidth_Bps: float,
                      backward_s: float) -> float:
    """kit.plan's exposed seconds of an overlapped DP exchange (the reference): predict() on a one-layer model of
    nbytes of float32 in `calls` tensors whose backward takes backward_s, one sample per rank."""
    model = Model(params=max(1, round(nbytes / 4)), layers=1, act_bytes_per_sample_layer=0,
                  compute_s_per_sample_layer=2 * backward_s, tensors=calls, backward_share=0.5)
    link = Link(alpha_s, bandwidth_Bps)
    return predict(model, Cluster(hosts=n, ranks_per_host=1, intra=link, inter=link), Strategy("dp_overlap", dp=n),
                   n)["exposed_comm_s"]


def grade_overlap(fn) -> str:
    """Exercise 2: fn(n, nbytes, calls, alpha_s, bandwidth_Bps, backward_s) against kit.plan on OVERLAP_CASES."""
    for n, nbytes, calls, alpha, bw, backward in OVERLAP_CASES:
        got, verdict = _call(2, fn, n, nbytes, calls, alpha, bw, backward)
        if verdict:
            return verdict
        nbytes = 4 * max(1, round(nbytes / 4))                     # what the reference's model holds
        want = overlap_exposed_s(n, nbytes, calls, alpha, bw, backward)
        if _close(got, want):
            continue
        where = (f"n = {n}, nbytes = {nbytes:.0f}, calls = {calls}, alpha_s = {alpha:g}, bandwidth_Bps = {bw:g}, "
                 f"backward_s = {backward:g}")
        link = Link(alpha, bw)
        ring = ring_s(n, nbytes, link, calls)
        if backward == 0:
            hints = {"half the ring's time: count both phases, reduce-scatter and all-gather": ring / 2,
                     "alpha paid once, not once per call": ring_s(n, nbytes, link, 1),
                     "every rank moving all nbytes in each step, not a 1/n chunk": ring_s(n, nbytes * n, link, calls),
                     "n steps per phase, not n − 1": ring * n / (n - 1)}
            what = "the ring's own time (nothing to hide behind)"
        else:
            last = "backward hiding even the last call, which can only start when backward ends"
            hints = {"nothing hidden behind backward": ring, last: max(ring - backward, 0.0),
                     f"{last} (a negative time)": ring - backward}
            what = "what backward hides"
        like = next((k for k, v in hints.items() if _close(got, v)), None)
        return (f"exercise 2: wrong at {where}: {_direction(got, want)}, in {what}"
                + (f"; it matches {like}" if like else ""))
    return "exercise 2: correct"
