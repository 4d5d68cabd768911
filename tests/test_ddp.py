"""kit.comm.dp and kit.ddp (and its benchmark, kit.bench.ddp): the learner's data parallelism (naive, overlapped,
bucketed hooks; the ZeRO step) equals one process training on the N× batch, as do DDP (with and without the fp16 hook)
and FSDP2; buckets are right on awkward shapes; the bytes and the benchmark's JSON."""
import json
import os

import numpy as np
import pytest

from conftest import importable
from kit.ddp import horovod, schemes
from kit.comm import costmodel, dp

TINY = dict(schemes.CFG, sizes=(16, 24, 24, 5), batch=8, warmup=2, reps=2)


# ----------------------------------------------------------------------------------- pure Python
def test_buckets_go_backwards_and_close_once_they_reach_the_cap():
    assert dp.assign_buckets([4, 4, 4, 4], 8, None) == [[3, 2], [1, 0]]
    assert dp.assign_buckets([4, 4, 4, 4], 6, None) == [[3, 2], [1, 0]]      # 8 >= 6: a bucket may exceed its cap
    assert dp.assign_buckets([4, 100, 4], 8, None) == [[2, 1], [0]]
    assert dp.assign_buckets([4, 4, 4, 4], 8, 4) == [[3], [2, 1], [0]]       # the first bucket's own cap
    assert dp.assign_buckets([4, 4, 4], 1 << 20) == [[2, 1, 0]]              # one bucket
    assert dp.assign_buckets([1 << 19] * 3, 1 << 19) == [[2], [1], [0]]      # a cap given caps the first bucket too
    assert dp.assign_buckets([1 << 19] * 3) == [[2, 1], [0]]                 # DDP's default: first bucket 1 MiB
    assert dp.assign_buckets([0, 4, 0], 4, None) == [[2, 1], [0]]
    assert dp.assign_buckets([], 8) == []
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = [int(s) for s in rng.integers(0, 50, size=rng.integers(1, 12))]
        cap, first = int(rng.integers(1, 80)), int(rng.integers(1, 80))
        buckets = dp.assign_buckets(sizes, cap, first)
        assert [i for b in buckets for i in b] == list(range(len(sizes)))[::-1]     # every index once, in reverse
        caps = [first] + [cap] * len(buckets)
        # closed exactly when it reached its cap: every closed bucket reached it, and not before its last tensor
        for b, c in zip(buckets[:-1], caps):
            assert sum(sizes[i] for i in b) >= c > sum(sizes[i] for i in b[:-1])


