"""kit.comm.costmodel: the α–β formulas in one vocabulary (N workers, K bytes, k servers, alpha, B) and the one fit."""
import numpy as np
import pytest

from kit.comm import costmodel as cm


def test_parameter_server_overlaps_latency_and_pays_the_overhead_per_message():
    # Push then pull: each phase alpha once, o for each of the server's N-1 further messages, N K/k bytes each way.
    assert cm.t_comm_ps(4, 1e6, 1e-5, 1e9) == pytest.approx(2 * 1e-5 + 2 * 4e-3)
    assert cm.t_comm_ps(4, 1e6, 1e-5, 1e9, o=2e-6) == pytest.approx(2 * (1e-5 + 3 * 2e-6) + 2 * 4e-3)
    assert cm.t_comm_ps(4, 1e6, 1e-5, 1e9, k=2) == pytest.approx(2 * 1e-5 + 2 * 2e-3)
    # One more worker adds 2 o of latency (not 2 alpha) and 2 K/B of bytes at one server.
    assert cm.t_comm_ps(5, 0, 1e-5, 1e9, o=3e-6) - cm.t_comm_ps(4, 0, 1e-5, 1e9, o=3e-6) == pytest.approx(6e-6)
    assert np.allclose(cm.t_comm_ps(np.array([1, 2]), 1e6, 0, 1e9), [2e-3, 4e-3])


def test_pipelined_sharded_ps_needs_K_over_B_each_way():
    # BytePS: k >= N servers (extra CPU hosts), pushes overlapped with pulls: a worker's link carries K each way.
    assert cm.t_comm_ps(8, 1e6, 0, 1e9, k=8, pipelined=True) == pytest.approx(1e-3)
    assert cm.t_comm_ps(8, 1e6, 0, 1e9, k=16, pipelined=True) == pytest.approx(1e-3)
    assert cm.t_comm_ps(8, 1e6, 0, 1e9, k=1, pipelined=True) == pytest.approx(8e-3)
    # ... less than the ring's 2(N-1)/N K once N > 2: what BytePS's extra servers buy.
    assert cm.t_comm_ps(8, 1e6, 0, 1e9, k=8, pipelined=True) < cm.t_comm_ring(8, 1e6, 0, 1e9)


def test_colocated_servers_move_the_rings_bytes_in_two_latencies():
    assert cm.t_comm_colocated(4, 1e6, 1e-4, 1e9) == pytest.approx(2e-4 + 1.5e-3)
    assert cm.t_comm_colocated(4, 1e6, 1e-4, 1e9) - cm.t_comm_ring(4, 1e6, 1e-4, 1e9) == pytest.approx(2e-4 - 6e-4)


def test_one_host_model_uses_the_measured_empty_exchange_and_max_rate():
    assert cm.t_comm_one_host(1, 1e6, 1e9, 1e-3, B_max=1.5e9) == pytest.approx(1e-3 + 2 * 1e6 / 1e9)
    assert cm.t_comm_one_host(4, 1e6, 1e9, 1e-3, B_max=1.5e9) == pytest.approx(1e-3 + 2 * 4e6 / 1.5e9)
    assert cm.t_comm_one_host(4, 1e6, 1e9, 1e-3) == pytest.approx(1e-3 + 2 * 4e6 / 1e9)


def test_ring_formulas():
    assert cm.ring_bytes(5, 10e6) == pytest.approx(16e6)
    assert cm.t_comm_ring(2, 1e6, 1e-4, 1e9) == pytest.approx(2e-4 + 1e-3)
    assert cm.t_comm_ring(4, 4e6, 1e-4, 1e9) == pytest.approx(6 * (1e-4 + 1e-3))
    assert cm.busbw(64e6, 0.1, 2) == pytest.approx(640e6)


@pytest.mark.parametrize("o", [0.0, 5e-6])
def test_the_ring_loses_small_messages_at_scale_and_wins_large_ones(o):
    """The acceptance case: N = 64, alpha = 50 us, B = 125 MB/s (1 Gbit/s): the ring's 2(N-1) latencies in
    sequence cost more than one server's 2 alpha + 2(N-1) o and 2 N K / B up to 4 KB; at 1 MB the bytes decide."""
    N, alpha, B = 64, 50e-6, 125e6
    for K in (4, 1 << 10, 4 << 10):
        assert cm.t_comm_ring(N, K, alpha, B) > cm.t_comm_ps(N, K, alpha, B, o=o)
    for K in (1 << 20, 100 << 20):
        assert cm.t_comm_ring(N, K, alpha, B) < cm.t_comm_ps(N, K, alpha, B, o=o)
    K_star = cm.crossover_bytes(N, alpha, B, o)
    assert 4 << 10 < K_star < 1 << 20
    assert cm.t_comm_ring(N, K_star, alpha, B) == pytest.approx(float(cm.t_comm_ps(N, K_star, alpha, B, o=o)))


