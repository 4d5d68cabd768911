"""kit.comm.ps: the parameter server equals single-process SGD, counts its bytes exactly, and fails loudly.

Every test is independent of the others' order: the one that kills an engine starts a cluster of its own.
"""
import os
import time

import numpy as np
import pytest

import kit
from conftest import descendants
from kit.comm import ps
from kit.comm import ps_measure
from kit.comm.costmodel import measure_alpha_beta


def test_shards_cover_the_vector_once():
    for numel, k in ((10, 1), (10, 3), (101898, 2), (7, 7)):
        parts = ps.shards(numel, k)
        assert len(parts) == k
        assert np.array_equal(np.concatenate([np.arange(numel)[p] for p in parts]), np.arange(numel))


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="need 6 engines, but the cluster has 4"):
        ps.check(ps.Config(workers=5, servers=1), engines=4)
    with pytest.raises(ValueError, match="does not split evenly"):
        ps.check(ps.Config(workers=7, batch=120), engines=8)
    with pytest.raises(ValueError, match="mode"):
        ps.check(ps.Config(mode="gossip"), engines=4)
    with pytest.raises(ValueError, match="one server"):
        ps.check(ps.Config(mode="async", servers=2), engines=4)


@pytest.fixture(scope="module")
def cluster():
    before = descendants()
    c = kit.cluster.start(n=4, timeout=20, quiet=True)
    try:
        c.init_process_group()
        yield c
    finally:
        c.stop()
        deadline = time.time() + 10
        while descendants() - before and time.time() < deadline:
            time.sleep(0.2)
        assert not descendants() - before, "kit.cluster left processes running"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers,servers", [(1, 1), (3, 1), (2, 2)])
@pytest.mark.engines
def test_sync_ps_equals_single_process_sgd(cluster, workers, servers):
    cfg = ps.Config(workers=workers, servers=servers, steps=6, batch=60, lr=0.1)
    run = ps.train(cluster, cfg)
    ref, ref_loss = ps.train_single(cfg)
    assert np.abs(run.params - ref).max() < 1e-6
    assert np.allclose(run.loss(), ref_loss, atol=1e-5)
    assert not np.allclose(run.params, ps.initial_params(cfg).numpy())   # it did train


# A server step as notebook 02's reader writes it: defined in `__main__` (a notebook cell), shipped to the engines by
# ipyparallel, run there with the engine's namespace as its globals. This one applies the *sum* of the gradients.
SUMMING_SERVER = """
import time

def server_step(params, grads, workers, link, lr):
    link.wait([link.irecv(g, src=w) for w, g in zip(workers, grads)], "the workers")
    t_recv = time.perf_counter()
    params -= lr * sum(grads)
    t_update = time.perf_counter()
    link.wait([link.isend(params, dst=w) for w in workers], "the workers")
    return t_recv, t_update
"""


DOUBLING_ASYNC_SERVER = """
import torch


def server_step_async(params, grad, version, pulled, link, lr):
    who = torch.empty(1, dtype=torch.int32)
    link.wait([link.irecv(who, src=None)], "any worker")
    w = int(who)
    link.wait([link.irecv(grad, src=w)], "the worker")
    params -= 2 * lr * grad
    link.wait([link.isend(params, dst=w)], "the worker")
    staleness, pulled[w] = version - pulled[w], version + 1
    return w, staleness
"""


@pytest.mark.timeout(300)
@pytest.mark.engines
def test_train_runs_the_algorithm_it_is_given(cluster):
    notebook = {"__name__": "__main__"}
    exec(SUMMING_SERVER, notebook)
    cluster.view.execute("import time, torch", block=True)   # what the notebook's %%px --local cells do there
    cfg = ps.Config(workers=2, servers=1, steps=5, batch=60, lr=0.05)
    run = ps.train(cluster, cfg, algorithm={"server_step": notebook["server_step"]})
    ref, _ = ps.train_single(ps.Config(workers=2, servers=1, steps=5, batch=60, lr=0.1))   # sum of 2 = 2 x mean
    assert np.abs(run.params - ref).max() < 1e-6
    assert np.abs(run.params - ps.train_single(cfg)[0]).max() > 1e-4                     # not the kit's step
    with pytest.raises(ValueError, match="not parts of the algorithm"):
        ps.train(cluster, cfg, algorithm={"sever_step": notebook["server_step"]})
    exec(DOUBLING_ASYNC_SERVER, notebook)                     # the asynchronous server's step is replaceable too
    acfg = ps.Config(workers=1, servers=1, steps=5, batch=60, lr=0.05, mode="async")
    run = ps.train(cluster, acfg, algorithm={"server_step_async": notebook["server_step_async"]})
    assert np.abs(run.params - ref).max() < 1e-6              # one worker at 2 x lr: the same as the summing server