def test_buckets_are_ddps_own_assignment():
    """DDP's buckets (after its first step it rebuilds them in the order gradients became ready, backward's: the
    reversed parameters, with limits [first bucket's cap, bucket_cap]) equal kit's, on random shapes; and a real DDP
    (one rank) rebuilds exactly kit's buckets, under its default cap and under given caps."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    assert dp.FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(1, 14))
        params = [torch.empty(int(rng.integers(0, 400_000))) for _ in range(n)]
        cap = int(rng.integers(1, 3 << 20))
        for given, limits in ((cap, [cap, cap]), (None, [dist._DEFAULT_FIRST_BUCKET_BYTES, dp.DEFAULT_BUCKET_BYTES])):
            ddp_buckets, _ = dist._compute_bucket_assignment_by_size(params[::-1], limits, [False] * n)
            ddp_buckets = [[n - 1 - i for i in b] for b in ddp_buckets]           # back to registration indices
            assert dp.assign_buckets([p.numel() * 4 for p in params], given) == ddp_buckets


def test_a_real_ddp_rebuilds_the_kits_buckets(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for cap_mb in (None, 4, 1, 0.25, 1 / 64):
            model = schemes.make_model(schemes.CFG)
            ddp = DDP(model, **({} if cap_mb is None else {"bucket_cap_mb": cap_mb}))
            for _ in range(3):                   # rebuilt at the second forward, logged at the third
                ddp(torch.randn(4, schemes.CFG["sizes"][0])).sum().backward()
            rebuilt = ddp._get_ddp_logging_data()["rebuilt_per_bucket_param_indices"]
            theirs = [[int(i) for i in b.split()] for b in rebuilt.split(",")]
            sizes = [p.numel() * p.element_size() for p in model.parameters()]
            mine = dp.assign_buckets(sizes, None if cap_mb is None else int(cap_mb * 2**20))
            assert theirs == mine, (cap_mb, theirs, mine)
    finally:
        dist.destroy_process_group()


def test_bytes_per_step_follow_the_ring_model():
    N, K = 4, 1000
    assert dp.wire_bytes("all_reduce", K, N) == costmodel.ring_bytes(N, K) == 1500
    assert dp.wire_bytes("reduce_scatter_single", K, N) == dp.wire_bytes("all_gather_single", K, N) == 750
    assert dp.sent_per_step([("reduce_scatter_single", K), ("all_gather_single", K)], N) == 1500   # ZeRO = ring
    t = dp.t_comm_buckets(N, [K, 2 * K], 1e-4, 1e9)
    assert t == pytest.approx(costmodel.t_comm_ring(N, K, 1e-4, 1e9) + costmodel.t_comm_ring(N, 2 * K, 1e-4, 1e9))
    assert dp.t_comm_buckets(N, [3 * K], 1e-4, 1e9) < t                     # one message fewer: one α·2(N-1) less


def test_the_horovod_rows_say_where_horovods_time_went():
    row = lambda scheme, ms, **kw: {"scheme": scheme, "label": scheme, "step_ms": ms,  # noqa: E731
                                    "step_ms_range": [ms / 2, 3 * ms], "calls": 14, "ok": True, **kw}
    steps = [{"span": 30.0, "wire": 10.0, "negotiation": 18.0, "idle": 4.0, "allreduces": 2, "cycles": 5},
             {"span": 20.0, "wire": 12.0, "negotiation": 6.0, "idle": 2.0, "allreduces": 3, "cycles": 2},
             {"span": 90.0, "wire": 11.0, "negotiation": 75.0, "idle": 6.0, "allreduces": 2, "cycles": 30}]
    x = {"N": 3, "rows": [row("ddp:1048576", 20.0), row("horovod", 40.0)],
         "horovod_timeline": row("horovod", 45.0, horovod_steps=steps)}
    runs = horovod.horovod_rows(x)
    assert [(r["run"], r["median ms"], r["fastest"], r["slowest"]) for r in runs] == [
        ("horovod", 40.0, 20.0, 120.0), ("ddp:1048576", 20.0, 10.0, 60.0), ("horovod (timeline on)", 45.0, 22.5, 135.0)]
    median, longest = horovod.negotiation_rows(x)
    assert median == {"steps": "median of 3", "span": 30.0, "wire": 11.0, "negotiation": 18.0, "idle": 4.0,
                      "allreduces": 2.0}
    assert longest == {"steps": "longest", "span": 90.0, "wire": 11.0, "negotiation": 75.0, "idle": 6.0,
                       "allreduces": 2}
    del x["horovod_timeline"]                         # a run without Horovod's timeline: its step times only
    assert len(horovod.horovod_rows(x)) == 2 and horovod.negotiation_rows(x) == []


def test_schemes_and_labels():
    names = schemes.all_schemes((1024,), 2048)
    assert names == ["local", "naive", "overlap", "buckets:1024", "ddp:2048", "ddp_fp16:2048", "horovod", "zero",
                     "zero:65536", "fsdp"]
    assert schemes.label("buckets:1024") == "buckets 1 KB"
    assert schemes.label("zero:65536") == "ZeRO-1, ring pieces of 64 KB"


# ----------------------------------------------------------------------------------- on engines
@pytest.mark.timeout(240)
@pytest.mark.engines
def test_tiny_benchmark_gives_its_rows_and_summary(tmp_path, cluster3):
    """The benchmark's tiny run on the shared engines (`python -m kit.bench` writing the JSON: tests/test_bench.py)."""
    from kit.bench import ddp as bench_ddp
    x, summary = bench_ddp.bench(tmp_path, tiny=True, cluster=cluster3)
    doc = json.loads(json.dumps({"summary": summary, **x}, default=float))
    assert doc["summary"].startswith("ddp: N=3 gloo engines")
    assert "checks held: schemes with one process's weights" in doc["summary"]   # each equals one-process SGD
    assert len(doc["rows"]) == len(schemes.all_schemes(bench_ddp.SETTINGS["tiny"]["buckets"]))
    assert schemes.table(doc).count("\n") == len(doc["rows"]) + 1


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_alpha_as_an_allreduce_pays_it_is_its_median_call_over_2_n_minus_1(cluster3):
    """The bucket model's α (kit.ddp.experiment): an allreduce of one float among the engines, per message."""
    from kit.comm import costmodel
    ar = costmodel.measure_allreduce_alpha(cluster3, repeats=5)
    lo, hi = ar["range"]
    assert 0 < lo <= ar["seconds"] <= hi and ar["repeats"] == 5
    assert ar["alpha"] == pytest.approx(ar["seconds"] / (2 * (cluster3.size - 1)))