def test_a_fully_serial_server_never_lets_the_ring_lose():
    # o = alpha: the server pays its N messages one after another, and the ring wins at every K.
    assert cm.crossover_bytes(64, 50e-6, 125e6, o=50e-6) == 0
    for K in (0, 4, 4e3, 1e6):
        assert cm.t_comm_ring(64, K, 50e-6, 125e6) <= cm.t_comm_ps(64, K, 50e-6, 125e6, o=50e-6)


def test_a_ring_whose_steps_wait_longer_than_the_link_loses_even_to_a_slow_server():
    # A ring step that waits 1 ms (its processes scheduled one after another) against a server paying o = 0.4 ms.
    N, alpha, B, o, a_r = 8, 50e-6, 125e6, 400e-6, 1e-3
    K_star = cm.crossover_bytes(N, alpha, B, o, alpha_ring=a_r)
    assert K_star > 0 and cm.crossover_bytes(N, alpha, B, o) == 0
    assert cm.t_comm_ring(N, K_star, a_r, B) == pytest.approx(float(cm.t_comm_ps(N, K_star, alpha, B, o=o)))


def test_fit_latency_recovers_alpha_and_overhead():
    ns = np.array([1, 2, 4, 8])
    alpha, o = cm.fit_latency(ns, 2 * (80e-6 + (ns - 1) * 15e-6))
    assert alpha == pytest.approx(80e-6) and o == pytest.approx(15e-6)
    assert cm.fit_latency(ns, 2 * (80e-6 + (ns - 1) * 15e-6), alpha=80e-6) == (80e-6, pytest.approx(15e-6))
    spiked = 2 * (80e-6 + (ns - 1) * 15e-6) + np.array([0, 0, 0.03, 0])      # one N hit by a 30 ms spike
    assert cm.fit_latency(ns, spiked, alpha=80e-6)[1] == pytest.approx(15e-6)
    with pytest.raises(ValueError, match="two different N"):
        cm.fit_latency([4, 4], [1e-3, 1e-3])
    with pytest.raises(ValueError, match="some N > 1"):
        cm.fit_latency([1], [1e-3], alpha=1e-4)


def test_latency_share_and_bad_scheme():
    assert cm.latency_share("ring", 4, 0, 1e-4, 1e9) == pytest.approx(1.0)
    assert cm.latency_share("ps", 2, 1e6, 0, 1e9) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="scheme must be one of"):
        cm.predict("tree", 4, 1e6, 1e-4, 1e9)


def test_one_fit_for_pingpong_and_ring():
    sizes = np.array([4, 1e3, 1e5, 1e6, 1e7])
    alpha, B = cm.fit_alpha_beta(sizes, 50e-6 + sizes / 2e9)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and B == pytest.approx(2e9, rel=1e-6)
    K = np.array([1e3, 1e6, 1e8])
    n = 4
    alpha, B = cm.fit_alpha_beta(K, cm.t_comm_ring(n, K, 5e-5, 2e9), hops=2 * (n - 1), share=2 * (n - 1) / n)
    assert alpha == pytest.approx(5e-5, rel=1e-6) and B == pytest.approx(2e9, rel=1e-6)


def test_fit_takes_bandwidth_from_large_messages_only():
    sizes = np.array([4, 1 << 10, 1 << 16, 1 << 20, 1 << 22])
    seconds = 20e-6 + sizes / 1e9
    seconds[2] = 20e-6 + sizes[2] / 10e9          # a cache-sized message that flatters B must not count
    alpha, B = cm.fit_alpha_beta(sizes, seconds)
    assert B == pytest.approx(1e9, rel=1e-6) and alpha == pytest.approx(20e-6, rel=1e-6)


def test_sizes_and_human():
    assert cm.sizes(4 << 10, 64 << 20) == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20,
                                           64 << 20]
    assert [cm.human(b) for b in (4, 4 << 10, 64 << 20, 1536)] == ["4 B", "4 KB", "64 MB", "1.5 KB"]


def test_pingpong_needs_two_engines():
    class One:
        size = 1
    with pytest.raises(ValueError, match="at least 2 engines"):
        cm.measure_alpha_beta(One())


