"""kit.comm.ring and kit.comm.ring_sim: the simulation and the real ring equal the sum of the inputs (numpy,
torch.distributed, Horovod), whatever the tensor's layout, and a dead neighbour is a clear error by the deadline."""
import os
import time

import numpy as np
import psutil
import pytest

import kit
from conftest import importable
from kit.comm import ring, ring_sim
from kit.comm import allreduce_timing
from kit.comm.costmodel import ring_bytes
from kit.comm.link import PeerLostError

SHAPES = [(0,), (1,), (2,), (10,), (17,), (1000,), (3, 5), (2, 3, 7)]   # empty, < N, N ∤ len, multi-dim
TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "float64": dict(rtol=1e-12, atol=1e-12)}


# ----------------------------------------------------------------------------------- the simulation
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_simulate_equals_numpy_sum(n, shape, dtype):
    rng = np.random.default_rng(n)
    arrays = [rng.standard_normal(shape).astype(dtype) for _ in range(n)]
    results, steps = ring_sim.simulate(arrays)
    want = np.sum(arrays, axis=0)
    for r in results:
        assert r.shape == shape and r.dtype == dtype
        np.testing.assert_allclose(r, want, **TOL[dtype])


@pytest.mark.parametrize("n", [2, 3, 5])
def test_simulate_steps_follow_the_ring(n):
    results, steps = ring_sim.simulate([np.full(11, float(r)) for r in range(n)])
    assert len(steps) == 2 * (n - 1) + 1 and steps[0].phase == "start"
    assert [s.phase for s in steps[1:]] == ["scatter_reduce"] * (n - 1) + ["allgather"] * (n - 1)
    for s in steps[1:]:
        assert sorted(src for src, _, _ in s.sends) == list(range(n))
        assert all(dst == (src + 1) % n for src, dst, _ in s.sends)        # neighbours only
    after_reduce = steps[n - 1].contributions
    for r in range(n):                       # rank r owns chunk (r + 1) % N, summed over all N workers
        assert after_reduce[r, (r + 1) % n] == n
    assert (steps[-1].contributions == n).all()
    assert all((b == sum(range(n))).all() for b in steps[-1].buffers)


