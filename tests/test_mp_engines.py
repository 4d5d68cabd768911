"""kit.mp on engines: the reference tensor-parallel MLP equals the unsharded one on 2 and 3 Gloo ranks (odd sizes
too), with one allreduce forward and one backward; both pipeline schedules give one process's gradients and hold
the activations the formula says; torch.distributed.pipelining agrees; a stage that dies mid-step is named."""
import time

import pytest

import kit
from conftest import descendants, engines_job
from kit.mp import experiment as ex, lessons, model

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module", params=[2, 3], ids=["n2", "n3"])
def job(request):
    yield from engines_job(request.param, timeout=60, process_group=True)


@pytest.mark.parametrize("d, hidden", [(16, 64), (30, 77), (7, 5)])
def test_tensor_parallel_mlp_equals_the_unsharded_one(job, d, hidden):
    r = ex.tp_check(job, cfg={"d": d, "hidden": hidden, "batch": 9, "reps": 1})
    assert r["ok"], r["diff"]
    assert r["allreduces"] == 2                               # g in forward, f in backward
    assert r["handed"] == r["model_handed"] == model.tp_handed_bytes(9, d)
    assert sum(r["held"]) == r["full"] + (job.size - 1) * d * 4    # the shards, and the row bias on every rank
    if hidden % job.size == 0:
        assert r["torch_error"] is None and r["torch_diff"] < 1e-5   # parallelize_module: the same outputs


def test_both_schedules_equal_one_process(job):
    p = job.size
    for m in (1, p, 5):
        r = ex.grads_check(job, p=p, m=m)
        assert r["ok"], r["errs"]
    r = ex.torch_side_by_side(job, p=p, m=4, cfg={"reps": 1, "tf": 0, "tb": 0})
    assert all(row["err"] < 1e-5 for row in r["rows"].values()), r


def test_the_sweep_records_what_each_stage_held(job):
    x = ex.sweep(job, ps=(job.size,), ms=(1, 4), cfg={"reps": 1, "tf": 0.001, "tb": 0.002})
    assert len(x["rows"]) == 4
    for row in x["rows"]:
        assert row["peak"] == row["peak_model"]               # AFAB: m; 1F1B: p - stage
        assert row["peak_bytes"] == [k * b for k, b in zip(row["peak_model"], row["mb_bytes"])]   # measured bytes
        tl = x["timelines"][f"{row['schedule']}:{row['p']}:{row['m']}"]
        assert len(tl) == 2 * row["m"] * row["p"] and min(e["t0"] for e in tl) == 0
    assert all(c.held for c in lessons.memory_checks(x, job.size, 4))   # 1F1B <= p, AFAB all m, as the formula


def test_a_stage_that_dies_mid_step_is_named():
    before = descendants()
    with kit.cluster.start(n=3, backend="gloo", timeout=20, quiet=True) as c:
        c.init_process_group()
        t0 = time.time()
        with pytest.raises(kit.cluster.RankDiedError, match="rank 1 died"):
            ex.grads_check(c, p=3, m=4, die=(1, 2))
        assert time.time() - t0 < 20 + 30                    # within the Gloo timeout (and the wait's poll)
    deadline = time.time() + 10
    while (descendants() - before) and time.time() < deadline:
        time.sleep(0.2)
    assert not (descendants() - before)


GATHER = '''
import torch, torch.distributed as dist
from kit.mp import tensor

class Gathered(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, y.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()].contiguous()

class GoodGather(tensor.ColumnParallelLinear):
    def forward(self, x):
        return Gathered.apply(super().forward(x))

class NoBackwardSplit(tensor.ColumnParallelLinear):
    def forward(self, x):
        y = super().forward(x)
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, y.detach())
        return torch.cat(parts, dim=-1)
'''


def test_the_exercise_checks_tell_right_from_wrong_on_the_engines(job):
    job.view.execute(GATHER, block=True)
    assert ex.gather_check(job, "GoodGather")["ok"]
    bad = ex.gather_check(job, "NoBackwardSplit")           # cuts the graph: right output, no backward
    assert bad["answered"] and not bad["ok"] and "grad" in bad["why"]
    job.view.execute("def my_order(p, m, stage):\n    return [('F', i) for i in range(m)] + "
                     "[('B', i) for i in range(m)]", block=True)
    assert ex.grads_check(job, p=job.size, m=3, names=("my_order",))["ok"]


TP_LAYERS = '''
import torch, torch.distributed as dist
from kit.mp import tensor

class GapColumn(torch.nn.Module):                  # the notebook's skeleton: a gap still None
    def __init__(self, full, group=None):
        super().__init__()
        self.weight = None

    def forward(self, x):
        return None

class Col(tensor.ColumnParallelLinear):
    pass

class Row(tensor.RowParallelLinear):
    pass

class RowTwice(tensor.RowParallelLinear):          # the bias added on every rank before the sum
    def forward(self, x):
        return tensor.g(torch.nn.functional.linear(x, self.weight, self.bias))
'''


def test_the_section_graders_say_right_wrong_or_not_answered(job):
    from kit.mp import exercises, pipeline as pp
    job.view.execute(TP_LAYERS, block=True)
    assert exercises.check_tp(job, "GapColumn", "Row") == "tensor parallelism: not answered yet"
    assert exercises.check_tp(job, "Col", "Row") == "tensor parallelism: correct"
    wrong = exercises.check_tp(job, "Col", "RowTwice")
    assert wrong.startswith("tensor parallelism: wrong (d=64, hidden=256: the output differs")
    assert exercises.check_schedule(pp.one_f_one_b, "1f1b", job, p=job.size) == "1F1B: correct"


def test_the_benchmark_writes_its_summary(tmp_path):
    import json
    from kit import bench
    line = bench.run("mp", tmp_path, tiny=True)
    x = json.loads((tmp_path / "mp.json").read_text())
    assert x["summary"] == line and line.startswith("mp: 4 gloo engines")
    assert x["tp"]["ok"] and x["grads"]["ok"] and all(r["peak"] == r["peak_model"] for r in x["sweep"]["rows"])
    assert x["placement"] is None and "not run" in line                   # tiny: no lab
    from kit.bench.mp import blocks
    assert len(blocks(x)) == 6


def test_data_parallel_over_pipelines_equals_one_process():
    from kit.mp import hybrid
    with pytest.raises(ValueError, match="must divide by the stages"):
        hybrid.layout(0, 3, 2)
    assert hybrid.layout(3, 4, 2) == (1, 1, [2, 3], [[0, 2], [1, 3]])
    before = descendants()
    with kit.cluster.start(n=4, backend="gloo", timeout=60, quiet=True) as c:
        c.init_process_group()
        for name in ("afab", "1f1b"):
            r = hybrid.dp_pp_check(c, p=2, m=3, steps=3, name=name)
            assert r["ok"] and r["replicas"] == 2, r
    deadline = time.time() + 10
    while (descendants() - before) and time.time() < deadline:
        time.sleep(0.2)
    assert not (descendants() - before)