@pytest.mark.parametrize("N", [1, 2, 3, 8, 64, 1024])
@pytest.mark.parametrize("k", [1, 2, 7, 64, 4096])
@pytest.mark.parametrize("K", [0, 4e3, 1e6, 1e8])
@pytest.mark.parametrize("o", [0.0, 1e-5])
def test_no_prediction_beats_the_wires(N, k, K, o):
    """No prediction beats its busiest link carrying B each way (per direction, full duplex): a PS worker sends K
    and receives K, a server N K/k each way, a ring or co-located rank 2(N-1)/N K; nor an allreduce without extra
    servers beats 2(N-1)/N K/B; latency comes on top."""
    alpha, B = 5e-5, 1.25e8
    for scheme in cm.SCHEMES:
        t = float(cm.predict(scheme, N, K, alpha, B, k, o))
        assert t >= cm.lower_bound(scheme, N, K, B, k) - 1e-15, scheme
        assert t >= (2 * alpha if scheme != "ring" or N > 1 else 0), scheme
    assert cm.bytes_per_direction("ps", N, K, k) >= K and cm.bytes_per_direction("ps", N, K, k) >= N * K / k
    for scheme in ("ring", "colocated"):      # the workers do the sums: 2(N-1)/N K is the least each way
        assert float(cm.predict(scheme, N, K, alpha, B, k, o)) >= cm.ring_bytes(N, K) / B


def test_the_lab_runs_latency_fit_reads_alpha_and_o_from_the_smallest_messages():
    """kit.netlab.exchange.latency on a made-up run: a server paying 2(alpha + (N-1) o) plus its bytes."""
    from kit.netlab import exchange
    alpha, o, B, K = 100e-6, 20e-6, 125e6, 4096
    rows = [{"impl": "ps", "N": n, "bytes": K, "seconds": float(cm.t_comm_ps(n, K, alpha, B, o=o))} for n in (2, 4, 8)]
    rows += [{"impl": "ring", "N": n, "bytes": K, "seconds": float(cm.t_comm_ring(n, 0, alpha, B))} for n in (2, 4)]
    lat = exchange.latency({"sizes": [K, 1 << 20], "link": {"alpha": alpha, "B": B}, "rows": rows})
    assert lat["ps_alpha"] == alpha and lat["o"] == pytest.approx(o)     # alpha: the ping-pong's, o fitted
    assert lat["ring_alpha"] == {2: pytest.approx(alpha), 4: pytest.approx(alpha)}


def test_exercise_3_grades_the_server_never_wins_as_wrong_when_it_does():
    from kit.comm.exercises import check_ring_vs_ps
    alpha, o, B, N = 5e-4, 1e-4, 1.2e8, 64
    gap = lambda K: cm.t_comm_ps(N, K, alpha, B, o=o) - cm.t_comm_ring(N, K, alpha, B)  # noqa: E731
    k_star = float(cm.crossover_bytes(N, alpha, B, o))
    assert check_ring_vs_ps(gap, k_star, True, alpha, o, B, N) == "exercise 3: correct"
    assert "'the server wins at some K' wrong" in check_ring_vs_ps(gap, k_star, False, alpha, o, B, N)
    assert "crossover K wrong" in check_ring_vs_ps(gap, 1.1 * k_star, True, alpha, o, B, N)
    old_gap = lambda K: 2 * alpha + 2 * K / B * (N - (N - 1) / N)  # noqa: E731  the old model's answer
    assert "t_ps - t_ring wrong" in check_ring_vs_ps(old_gap, k_star, True, alpha, o, B, N)
    assert check_ring_vs_ps(None, k_star, True, alpha, o, B, N) == "exercise 3: not answered yet"
    # A server that pays its messages one after another (o = alpha) never wins: then False and 0 are right.
    serial = lambda K: cm.t_comm_ps(N, K, alpha, B, o=alpha) - cm.t_comm_ring(N, K, alpha, B)  # noqa: E731
    assert check_ring_vs_ps(serial, 0, False, alpha, alpha, B, N) == "exercise 3: correct"
    # ... unless each of the ring's messages pays more than alpha (the lab's a_ring): then the server wins small K.
    a_ring = 7 * alpha
    lab_gap = lambda K: cm.t_comm_ps(N, K, alpha, B, o=alpha) - cm.t_comm_ring(N, K, a_ring, B)  # noqa: E731
    lab_k = float(cm.crossover_bytes(N, alpha, B, alpha, alpha_ring=a_ring))
    assert lab_k > 0 and check_ring_vs_ps(lab_gap, lab_k, True, alpha, alpha, B, N, a_ring) == "exercise 3: correct"
    assert "crossover K wrong" in check_ring_vs_ps(lab_gap, 0, False, alpha, alpha, B, N, a_ring)
    assert "t_ps - t_ring wrong" in check_ring_vs_ps(serial, lab_k, True, alpha, alpha, B, N, a_ring)