@pytest.mark.timeout(180)
@pytest.mark.engines
def test_every_scheme_equals_one_process_sgd_on_the_nx_batch(cluster3):
    names = schemes.all_schemes((64, 1 << 20), 256)
    per_rank = cluster3.view.apply_sync(schemes.run_schemes, names, TINY)
    for rank, rows in enumerate(per_rank):
        for r in rows:
            tol = schemes.TOL.get(r["scheme"].partition(":")[0], schemes.TOL_FLOAT32)
            if r["scheme"] != "local":
                assert r["err"] <= tol, (rank, r["scheme"], r["err"])
            assert len(r["seconds"]) == TINY["reps"]
    rows = {r["scheme"]: r for r in per_rank[0]}
    assert rows["local"]["err"] > 1e-3                # without communication the ranks really do differ
    K = sum(n * m + m for n, m in zip(TINY["sizes"], TINY["sizes"][1:])) * 4
    assert [c for c, _ in rows["naive"]["calls"]] == ["all_reduce"] * 6
    assert rows["buckets:1048576"]["calls"] == [("all_reduce", K)]        # one bucket, one message
    assert rows["ddp_fp16:256"]["calls"] and sum(b for _, b in rows["ddp_fp16:256"]["calls"]) * 2 == K
    hvd = rows["horovod"]["calls"]                   # every gradient handed to Horovod once, fused on its thread
    assert len(hvd) == 6 and sum(b for _, b in hvd) == K
    assert rows["horovod"]["horovod_steps"] is None  # these engines started without HOROVOD_TIMELINE=DYNAMIC
    zero = rows["zero"]
    assert [c for c, _ in zero["calls"]] == ["reduce_scatter", "all_gather"]   # the ring's two phases
    padded = -(-K // 4 // 3) * 3 * 4
    assert zero["calls"][0][1] == padded and zero["held"]["optimizer"] == padded // 3 and zero["held"]["grads"] == K
    fsdp = rows["fsdp"]["held"]
    assert all(abs(fsdp[k] - K / 3) < 200 for k in fsdp), fsdp       # 1/N each, up to FSDP2's row padding
    # at its peak (PeakMeter) ZeRO-1 held the full parameters and gradient (views of its flat buffers), 1/N of the
    # momentum, (2 + 1/N)·K, ZeRO-1's formula, and the ring's two receive buffers: a chunk each (the 4 MiB pieces
    # are larger than a chunk of this model)
    peak = zero["peak"]
    assert peak["params"] == peak["grads"] == K and peak["optimizer"] == padded // 3, peak
    assert peak["temporary"] == 2 * padded // 3, peak
    small = rows["zero:65536"]["peak"]                               # pieces of 64 KB: larger than this chunk too
    assert small["temporary"] == 2 * padded // 3 and rows["zero:65536"]["err"] < 1e-5, small
    assert rows["naive"]["peak"]["grads"] >= K                       # the replicated gradients, all alive at once
    assert rows["buckets:1048576"]["peak"]["temporary"] == K          # its one flat bucket, launched, not finished
    assert rows["ddp:256"]["peak"]["grads"] == K and rows["ddp:256"]["peak"]["temporary"] == 0   # views of buckets
    # FSDP2 unshards one layer at a time (module hooks see it swapped in): its full weights and bias, then in
    # backward their full gradients too, beside every rank's shards
    layer = max(n * m + m for n, m in zip(TINY["sizes"], TINY["sizes"][1:])) * 4
    fsdp_peak = rows["fsdp"]["peak"]
    assert fsdp_peak["temporary"] >= layer and fsdp_peak["total"] > K, fsdp_peak


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_horovods_timeline_is_recorded_in_a_job_of_its_own():
    row = horovod.horovod_timeline(n=2, cfg=TINY)
    steps = row["horovod_steps"]                     # rank 0's record of every rank's collectives, per timed step
    assert row["scheme"] == "horovod" and row["ok"] and len(steps) == TINY["reps"]
    assert all(st["allreduces"] >= 1 and 0 < st["wire"] <= st["span"] for st in steps), steps
    assert "HOROVOD_TIMELINE" not in os.environ      # the variable was set for that job's start only


def _engine_buckets_odd_shapes(bucket_bytes):
    """Parameters of awkward shapes (one empty, one unused): every bucket size gives the mean gradient."""
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    shapes = [(7,), (3, 5), (1,), (0,), (1000,), (2,)]
    params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])
    coef = [torch.from_numpy(np.random.default_rng([r, i]).standard_normal(s).astype("float32"))
            for r in range(world) for i, s in enumerate(shapes)]
    mine = coef[rank * len(shapes):(rank + 1) * len(shapes)]
    sync = dp.Buckets(params, bucket_bytes, first_bucket_bytes=None)   # every bucket at the swept cap
    out = []
    for step in range(2):                            # twice: the buckets reset after finish()
        for p in params:
            p.grad = None
        sum((p * c).sum() for i, (p, c) in enumerate(zip(params, mine)) if i != 5).backward()   # param 5 unused
        sync.finish()
        out.append([p.grad.numpy().copy() for p in params])
    sync.remove()
    want = [np.mean([coef[r * len(shapes) + i].numpy() for r in range(world)], axis=0) for i in range(len(shapes))]
    want[5] = np.zeros(2, dtype="float32")
    return {"ok": all(np.allclose(g, w, atol=1e-6) for grads in out for g, w in zip(grads, want)),
            "buckets": len(sync.buckets)}


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_buckets_are_right_on_odd_shapes_and_unused_parameters(cluster3):
    importable(cluster3)
    counts = []
    for bucket_bytes in (1, 16, 30, 100, 4000, 1 << 20):
        outs = cluster3.view.apply_sync(_engine_buckets_odd_shapes, bucket_bytes)
        assert all(o["ok"] for o in outs), bucket_bytes
        counts.append(outs[0]["buckets"])
    assert counts[0] == 5 and counts[-1] == 1 and counts == sorted(counts, reverse=True)
    # at 1 byte every tensor reaches the cap alone except the empty one, which rides with the next


