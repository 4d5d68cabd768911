"""kit.ddp.exercises: notebook 05's graders say correct, wrong or not answered without printing the answer;
exercise 3 runs the learner's gradient-sync class on 3 engines against one process's SGD (engines)."""
import pytest

from kit.comm import dp
from kit.ddp import exercises, schemes


def test_exercise_1_grades_ddps_bucket_rule():
    sizes = [p.numel() * p.element_size() for p in schemes.make_model(schemes.CFG).parameters()]
    right = len(dp.assign_buckets(sizes, 600_000))
    assert exercises.grade_buckets(None) == "exercise 1: not answered yet"
    assert exercises.grade_buckets(right) == "exercise 1: correct"
    assert right not in [len(dp.assign_buckets(sizes, b)) for b in schemes.BUCKETS]   # not a row section 4 prints
    for wrong in (right - 1, right + 1, len(dp.assign_buckets(sizes, 600_000, 1 << 20))):
        if wrong != right:
            said = exercises.grade_buckets(wrong)
            assert said.startswith("exercise 1: wrong") and str(right) not in said


def test_exercise_3_verdicts_from_ranks_results():
    ok = {"err": 1e-7, "calls": 14, "async": True, "error": None}
    assert "still uses dp.Buckets' own finish" in exercises.verdict([dict(ok, kept=["finish"])] * 2, 3)
    assert exercises.verdict([ok, ok], 3).startswith("exercise 3: correct")
    assert "not answered" in exercises.verdict([dict(ok, calls=0)] * 2, 3)
    assert exercises.verdict([ok, dict(ok, err=0.3)], 3).startswith("exercise 3: wrong")
    assert "asynchronously" in exercises.verdict([ok, dict(ok, **{"async": False})], 3)
    assert "raised on rank 1: ValueError: x" in exercises.verdict([ok, dict(ok, error="ValueError: x")], 3)
    bucketed = dict(ok, calls=4, buckets=4)
    assert exercises.verdict([bucketed] * 2, 3).endswith("4 async allreduces per step, one per bucket")
    said = exercises.verdict([dict(ok, buckets=4)] * 2, 3)      # 14 allreduces, one per gradient, for 4 buckets
    assert "14 allreduces per step for 4 buckets" in said and "correct" not in said


class NoMean(dp.Buckets):
    """Launches each bucket as the kit does, waits for every bucket's sum, but forgets to divide by N."""
    def _ready(self, p):
        self.missing[self.bucket_of[id(p)]] -= 1
        while self.next < len(self.buckets) and self.missing[self.next] == 0:
            self._launch(self.next)

    def _launch(self, b):
        import torch
        import torch.distributed as dist
        flat = torch.cat([self.params[i].grad.reshape(-1) for i in self.buckets[b]])
        self.pending.append((b, flat, dist.all_reduce(flat, async_op=True)))
        self.next += 1

    def finish(self):
        for _, _, work in self.pending:
            work.wait()
        self._reset()


class PerGradient(dp.Overlap):
    """Right weights, but one allreduce per gradient although it has buckets."""
    def __init__(self, model, bucket_bytes=64):
        super().__init__(model)
        sizes = [p.numel() * p.element_size() for p in model.parameters()]
        self.buckets = dp.assign_buckets(sizes, bucket_bytes, None)


class Deleted(dp.Buckets):
    """The skeleton with its `...` methods deleted: dp.Buckets' own code would do the exercise."""


class FinishOnly(dp.Buckets):
    """Only finish written: dp.Buckets' own hooks still launch the buckets."""
    def finish(self):
        for _, _, work in self.pending:
            work.wait()
        self._reset()


class SuperEach(dp.Buckets):
    """Each method written as a call of dp.Buckets' own: the exercise not done."""
    def _ready(self, p):
        return super()._ready(p)

    def _launch(self, b):
        return dp.Buckets._launch(self, b)

    def finish(self):
        super().finish()


def test_a_method_that_only_calls_its_namesake_in_dp_buckets_is_not_written():
    assert [m for m in exercises.WRITE if exercises._borrowed(SuperEach, m)] == list(exercises.WRITE)
    assert [m for m in exercises.WRITE if exercises._borrowed(NoMean, m)] == []

    class ResetsThroughSuper(NoMean):           # a finish of its own that calls another method of dp.Buckets
        def finish(self):
            for _, flat, work in self.pending:
                work.wait()
                flat /= self.world
            super()._reset()
    assert not exercises._borrowed(ResetsThroughSuper, "finish")


class Skeleton:
    def __init__(self, model):
        ...

    def finish(self):
        ...


@pytest.mark.engines
@pytest.mark.timeout(300)
def test_exercise_3_on_engines_right_wrong_and_unanswered(cluster3):
    cluster3.view.push({"RightBuckets": lambda m: dp.Buckets(m, 256, None), "NoMean": NoMean,
                        "PerGradient": PerGradient, "Skeleton": Skeleton, "Deleted": Deleted,
                        "FinishOnly": FinishOnly, "SuperEach": SuperEach}, block=True)
    cfg = dict(sizes=(16, 24, 5), batch=8)        # 4 tensors: 1,536, 96, 480 and 20 bytes; buckets of 256 B: 2
    said = exercises.grade_hook(cluster3, "RightBuckets", cfg)
    assert said.startswith("exercise 3: correct") and said.endswith("2 async allreduces per step, one per bucket")
    assert "4 allreduces per step for 3 buckets" in exercises.grade_hook(cluster3, "PerGradient", cfg)
    assert exercises.grade_hook(cluster3, "NoMean", cfg).startswith("exercise 3: wrong")
    assert "not answered" in exercises.grade_hook(cluster3, "Skeleton", cfg)
    assert exercises.grade_hook(cluster3, "Deleted", cfg) == ("exercise 3: not answered yet: your class still uses "
                                                              "dp.Buckets' own _ready, _launch, finish; write them")
    assert "still uses dp.Buckets' own _ready, _launch;" in exercises.grade_hook(cluster3, "FinishOnly", cfg)
    assert "still uses dp.Buckets' own _ready, _launch, finish;" in exercises.grade_hook(cluster3, "SuperEach", cfg)
    assert "no 'Missing' on this engine" in exercises.grade_hook(cluster3, "Missing", cfg)
