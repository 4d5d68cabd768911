"""Notebook 00's graders (kit.cluster.exercises): each gives a right, a wrong and an unanswered submission the right
verdict, and a wrong one's message names what is wrong without the answer. The judges are pure (fast tier, on
engine reports written here); one engines test runs real submissions through the real path on 2 engines."""
import pytest

from conftest import engines_job
from kit.cluster import exercises as ex


def _mean_reports(results, calls=1, n=2):
    inputs = [[float(r + 1) ** 2, 3.0 - 2.0 * r, 0.5] for r in range(n)]
    return [{"rank": r, "input": inputs[r], "calls": ["allreduce"] * calls, "result": results[r], "type": "Tensor"}
            for r in range(n)]


def test_the_mean_judge_says_right_wrong_and_unanswered_without_the_answer():
    mean = [2.5, 2.0, 0.5]                                          # ((1 + 4) / 2, (3 + 1) / 2, 0.5)
    right = "exercise 1: correct: one allreduce, the ranks' mean on all 2 ranks"
    assert ex.judge_mean(_mean_reports([mean, mean])) == right
    assert ex.judge_mean([{"rank": 0, "unanswered": True}, {"rank": 1, "unanswered": True}]) == \
        "exercise 1: not answered yet"
    wrong = {
        "sum": (_mean_reports([[5.0, 4.0, 1.0]] * 2), "the sum over the ranks, not their mean"),
        "two calls": (_mean_reports([mean, mean], calls=2), "called Horovod's allreduce 2 times"),
        "no call": (_mean_reports([mean, mean], calls=0), "called Horovod's allreduce 0 times"),
        "disagree": (_mean_reports([mean, [1.0, 3.0, 0.5]]), "rank 1's result differs from rank 0's"),
        "off": (_mean_reports([[2.5, 2.0, 0.25]] * 2), "element 2 on every rank is not the mean"),
        "none": ([{**r, "result": None, "type": "NoneType"} for r in _mean_reports([mean, mean])],
                 "returned a NoneType"),
        "raised": ([{"rank": 0, "error": "NameError: name 'hvd' is not defined"}, {"rank": 1, "unanswered": True}],
                   "rank 0 raised NameError"),
    }
    for name, (reports, what) in wrong.items():
        said = ex.judge_mean(reports)
        assert what in said and "correct" not in said, (name, said)
        assert "2.5" not in said and "2.0" not in said, (name, said)          # never the expected values


def _bcast_reports(after1, after0=None):
    before = [{"w": [1.0, 2.0], "b": [0.5]}, {"w": [7.0, 8.0], "b": [9.0]}]
    return [{"rank": 0, "before": before[0], "calls": [], "after": after0 or before[0]},
            {"rank": 1, "before": before[1], "calls": [], "after": after1}]


def test_the_broadcast_judge_says_right_wrong_and_unanswered():
    assert ex.judge_broadcast(_bcast_reports({"w": [1.0, 2.0], "b": [0.5]})).startswith("exercise 2: correct")
    assert ex.judge_broadcast([{"rank": 0, "unanswered": True}, {"rank": 1, "unanswered": True}]) == \
        "exercise 2: not answered yet"
    said = ex.judge_broadcast(_bcast_reports({"w": [1.0, 2.0], "b": [9.0]}))
    assert "rank 1's parameter 'b' still differs from rank 0's" in said
    averaged = {"w": [4.0, 5.0], "b": [4.75]}
    said = ex.judge_broadcast(_bcast_reports(averaged, averaged))
    assert "rank 0's parameter 'w' changed" in said and "correct" not in said
    assert "RuntimeError" in ex.judge_broadcast([{"rank": 0, "error": "RuntimeError: x"}, {"rank": 1, "error": "y"}])


def test_the_square_sum_check_and_a_grader_given_no_function():
    assert ex.check_square_sum(None) == "exercise 3: not answered yet"
    assert ex.check_square_sum(30) == "exercise 3: correct" and ex.check_square_sum(10) == "exercise 3: wrong"
    with pytest.raises(TypeError, match="pass your function"):
        ex.grade_mean(None, None)
    with pytest.raises(TypeError, match="pass your function"):
        ex.grade_broadcast(None, 3)


# -------------------------------------------------------------------------------- the real path, on 2 engines
@pytest.fixture(scope="module")
def pair():
    yield from engines_job(2, timeout=60)


def mean_right(t):
    import horovod.torch as hvd
    return hvd.allreduce(t, op=hvd.Sum) / hvd.size()


def mean_sum_only(t):
    import horovod.torch as hvd
    return hvd.allreduce(t, op=hvd.Sum)


def unanswered(x):
    raise NotImplementedError


def sync_right(model):
    import horovod.torch as hvd
    for p in model.state_dict().values():
        hvd.broadcast_(p, root_rank=0)


def sync_rebinds(model):
    import horovod.torch as hvd
    for p in model.state_dict().values():
        p = hvd.broadcast(p, root_rank=0)          # the mistake under test: the result is dropped


def sync_with_the_helper(model):
    import horovod.torch as hvd
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)


@pytest.mark.engines
def test_real_submissions_run_on_the_engines_and_get_their_verdicts(pair):
    assert ex.grade_mean(pair, mean_right).startswith("exercise 1: correct")
    assert "the sum over the ranks" in ex.grade_mean(pair, mean_sum_only)
    assert ex.grade_mean(pair, unanswered) == "exercise 1: not answered yet"
    assert ex.grade_broadcast(pair, sync_right).startswith("exercise 2: correct")
    assert "still differs from rank 0's" in ex.grade_broadcast(pair, sync_rebinds)
    assert "write broadcast_parameters yourself" in ex.grade_broadcast(pair, sync_with_the_helper)
    assert ex.grade_broadcast(pair, unanswered) == "exercise 2: not answered yet"