def test_latency_table_fits_the_servers_empty_steps(monkeypatch):
    """kit.comm.ps_measure.latency_table with the engines replaced by a server paying 2(alpha + (N-1) o)."""
    from kit.comm import ps_measure
    alpha, o = 90e-6, 30e-6
    monkeypatch.setattr(ps_measure, "exchange", lambda cluster, n, k, floats, steps: {
        "measured_ms": 1e3 * 2 * (alpha + (n - 1) * o)})
    lat = ps_measure.latency_table(type("C", (), {"size": 5})(), runs=2)
    assert lat["ns"] == [1, 2, 3, 4] and lat["alpha"] == pytest.approx(alpha) and lat["o"] == pytest.approx(o)
    assert all(lo == hi for lo, hi in lat["range"])


def test_notebook_02s_checkers_accept_the_right_answers_and_reject_wrong_ones():
    from types import SimpleNamespace

    from kit.comm import exercises as ex
    K = 1000
    rows = [{"N": 3, "k": 1, "servers_in": [3000]}, {"N": 2, "k": 2, "servers_in": [1000, 1000]}]
    assert ex.check_server_bytes(lambda N, K, k: N * K / k, lambda N, K, k: N * K, rows, K) == "exercise 1: correct"
    assert "all servers wrong" in ex.check_server_bytes(lambda N, K, k: N * K / k, lambda N, K, k: N * K / k, rows, K)
    assert ex.check_server_bytes(None, None, rows, K) == "exercise 1: not answered yet"
    alpha, o, B, Kb, c = 50e-6, 5e-6, 25e9 / 8, 25.6e6 * 4, 0.25
    n = next(n for n in range(1, 10_000) if cm.t_comm_ps(n, Kb, alpha, B, 1, o) > c)
    assert ex.check_n_star(n, alpha, B, Kb, c, o) == "exercise 2: correct"
    assert ex.check_n_star(n + 1, alpha, B, Kb, c, o) == "exercise 2: wrong"
    k = next(k for k in range(1, 65) if cm.t_comm_ps(64, Kb, alpha, B, k, o) <= c)
    assert ex.check_k_star(k, alpha, B, Kb, c, o) == "exercise 3: correct"
    assert "too few" in ex.check_k_star(k - 1, alpha, B, Kb, c, o)
    assert "more than needed" in ex.check_k_star(k + 1, alpha, B, Kb, c, o)
    # worker 0 the straggler: updates 0-4 while all push (the last from another worker is update 4), then only 0
    run = SimpleNamespace(servers=[{"staleness": [0, 1, 2, 3, 1, 0, 0], "from": [1, 0, 2, 1, 2, 0, 0]}],
                          config=SimpleNamespace(workers=3, batch=120))
    assert ex.staleness_while_all_push(run, 0) == [1.0, 1.5, 1.5]
    right = lambda run, slow: [1.0, 1.5, 1.5]            # noqa: E731
    assert ex.check_async_staleness(right, run, 0) == "exercise 4: correct"
    whole_run = lambda run, slow: [1 / 3, 1.5, 1.5]      # noqa: E731  the straggler's tail counted too: wrong
    assert ex.check_async_staleness(whole_run, run, 0).startswith("exercise 4: wrong")
    assert ex.check_async_staleness(lambda r, s: [1.0], run, 0) == "exercise 4: wrong: 1 values for 3 workers"
    assert "raised ZeroDivisionError" in ex.check_async_staleness(lambda r, s: [1 / 0], run, 0)
    assert ex.check_async_staleness(None, run, 0) == "exercise 4: not answered yet"


# ------------------------------------------------------------------ notebook 03, exercise 5: the ring's two phases
def _report(rank, n=3, sums=None, sent=None, got=None, **kw):
    """One engine's report as kit.comm.ring_exercise._ring_phase_run writes it (right by default)."""
    return {"rank": rank, "n": n, "sent": [(rank + 1) % n] if sent is None else sent,
            "got": [(rank - 1) % n] if got is None else got, "used": [], "sums": sums or [True] * n, **kw}