@pytest.mark.timeout(300)
@pytest.mark.engines
def test_async_ps_with_one_worker_is_sync_exactly(cluster):
    cfg = ps.Config(workers=1, servers=1, steps=6, batch=60, lr=0.1)
    sync = ps.train(cluster, cfg)
    asynchronous = ps.train(cluster, ps.Config(workers=1, servers=1, steps=6, batch=60, lr=0.1, mode="async"))
    assert np.array_equal(asynchronous.params, sync.params)              # bitwise: the same updates in order
    assert np.array_equal(asynchronous.loss(), sync.loss())
    assert asynchronous.servers[0]["staleness"] == [0] * cfg.steps     # one worker is never stale


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers,servers", [(3, 1), (2, 2)])
@pytest.mark.engines
def test_bytes_are_exactly_n_times_k_per_direction(cluster, workers, servers):
    cfg = ps.Config(workers=workers, servers=servers, steps=4)
    run = ps.train(cluster, cfg)
    K = run.grad_bytes
    assert K == run.params.size * 4 == ps.initial_params(cfg).numel() * 4
    sb = run.server_bytes()
    assert len(sb) == servers and all(len(s["in"]) == cfg.steps for s in sb)
    for s, part in zip(sb, ps.shards(run.params.size, servers)):
        assert set(s["in"]) == set(s["out"]) == {workers * (part.stop - part.start) * 4}
    assert sum(s["in"][0] for s in sb) == sum(s["out"][0] for s in sb) == workers * K
    assert all(set(w["in"]) == set(w["out"]) == {K} for w in run.worker_bytes())
    assert ps_measure.summarise(run)["bytes_exact"]


@pytest.mark.timeout(300)
@pytest.mark.engines
def test_async_ps_applies_every_push_and_tracks_staleness(cluster):
    cfg = ps.Config(workers=3, steps=5, mode="async", lr=0.03)
    run = ps.train(cluster, cfg)
    srv = run.servers[0]
    assert len(srv["staleness"]) == 15 and sorted(srv["from"]) == sorted([0, 1, 2] * 5)
    assert all(0 <= s < 15 for s in srv["staleness"]) and srv["staleness"][0] == 0
    assert set(run.server_bytes()[0]["in"]) == {run.grad_bytes + 4}   # one push per update, after its 4-byte header
    assert set(run.server_bytes()[0]["out"]) == {run.grad_bytes}      # the parameters, to that worker only
    assert np.isfinite(run.params).all() and not np.allclose(run.params, ps.initial_params(cfg).numpy())


@pytest.mark.timeout(120)
@pytest.mark.engines
def test_too_many_workers_is_a_clear_error(cluster):
    with pytest.raises(ValueError, match="need 5 engines, but the cluster has 4"):
        ps.train(cluster, ps.Config(workers=4))


@pytest.mark.timeout(300)
@pytest.mark.engines
def test_pingpong_measures_alpha_and_bandwidth(cluster):
    before = cluster.view.apply_sync(os.sched_getaffinity, 0)
    ab = measure_alpha_beta(cluster, sizes=[4, 1 << 16, 1 << 20], repeats=3)
    assert ab["alpha"] >= 0 and ab["B"] > 1e6
    assert ab["sizes"] == [4, 1 << 16, 1 << 20] and all(t > 0 for t in ab["seconds"])
    assert sorted(ab["B_max"]) == [1, 2] and all(b > 1e6 for b in ab["B_max"].values())   # 4 engines: 1 and 2 hubs
    assert cluster.view.apply_sync(os.sched_getaffinity, 0) == before      # the ping-pong's pinning is undone


@pytest.mark.timeout(300)
@pytest.mark.engines
def test_exchange_prediction_is_built_from_measured_parts(cluster):
    empty = ps_measure.exchange(cluster, 2, 1, floats=1, steps=6)
    assert empty["bytes_exact"] and empty["server_in"] == 2 * 4 and empty["measured_ms"] > 0
    run = ps.train(cluster, ps.Config(workers=3, servers=1, steps=6, exchange_only=1 << 12))
    t_empty = empty["measured_ms"] / 1e3
    row = ps_measure.summarise(run, alpha=1e-5, B=1e9, t_empty=t_empty, B_max=2e9)
    K = 4 << 12
    assert row["K"] == K and row["server_in"] == 3 * K and row["bytes_exact"]
    assert row["predicted_ms"] == pytest.approx(1e3 * (t_empty + 2 * 3 * K / 2e9))
    assert row["predicted_one_host_ms"] == pytest.approx(1e3 * (2 * 1e-5 + 2 * 3 * K / 1e9))   # latencies overlap
    assert row["error"] == pytest.approx(row["measured_ms"] / row["predicted_ms"] - 1)


@pytest.mark.timeout(180)
@pytest.mark.engines
def test_a_dead_worker_makes_everyone_raise_in_bounded_time(no_leaks):
    with kit.cluster.start(n=4, timeout=20, quiet=True) as c:     # a cluster of its own: this test kills an engine
        c.init_process_group()
        t0 = time.time()
        with pytest.raises(ps.PSError) as err:
            ps.train(c, ps.Config(workers=3, steps=10, die_at=(1, 2)))
        assert time.time() - t0 < 20   # well under the 20 s message timeout: closed sockets are noticed at once
    msg = str(err.value)
    assert "worker 1 (rank 2) DIED" in msg
    assert "server 0 (rank 0) raised PeerLostError: server 0 (rank 0): the worker at rank 2 closed" in msg
    assert "worker 0 (rank 1) raised PeerLostError" in msg and "worker 2 (rank 3) raised PeerLostError" in msg
