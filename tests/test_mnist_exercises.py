"""Notebook 04's exercise checkers (kit.mnist.exercises) and the lab section's checks (kit.mnist.lab.claims): each
grader says correct, wrong or not answered, never the answer; each check can fail and says why. Exercise 4's
judge is fed made-up engine reports; one engines test runs real submissions through the real path on 2 engines."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import engines_job
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


def ex4_report(rank, lr=0.02, kinds=("BroadcastGlobalVariablesCallback",), digests=("a", "b"), **more):
    """An engine report of exercise 4 (2 ranks, base_lr 0.01): compiled, its lr, its callbacks, its step digests."""
    return {"rank": rank, "size": 2, "compiled": True, "lr": lr, "kinds": list(kinds), "digests": list(digests),
            **more}


def test_exercise_4_judged_without_the_answer():
    right = [ex4_report(0), ex4_report(1)]
    assert exercises.judge_4(right).startswith("exercise 4: correct")
    unanswered = [{"rank": 0, "unanswered": True}, {"rank": 1, "unanswered": True}]
    assert exercises.judge_4(unanswered) == "exercise 4: not answered yet"
    assert "rank 1 still raises" in exercises.judge_4([ex4_report(0), {"rank": 1, "unanswered": True}])
    assert "rank 0 raised KeyError" in exercises.judge_4([{"rank": 0, "error": "KeyError: 'x'"}, ex4_report(1)])
    assert "not compiled" in exercises.judge_4([ex4_report(0), {**ex4_report(1), "compiled": False}])
    assert "other callbacks than rank 0" in exercises.judge_4([ex4_report(0), ex4_report(1, kinds=())])
    unscaled = exercises.judge_4([ex4_report(0, lr=0.01), ex4_report(1, lr=0.01)])
    assert "not scaled by the number of workers" in unscaled
    no_broadcast = exercises.judge_4([ex4_report(0, kinds=()), ex4_report(1, kinds=(), digests=("c", "d"))])
    assert no_broadcast.startswith("exercise 4: wrong: rank 1 did not start from rank 0's weights: the broadcast")
    not_averaged = exercises.judge_4([ex4_report(0), ex4_report(1, digests=("a", "e"))])
    assert "after step 2" in not_averaged and "not averaged" in not_averaged
    for verdict in (unscaled, no_broadcast, not_averaged):
        assert "0.02" not in verdict and "DistributedOptimizer" not in verdict and "Callback" not in verdict
    with pytest.raises(TypeError, match="pass your function"):
        exercises.check_exercise_4(None, None)


# -------------------------------------------------------------------------------- the real path, on 2 engines
@pytest.fixture(scope="module")
def pair():
    yield from engines_job(2, timeout=60)


def horovodize_right(model, base_lr):
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(base_lr * hvd.size())))
    return [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]


def horovodize_unscaled(model, base_lr):
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(base_lr)))
    return [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]


def horovodize_no_broadcast(model, base_lr):
    return horovodize_right(model, base_lr)[:0]


def horovodize_not_averaged(model, base_lr):
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    model.compile(loss="sparse_categorical_crossentropy", optimizer=tf.keras.optimizers.Adam(base_lr * hvd.size()))
    return [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]


def horovodize_rank0_only(model, base_lr):
    import horovod.tensorflow.keras as hvd
    return horovodize_right(model, base_lr) if hvd.rank() == 0 else horovodize_no_broadcast(model, base_lr)


def unanswered(model, base_lr):
    raise NotImplementedError


@pytest.mark.engines
def test_exercise_4_real_submissions_on_the_engines(pair):
    assert exercises.check_exercise_4(pair, horovodize_right).startswith("exercise 4: correct")
    assert "not scaled" in exercises.check_exercise_4(pair, horovodize_unscaled)
    assert "the broadcast is missing" in exercises.check_exercise_4(pair, horovodize_no_broadcast)
    assert "not averaged" in exercises.check_exercise_4(pair, horovodize_not_averaged)
    assert "other callbacks than rank 0" in exercises.check_exercise_4(pair, horovodize_rank0_only)
    assert exercises.check_exercise_4(pair, unanswered) == "exercise 4: not answered yet"
    assert exercises.check_exercise_4(pair, horovodize_right).startswith("exercise 4: correct")     # still usable