def _engine_zero_state():
    """Train with ZeroSGD; return this rank's momentum shard, the reference's full momentum and the weight error."""
    import torch
    import torch.distributed as dist
    from kit.ddp import schemes
    cfg = dict(schemes.CFG, sizes=(16, 24, 24, 5), batch=8)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = schemes.make_model(cfg)
    opt = dp.ZeroSGD(model.parameters(), cfg["lr"], cfg["momentum"])
    ref = schemes.make_model(cfg)
    ref_opt = schemes.sgd(ref.parameters(), cfg)
    for step in range(3):
        schemes.train_step(model, opt, lambda: None, *schemes.batch(cfg, step, rank, world))
        schemes.train_step(ref, ref_opt, lambda: None, *schemes.batch(cfg, step, None, world))
    full = torch.cat([ref_opt.state[p]["momentum_buffer"].reshape(-1) for p in ref.parameters()])
    grad_ptr = opt.flat_grad.data_ptr() // opt.flat_grad.element_size()
    return {"shard": opt.momentum.numpy(), "lo": opt.lo, "full": full.numpy(), "err": schemes.max_diff(model, ref),
            "grads_zero": all(not p.grad.any() for p in model.parameters()),
            "views": [(p.data_ptr() // 4 - opt.flat_param.data_ptr() // 4, p.grad.data_ptr() // 4 - grad_ptr)
                      for p in model.parameters()], "numels": [p.numel() for p in model.parameters()]}


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_zero_shards_concatenate_to_the_full_optimizer_state(cluster3):
    outs = cluster3.view.apply_sync(_engine_zero_state)
    full = outs[0]["full"]
    together = np.concatenate([o["shard"] for o in sorted(outs, key=lambda o: o["lo"])])
    assert together.size >= full.size and together.size - full.size < 3          # padded to a multiple of N
    np.testing.assert_allclose(together[:full.size], full, atol=1e-6)
    assert not together[full.size:].any()                                          # the padding stays zero
    assert all(o["err"] < 1e-5 for o in outs)
    assert all(o["grads_zero"] for o in outs)                 # after the step the gradient buffer is zeroed
    offsets = list(np.cumsum([0] + outs[0]["numels"][:-1]))     # each parameter and its .grad: a view of its buffer
    assert all(o["views"] == [(int(off), int(off)) for off in offsets] for o in outs)


def _engine_ddp_vs_buckets():
    """The learner's buckets and torch's DDP, same model, same data: the same weights after 3 steps."""
    from kit.ddp import schemes
    import torch.distributed as dist
    cfg = dict(schemes.CFG, sizes=(16, 24, 24, 5), batch=8)
    rank, world = dist.get_rank(), dist.get_world_size()
    models = []
    for scheme in ("buckets:256", "ddp:256"):
        model, opt, finish = schemes.setup(scheme, schemes.make_model(cfg), cfg)
        for step in range(3):
            schemes.train_step(model, opt, finish, *schemes.batch(cfg, step, rank, world))
        models.append(model.module if hasattr(model, "module") else model)
    return schemes.max_diff(*models)


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_ddp_and_the_learners_buckets_agree(cluster3):
    assert all(d < 1e-6 for d in cluster3.view.apply_sync(_engine_ddp_vs_buckets))


def _engine_counting():
    import torch
    import torch.distributed as dist
    with dp.counting() as calls:
        dist.all_reduce(torch.ones(10))
        dist.all_reduce(tensor=torch.ones(3, dtype=torch.float64))
    before = dist.all_reduce
    return calls, before is dist.all_reduce


@pytest.mark.timeout(60)
@pytest.mark.engines
def test_counting_records_each_call_and_restores_torch(cluster3):
    importable(cluster3)
    for calls, restored in cluster3.view.apply_sync(_engine_counting):
        assert calls == [("all_reduce", 40), ("all_reduce", 24)] and restored


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_the_timeline_records_every_allreduce_from_launch_to_done(cluster3):
    from kit.ddp import lab
    per_rank = cluster3.view.apply_sync(lab.timeline, TINY, 3)
    params = list(schemes.make_model(TINY).parameters())
    for rank, steps in enumerate(per_rank):
        assert len(steps) == 3
        for t in steps:
            assert t["rank"] == rank and 0 < t["forward"] <= t["backward"] <= t["summed"] <= t["end"]
            ar = t["allreduces"]   # one per gradient, in backward's order: the last layer's first
            assert [a["bytes"] for a in ar] == [4 * p.numel() for p in params][::-1]
            assert all(t["forward"] <= a["launched"] <= t["backward"] and a["launched"] <= a["done"] for a in ar)
    slowest = lab.median_step(per_rank)
    ends = sorted(max(ranks, key=lambda t: t["end"])["end"] for ranks in zip(*per_rank))
    assert slowest["end"] == ends[1]