def test_the_ring_judge_names_the_rank_the_chunk_and_the_missing_allgather_never_the_values():
    from kit.comm.exercises import judge_hang, judge_ring_phase
    right = [_report(r) for r in range(3)]
    assert judge_ring_phase("reduce-scatter", right) is None and judge_ring_phase("allgather", right) is None
    assert judge_ring_phase("reduce-scatter", [{"rank": r, "unanswered": True} for r in range(3)]) == "unanswered"
    # reduce-scatter: rank 1 owns chunk 2 and it is not the sum; its other chunks are not checked
    rs = [_report(0, sums=[False, True, False]), _report(1, sums=[True, True, False]), _report(2)]
    msg = judge_ring_phase("reduce-scatter", rs)
    assert "wrong sum on rank 1 in chunk 2" in msg
    # allgather missing: every rank holds only its own finished chunk
    only_own = [_report(r, sums=[c == (r + 1) % 3 for c in range(3)]) for r in range(3)]
    assert "the allgather is missing" in judge_ring_phase("allgather", only_own)
    partial = [_report(0), _report(1, sums=[False, True, True]), _report(2)]
    assert "rank 1 lacks the sum in chunk(s) [0]" in judge_ring_phase("allgather", partial)
    # the wrong neighbour, a collective, an error, one rank unanswered
    assert "rank 0 sent to [2]" in judge_ring_phase("reduce-scatter", [_report(0, sent=[2]), *right[1:]])
    used = [{**right[0], "used": ["all_reduce"]}, *right[1:]]
    assert "called dist.all_reduce" in judge_ring_phase("allgather", used)
    assert "rank 2 raised IndexError" in judge_ring_phase(
        "allgather", [*right[:2], {"rank": 2, "error": "IndexError: list index out of range"}])
    assert "rank 0 still raises" in judge_ring_phase("allgather", [{"rank": 0, "unanswered": True}, *right[1:]])
    # a hang: every rank in a blocking send is the send-first deadlock; otherwise where each waits
    sends = {r: f"dist.send to rank {(r + 1) % 3}" for r in range(3)}
    assert "every rank is blocked in dist.send" in judge_hang("reduce-scatter", sends, 5, 3)
    other = judge_hang("allgather", {0: "waiting on dist.irecv from rank 1"}, 5, 3)
    assert "deadlock" in other and "rank 0 in waiting on dist.irecv from rank 1" in other and "allgather" in other


def ring_rs(flat):
    import torch
    import torch.distributed as dist
    from kit.comm.ring_sim import chunk_bounds
    rank, n = dist.get_rank(), dist.get_world_size()
    chunk = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
    for step in range(n - 1):
        send, recv = (rank - step) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunk[recv])
        for q in [dist.irecv(incoming, (rank - 1) % n), dist.isend(chunk[send], (rank + 1) % n)]:
            q.wait()
        chunk[recv] += incoming


def ring_ag(flat):
    import torch.distributed as dist
    from kit.comm.ring_sim import chunk_bounds
    rank, n = dist.get_rank(), dist.get_world_size()
    chunk = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]
    for step in range(n - 1):
        send, recv = (rank - step + 1) % n, (rank - step) % n
        for q in [dist.irecv(chunk[recv], (rank - 1) % n), dist.isend(chunk[send], (rank + 1) % n)]:
            q.wait()


def ring_send_first(flat):
    """Wrong: a blocking send before the receive on every rank (gloo's send waits for its receiver)."""
    import torch
    import torch.distributed as dist
    rank, n = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(flat[:1])
    dist.send(flat[:1], (rank + 1) % n)
    dist.recv(incoming, (rank - 1) % n)


def ring_unanswered(flat):
    raise NotImplementedError


@pytest.mark.engines
@pytest.mark.timeout(300)   # the deadlock restarts the 3 engines: a minute on a busy 2-core machine
def test_real_ring_submissions_get_their_verdicts_and_a_deadlock_restarts_the_engines(cluster3):
    from kit.comm.exercises import grade_ring
    assert grade_ring(cluster3, ring_unanswered, ring_unanswered) == "exercise 5: not answered yet"
    assert grade_ring(cluster3, ring_rs, ring_ag).startswith("exercise 5: correct")
    assert "the allgather is missing" in grade_ring(cluster3, ring_rs, lambda flat: None)
    assert "wrong sum on rank 0 in chunk 1" in grade_ring(cluster3, ring_ag, ring_ag)   # the allgather's indices
    assert grade_ring(cluster3, ring_rs, ring_unanswered) == "exercise 5: reduce-scatter right; allgather not " \
                                                              "answered yet"
    hang = grade_ring(cluster3, ring_send_first, ring_ag, wait=5)
    assert "reduce-scatter: deadlock" in hang and "every rank is blocked in dist.send" in hang
    from conftest import importable
    importable(cluster3)                 # fresh engines: let them import this module again
    assert grade_ring(cluster3, ring_rs, ring_ag).startswith("exercise 5: correct")     # the group works again
