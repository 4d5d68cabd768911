"""Notebook 04's exercise checkers (kit.mnist.exercises) and the lab section's checks (kit.mnist.lab.claims): each
grader says correct, wrong or not answered, never the answer; each check can fail and says why."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest

from kit.checks import table
from kit.mnist import exercises
from kit.mnist import lab as mnist_lab
from kit.mnist.model import steps_per_epoch

BENCH = json.loads((Path(__file__).parents[1] / "results" / "mnist_lab.json").read_text())


def state(digest, steps=2, averaged=True, off=0.0):
    """An engine_state of a 2-layer model: rank weights off by `off` from a common start."""
    weights = [np.arange(6.0).reshape(2, 3) + off, np.array([0.5, -1.0]) - off]
    return {"steps": steps, "averaged": averaged, "digest": digest, "weights": weights}


def drift(weights):
    return max(float(np.abs(w - w0).max()) for ws in weights for w, w0 in zip(ws, weights[0]))


def test_exercise_1_graded_without_the_answer():
    broken = [state("d0"), state("d1", off=0.125)]
    assert exercises.largest_drift([s["weights"] for s in broken]) == 0.125
    assert exercises.grade_1([None, None], drift) == "exercise 1: not answered yet"
    assert exercises.grade_1(broken, None) == "exercise 1: not answered yet"
    assert exercises.grade_1(broken, drift) == "exercise 1: correct"
    signed = lambda ws: max(float((w - w0).max()) for r in ws for w, w0 in zip(r, ws[0]))   # noqa: E731  no abs
    first_only = lambda ws: float(np.abs(ws[-1][0] - ws[0][0]).max())                        # noqa: E731
    for wrong in (lambda ws: 0.0, lambda ws: 0.125, signed, first_only, lambda ws: None, lambda ws: "0.125"):
        verdict = exercises.grade_1(broken, wrong)
        assert verdict.startswith("exercise 1:") and "correct" not in verdict and "your drift is wrong" in verdict
    assert "raised ZeroDivisionError" in exercises.grade_1(broken, lambda ws: 1 / 0)
    with_broadcast = exercises.grade_1([state("d0"), state("d0")], drift)
    assert "wrong" in with_broadcast and "identical" in with_broadcast
    assert "averag" in exercises.grade_1([state("d0", averaged=False), state("d1")], drift)
    assert "same few steps" in exercises.grade_1([state("d0", steps=0), state("d1", steps=0)], drift)
    assert "same few steps" in exercises.grade_1([state("d0", steps=2), state("d1", steps=3)], drift)


def test_exercise_2_graded_without_the_answer():
    steps, images = steps_per_epoch(60_000, 4), 12 * 60_000
    assert exercises.check_exercise_2(None, None) == "exercise 2: not answered yet"
    assert exercises.check_exercise_2(steps, images) == "exercise 2: correct"
    wrong = exercises.check_exercise_2(steps + 1, images)
    assert wrong == "exercise 2: steps per rank wrong, images right" and str(steps) not in wrong
    assert exercises.check_exercise_2(steps, images // 4) == "exercise 2: steps per rank right, images wrong"


def checkpoints(folder, epochs):
    for e in epochs:
        np.savez(folder / f"ckpt-epoch-{e:04d}.npz", epoch=e, w0=np.zeros(3), o0=np.zeros(1))


def test_exercise_3_corrupts_once_and_never_names_the_file(tmp_path, capsys):
    checkpoints(tmp_path, (10, 11, 12))
    out = exercises.check_exercise_3(tmp_path, None)
    assert out == "exercise 3: not answered yet"              # no hint: what resume() skipped comes with an answer
    assert exercises.check_exercise_3(tmp_path, 12).startswith("exercise 3: wrong")
    assert exercises.check_exercise_3(tmp_path, 11).startswith("exercise 3: correct")      # corrupted once only
    assert "ckpt" not in capsys.readouterr().err
    assert (tmp_path / "ckpt-epoch-0011.npz").read_bytes() != exercises.CORRUPT
    with pytest.raises(ValueError, match="ckpt_dir=.*holds no checkpoint"):
        exercises.check_exercise_3(tmp_path / "none", 1)


def run_like(bench, *, slow_step, fast_step, busy=(0.99, 0.99)):
    """Return the benchmark's result with its 2-host steps (and speed-ups) replaced."""
    r = copy.deepcopy(bench)
    by = {(x["n"], x["rate"]): x for x in r["runs"]}
    for key, step in (((2, "1gbit"), slow_step), ((2, "10gbit"), fast_step)):
        by[key]["step_s"] = step
        by[key]["samples_per_s"] = by[key]["batch"] * 2 / step
        by[key]["speedup"] = by[key]["samples_per_s"] / r["one_worker"]["samples_per_s"]
    by[2, "1gbit"]["cores_busy"] = list(busy)
    return r


def test_lab_claims_fail_when_the_exchange_hid_or_a_worker_waited():
    one, ar = BENCH["one_worker"]["step_s"], {(x["n"], x["rate"]): x for x in BENCH["runs"]}[2, "1gbit"]["allreduce_s"]
    hidden = run_like(BENCH, slow_step=one + 0.3 * ar, fast_step=one + 0.25 * ar)     # most of the exchange hid
    gap, only = mnist_lab.claims(hidden)
    assert not gap.held and only.held
    assert mnist_lab.hidden_share(hidden, {(x["n"], x["rate"]): x for x in hidden["runs"]}[2, "1gbit"]) == \
        pytest.approx(0.7)
    waited = run_like(BENCH, slow_step=one + 1.5 * ar, fast_step=one + 0.2 * ar, busy=(0.99, 0.6))
    gap, only = mnist_lab.claims(waited)
    assert gap.held and not only.held and "**no**" in table([only])
