"""kit.plan.exercises: notebook 07's graders say correct, wrong (where, which way, the mistake it matches) or not
answered, never the right value; notebook 07's lab checks (kit.plan.lab.run_checks) made to hold and to fail."""
import re

import pytest

from kit.plan import exercises
from kit.plan.cost import ring_s
from kit.plan.describe import Link


def unanswered(*_):
    raise NotImplementedError    # your code


def right_state(model, stage, dp):
    """Exercise 1 written out: optimizer state /dp from stage 1, gradients from 2, parameters from 3."""
    share = lambda k: dp if stage >= k else 1      # noqa: E731
    return model.params * (model.bytes_per_param / share(3) + model.bytes_per_param / share(2)
                            + model.optimizer_bytes_per_param / share(1))


def right_overlap(n, nbytes, calls, alpha_s, bandwidth_Bps, backward_s):
    """Exercise 2 written out: the ring's 2(n−1)(calls·α + K/(nB)) less backward, never below its last call."""
    t = 2 * (n - 1) * (calls * alpha_s + nbytes / (n * bandwidth_Bps))
    return max(t - backward_s, t / calls)


def verdict_part(said: str) -> str:
    """What a wrong verdict says after naming the inputs: no number in it, so never the answer."""
    part = said.rsplit(": too ", 1)[1]
    assert not any(ch.isdigit() for ch in re.sub(r"ZeRO-\d|n − 1|1/n", "", part)), part
    return part


def test_exercise_1_right_unanswered_raises():
    assert exercises.grade_state_bytes(right_state) == "exercise 1: correct"
    assert exercises.grade_state_bytes(unanswered) == "exercise 1: not answered yet"
    said = exercises.grade_state_bytes(lambda m, s, d: 1 / 0)
    assert said == "exercise 1: your function raised ZeroDivisionError: division by zero"
    assert "not a finite number" in exercises.grade_state_bytes(lambda m, s, d: None)


@pytest.mark.parametrize("mistake, words", [
    (lambda m, s, d: right_state(m, 0, d), ("stage 1", "too high", "the optimizer not divided over the dp ranks")),
    (lambda m, s, d: right_state(m, min(s, 1), d), ("stage 2", "too high", "the grads not divided")),
    (lambda m, s, d: right_state(m, s + 1 if s == 2 else s, d), ("stage 2", "too low", "the params divided")),
    (lambda m, s, d: right_state(m, min(s, 2), d), ("stage 3", "too high", "the params not divided")),
    (lambda m, s, d: right_state(m, 2 if s == 1 else s, d),         # equal bytes: grads or params, both named
     ("stage 1", "too low", "the params divided over the dp ranks, which ZeRO-1 does not shard or the grads divided")),
    (lambda m, s, d: right_state(m.__class__(**{**m.__dict__, "optimizer_bytes_per_param": m.bytes_per_param}), s, d),
     ("optimizer_bytes_per_param = 8", "too low", "the parameters' bytes per parameter")),
    (lambda m, s, d: 2 * right_state(m, s, d), ("stage 0, dp = 2", "too high")),
])
def test_exercise_1_wrong_names_where_and_which_way(mistake, words):
    said = exercises.grade_state_bytes(mistake)
    assert said.startswith("exercise 1: wrong at ")
    for w in words:
        assert w in said
    verdict_part(said)


def test_exercise_2_right_unanswered_raises():
    assert exercises.grade_overlap(right_overlap) == "exercise 2: correct"
    assert exercises.grade_overlap(unanswered) == "exercise 2: not answered yet"
    assert "raised IndexError" in exercises.grade_overlap(lambda *a: a[9])
    assert "not a finite number" in exercises.grade_overlap(lambda *a: float("nan"))


def half(n, K, c, a, B, bwd):
    return right_overlap(n, K, c, a, B, bwd) / 2 if bwd == 0 else right_overlap(n, K, c, a, B, bwd)


@pytest.mark.parametrize("mistake, words", [
    (half, ("backward_s = 0", "too low", "both phases")),
    (lambda n, K, c, a, B, bwd: right_overlap(n, K, 1, a, B, bwd), ("calls = 10", "too low", "alpha paid once")),
    (lambda n, K, c, a, B, bwd: right_overlap(n, K * n, c, a, B, bwd), ("too high", "1/n chunk")),
    (lambda n, K, c, a, B, bwd: 2 * n * (c * a + K / (n * B)), ("too high", "n steps per phase")),
    (lambda n, K, c, a, B, bwd: right_overlap(n, K, c, a, B, 0.0), ("backward_s = 0.02", "too high",
                                                                      "nothing hidden behind backward")),
    (lambda n, K, c, a, B, bwd: max(right_overlap(n, K, c, a, B, 0.0) - bwd, 0.0),
     ("backward_s = 10", "too low", "even the last call")),
])
def test_exercise_2_wrong_names_where_and_which_way(mistake, words):
    said = exercises.grade_overlap(mistake)
    assert said.startswith("exercise 2: wrong at ")
    for w in words:
        assert w in said
    verdict_part(said)


def test_exercise_2_reference_is_the_ring_less_backward():
    # by hand: n = 4, 4 MB in 8 calls, α = 100 µs, 100 MB/s: 2·3·(8e-4 + 0.01) = 0.0648; 20 ms of backward hide
    # 0.02; 10 s hide all but the last call, 0.0648 / 8
    assert exercises.overlap_exposed_s(4, 4e6, 8, 1e-4, 1e8, 0.02) == pytest.approx(0.0448)
    assert exercises.overlap_exposed_s(4, 4e6, 8, 1e-4, 1e8, 10.0) == pytest.approx(0.0081)
    assert ring_s(4, 4e6, Link(1e-4, 1e8), 8) == pytest.approx(0.0648)


def test_notebook_07s_lab_checks_hold_and_fail():
    from kit.plan.lab import run_checks
    ok = run_checks("dp", 0.040, 0.045, 100, 100, 0.35, 0.10)
    assert [c.held for c in ok] == [True, True] and ok[0].measured == pytest.approx(-0.111, abs=1e-3)
    bad = run_checks("dp", 0.020, 0.045, 120, 100, 0.35, 0.10)     # −56 % and +20 %
    assert bad[0].measured == pytest.approx(-0.556, abs=1e-3)
    assert [c.held for c in bad] == [False, False]
