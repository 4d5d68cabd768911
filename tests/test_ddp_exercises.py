"""kit.ddp.exercises: notebook 05's graders say correct, wrong or not answered without printing the answer;
exercise 3 runs the learner's gradient-sync class, exercise 4 its ZeRO-1 step, on 3 engines against one process's SGD
(engines)."""
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


def _report(rank, **kw):
    """A rank's zero_with report: right unless told otherwise (3 shards)."""
    errs = {"mean": [1e-8] * 3, "sum": [0.2] * 3, "no momentum": [0.1] * 3}
    return {"rank": rank, "errs": dict(errs, **kw.pop("errs", {})), "apart": [0.0] * 3, "state": 100, "shard": 100,
            "allreduces": 0, **kw}


def test_exercise_4_verdicts_from_ranks_reports():
    ok = [_report(r) for r in range(3)]
    assert exercises.judge_zero(ok, 3).startswith("exercise 4: correct")
    assert exercises.judge_zero([{"rank": r, "unanswered": True} for r in range(3)], 3) == \
        "exercise 4: not answered yet"
    said = exercises.judge_zero(ok[:2] + [{"rank": 2, "unanswered": True}], 3)
    assert "rank 2 still raises NotImplementedError" in said
    assert "raised on rank 1: ValueError: x" in exercises.judge_zero([ok[0], {"rank": 1, "error": "ValueError: x"}], 3)
    said = exercises.judge_zero([ok[0], _report(1, apart=[0.0, 3e-3, 0.0]), ok[2]], 3)     # no all-gather
    assert "ranks disagree: rank 1's shard 1" in said and "all-gather" in said
    wrong = {"mean": [0.02, 0.3, 0.02]}
    said = exercises.judge_zero([_report(r, errs=wrong) for r in range(3)], 3)
    assert said.startswith("exercise 4: wrong") and "most in shard 1" in said and "3.0e-01" in said
    summed = exercises.judge_zero([_report(r, errs=dict(wrong, sum=[1e-8] * 3)) for r in range(3)], 3)
    assert "N times one process's" in summed and "mean" in summed
    assert "without momentum" in exercises.judge_zero([_report(r, errs=dict(wrong, **{"no momentum": [0.0] * 3}))
                                                       for r in range(3)], 3)
    said = exercises.judge_zero([ok[0], ok[1], _report(2, state=300)], 3)
    assert "rank 2 keeps optimizer state for 300 elements, 3.0× its shard of 100" in said and "correct" not in said
    assert "rank 0 keeps no tensor in opt.state" in exercises.judge_zero([_report(r, state=0) for r in range(3)], 3)
    said = exercises.judge_zero([_report(r, allreduces=3) for r in range(3)], 3)
    assert "rank 0 called dist.all_reduce" in said and "correct" not in said
    with pytest.raises(TypeError, match="my_zero_step"):
        exercises.grade_zero(None, None)


def zero_right(opt):
    """ZeRO-1's step with torch.distributed's reduce-scatter and all-gather: rank r owns shard r."""
    import torch
    import torch.distributed as dist
    mine = slice(opt.rank * opt.shard, (opt.rank + 1) * opt.shard)
    grad = torch.empty(opt.shard)
    dist.reduce_scatter_single(grad, opt.flat_grad)
    grad /= opt.world
    momentum = opt.state.setdefault("momentum", torch.zeros(opt.shard))
    momentum.mul_(opt.mu).add_(grad)
    opt.flat_param[mine].add_(momentum, alpha=-opt.lr)
    dist.all_gather_single(opt.flat_param, opt.flat_param[mine].clone())


def zero_ring(opt):
    """Section 6's step (the kit's ring: rank r owns shard (r + 1) mod N) with its momentum in opt.state."""
    import torch
    from kit.comm.ring import allgather, scatter_reduce
    mine = slice(opt.lo, opt.lo + opt.shard)
    scatter_reduce(opt.flat_grad, opt.rank, opt.world, opt.link, opt.piece)
    momentum = opt.state.setdefault("momentum", torch.zeros(opt.shard))
    momentum.mul_(opt.mu).add_(opt.flat_grad[mine].div_(opt.world))
    opt.flat_param[mine].add_(momentum, alpha=-opt.lr)
    allgather(opt.flat_param, opt.rank, opt.world, opt.link, opt.piece)


def zero_no_gather(opt):
    """Every rank updates its shard; nobody sends it."""
    import torch
    import torch.distributed as dist
    mine = slice(opt.rank * opt.shard, (opt.rank + 1) * opt.shard)
    grad = torch.empty(opt.shard)
    dist.reduce_scatter_single(grad, opt.flat_grad)
    momentum = opt.state.setdefault("momentum", torch.zeros(opt.shard))
    momentum.mul_(opt.mu).add_(grad / opt.world)
    opt.flat_param[mine].add_(momentum, alpha=-opt.lr)


def zero_full_state(opt):
    """Plain data parallelism: the right weights, momentum for every parameter on every rank."""
    import torch
    import torch.distributed as dist
    dist.all_reduce(opt.flat_grad)
    momentum = opt.state.setdefault("momentum", torch.zeros_like(opt.flat_grad))
    momentum.mul_(opt.mu).add_(opt.flat_grad / opt.world)
    opt.flat_param.add_(momentum, alpha=-opt.lr)


def zero_skeleton(opt):
    raise NotImplementedError    # your code


@pytest.mark.engines
@pytest.mark.timeout(300)
def test_exercise_4_on_engines_right_wrong_and_unanswered(cluster3):
    cfg = dict(sizes=(16, 24, 5), batch=8)        # 533 parameters: shards of 178 (one padding element)
    for right in (zero_right, zero_ring):
        assert exercises.grade_zero(cluster3, right, cfg).startswith("exercise 4: correct")
    said = exercises.grade_zero(cluster3, zero_no_gather, cfg)
    assert said.startswith("exercise 4: wrong: the ranks disagree") and "all-gather" in said
    said = exercises.grade_zero(cluster3, zero_full_state, cfg)
    assert "keeps optimizer state for 534 elements, 3.0× its shard of 178" in said
    assert exercises.grade_zero(cluster3, zero_skeleton, cfg) == "exercise 4: not answered yet"