def test_simulate_rejects_mismatched_arrays():
    with pytest.raises(ValueError, match="same shape and dtype"):
        ring_sim.simulate([np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="same shape and dtype"):
        ring_sim.simulate([np.zeros(3), np.zeros(3, dtype="float32")])


def test_chunk_bounds_cover_and_balance():
    for length in range(0, 30):
        for n in range(1, 8):
            b = ring_sim.chunk_bounds(length, n)
            assert b[0][0] == 0 and b[-1][1] == length and len(b) == n
            assert all(b[i][1] == b[i + 1][0] for i in range(n - 1))
            sizes = [hi - lo for lo, hi in b]
            assert max(sizes) - min(sizes) <= 1


# ----------------------------------------------------------------------------------- the real ring on engines
def _engine_compare(shape, dtype, seed):
    """On each engine: ring, naive, torch.distributed, Horovod on rank-specific inputs; return all results."""
    import os
    import numpy as np
    import torch
    import torch.distributed as dist
    import horovod.torch as hvd
    rank, size = int(os.environ["KIT_RANK"]), int(os.environ["KIT_SIZE"])
    inputs = [np.random.default_rng([seed, r]).standard_normal(shape).astype(dtype) for r in range(size)]
    mine = torch.from_numpy(inputs[rank])
    out = {}
    for name in ("ring", "naive", "torch"):
        t = mine.clone()
        traffic = {"ring": ring.allreduce, "naive": ring.allreduce_naive, "torch": dist.all_reduce}[name](t)
        out[name] = t.numpy()
        if traffic is not None:
            out[name + "_traffic"] = (traffic.sent, traffic.received, sorted(traffic.peers))
    t = mine.clone()
    ring.allreduce(t, piece_bytes=3 * t.element_size())     # many 3-element pieces: the double buffering
    out["ring_pieces"] = t.numpy()
    t = mine.clone()
    ring.allreduce(t, check=False)                          # no shape comparison first: the same sum
    out["ring_unchecked"] = t.numpy()
    if mine.numel() > 1:                                    # a strided view: summed through a copy, written back
        wide = torch.zeros(*mine.shape[:-1], 2 * mine.shape[-1], dtype=mine.dtype)
        view = wide[..., ::2]
        view.copy_(mine)
        assert not view.is_contiguous()
        ring.allreduce(view)
        out["ring_strided"] = view.numpy().copy()
        out["strided_gaps_untouched"] = bool((wide[..., 1::2] == 0).all())
    out["horovod"] = hvd.allreduce(mine.clone(), op=hvd.Sum, name=f"cmp{shape}{dtype}{seed}").numpy()
    return {"rank": rank, "inputs": inputs, **out}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.engines
def test_ring_on_engines_equals_numpy_torch_horovod(cluster3, dtype):
    for i, shape in enumerate(SHAPES):
        outs = cluster3.view.apply_sync(_engine_compare, shape, dtype, i)
        want = np.sum(outs[0]["inputs"], axis=0)
        for o in outs:
            names = ("ring", "ring_pieces", "ring_unchecked", "naive", "torch", "horovod")
            for name in names + (("ring_strided",) if np.prod(shape) > 1 else ()):
                assert o[name].shape == shape and o[name].dtype == dtype, (name, shape)
                np.testing.assert_allclose(o[name], want, **TOL[dtype], err_msg=f"{name} {shape}")
            assert o.get("strided_gaps_untouched", True)
            np.testing.assert_allclose(o["ring"], o["torch"], **TOL[dtype])
            np.testing.assert_allclose(o["ring"], o["horovod"], **TOL[dtype])


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_ring_bytes_sent_match_formula(cluster3):
    n, numel = 3, 1000
    outs = cluster3.view.apply_sync(_engine_compare, (numel,), "float32", 99)
    k = numel * 4
    for o in outs:
        sent, received, peers = o["ring_traffic"]
        assert peers == [(o["rank"] + 1) % n]                 # the ring talks to its right neighbour only
        assert abs(sent - ring_bytes(n, k)) <= 2 * (n - 1) * 4   # 2(N-1)/N·K up to chunk rounding
        assert received == sent or abs(received - sent) <= 2 * 4
    total_sent = sum(o["ring_traffic"][0] for o in outs)
    assert total_sent == 2 * (n - 1) * k                      # every element goes around twice, minus one hop
    naive = {o["rank"]: o["naive_traffic"][0] for o in outs}
    assert naive == {0: (n - 1) * k, 1: k, 2: k}              # the parameter server's link carries (N-1)·K


def _engine_mismatch(bad_rank, kind):
    """Every rank calls allreduce; `bad_rank` passes another shape or dtype. Return the error, then a good sum."""
    import os
    import torch
    rank = int(os.environ["KIT_RANK"])
    t = torch.ones(6, dtype=torch.float32)
    if rank == bad_rank:
        t = torch.ones(2, 3) if kind == "shape" else torch.ones(6, dtype=torch.float64)
    before = t.clone()
    try:
        ring.allreduce(t)
        err = None
    except ring.RingError as e:
        err = str(e)
    untouched = bool(t.equal(before))
    good = torch.ones(6)
    ring.allreduce(good)                      # the group still works afterwards: no message was left half-sent
    return {"error": err, "untouched": untouched, "after": good.tolist()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["shape", "dtype"])
@pytest.mark.engines
def test_mismatch_is_a_clear_error_on_every_rank(cluster3, kind):
    outs = cluster3.view.apply_sync(_engine_mismatch, 2, kind)
    for o in outs:
        assert o["error"] is not None and "one shape and dtype on every rank" in o["error"]
        assert "rank 2" in o["error"]
        assert o["untouched"]                 # checked before any data moved
        assert o["after"] == [3.0] * 6


def _engine_allreduce_timed():
    import time
    import torch
    t0 = time.perf_counter()
    try:
        ring.allreduce(torch.ones(1000))
        return {"error": None, "seconds": time.perf_counter() - t0}
    except ring.PeerLostError as e:
        return {"error": str(e), "kind": type(e).__name__, "seconds": time.perf_counter() - t0}


@pytest.mark.timeout(180)
@pytest.mark.engines
def test_dead_neighbour_raises_within_timeout(no_leaks):
    timeout = 10
    with kit.cluster.start(n=2, backend="gloo", timeout=timeout, quiet=True) as c:
        c.init_process_group()
        importable(c)
        pid = c.client[c.engine_of(1)].apply_sync(os.getpid)
        victim = psutil.Process(pid)
        # Rank 0's allreduce is sent before rank 1 dies: once the kit has seen the death it refuses new calls
        # (RankDiedError, tests/test_cluster.py); a call already sent runs on, and the ring must notice by itself.
        t0 = time.time()
        ar = c.client[c.engine_of(0)].apply_async(_engine_allreduce_timed)
        victim.kill()
        try:
            victim.wait(5)
        except psutil.TimeoutExpired:   # a zombie until its nanny reaps it: dead all the same
            pass
        out = ar.get(timeout=timeout + 10)
        assert out["error"] is not None and out["kind"] == PeerLostError.__name__
        assert out["error"].startswith("rank 0: ")                      # who noticed
        assert out["seconds"] < timeout + 5 and time.time() - t0 < timeout + 10


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="unknown implementation"):
        allreduce_timing._runner("carrier-pigeon")
