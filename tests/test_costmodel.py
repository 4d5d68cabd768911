"""kit.comm.costmodel: the α–β formulas in one vocabulary (N workers, K bytes, k servers, alpha, B) and the one fit."""
import numpy as np
import pytest

from kit.comm import costmodel as cm


def test_parameter_server_pays_alpha_per_message_at_the_server():
    # Each server takes N pushes in and sends N pulls out, K/k bytes each: 2 N (alpha + K / (k B)).
    assert cm.t_comm_ps(4, 1e6, 1e-5, 1e9) == pytest.approx(2 * 4 * (1e-5 + 1e-3))
    assert cm.t_comm_ps(4, 1e6, 1e-5, 1e9, k=2) == pytest.approx(2 * 4 * (1e-5 + 5e-4))
    # The latency term grows with N (issue 13): one more worker, two more messages at the server.
    assert cm.t_comm_ps(5, 0, 1e-5, 1e9) - cm.t_comm_ps(4, 0, 1e-5, 1e9) == pytest.approx(2e-5)
    assert np.allclose(cm.t_comm_ps(np.array([1, 2]), 1e6, 0, 1e9), [2e-3, 4e-3])


def test_one_host_model_uses_the_measured_empty_exchange_and_max_rate():
    assert cm.t_comm_one_host(1, 1e6, 1e9, 1e-3, B_max=1.5e9) == pytest.approx(1e-3 + 2 * 1e6 / 1e9)
    assert cm.t_comm_one_host(4, 1e6, 1e9, 1e-3, B_max=1.5e9) == pytest.approx(1e-3 + 2 * 4e6 / 1.5e9)
    assert cm.t_comm_one_host(4, 1e6, 1e9, 1e-3) == pytest.approx(1e-3 + 2 * 4e6 / 1e9)


def test_ring_formulas():
    assert cm.ring_bytes(5, 10e6) == pytest.approx(16e6)
    assert cm.t_comm_ring(2, 1e6, 1e-4, 1e9) == pytest.approx(2e-4 + 1e-3)
    assert cm.busbw(64e6, 0.1, 2) == pytest.approx(640e6)


@pytest.mark.parametrize("N", [2, 4, 64, 1024])
def test_ring_beats_the_parameter_server_at_every_size_once_latency_scales_with_N(N):
    # PS - ring = 2 alpha + 2 K / B (N - (N-1)/N) > 0: with alpha per message at the server there is no crossover.
    for K in (0, 4, 1e3, 1e6, 1e9):
        assert cm.t_comm_ps(N, K, 5e-5, 1e9) > cm.t_comm_ring(N, K, 5e-5, 1e9)


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
def test_the_model_obeys_the_wires(N, k, K):
    """No prediction beats a link carrying B each way: a PS worker pushes and pulls its K (2K/B), a server's link
    carries N pushes and N pulls of K/k (2NK/(kB)), a ring rank sends 2(N-1)/N·K; latency terms come on top."""
    alpha, B = 5e-5, 1.25e8
    ps = float(cm.t_comm_ps(N, K, alpha, B, k))
    assert ps >= 2 * K / B and ps >= 2 * N * K / (k * B) and ps >= 2 * N * alpha
    assert ps == pytest.approx(2 * N * alpha + max(2 * K / B, 2 * N * K / (k * B)))
    ring = float(cm.t_comm_ring(N, K, alpha, B))
    assert ring >= cm.ring_bytes(N, K) / B and ring >= 2 * (N - 1) * alpha
    if k == N and N > 1:          # sharded over N servers (BytePS): the ring's bytes x N/(N-1), no better
        assert ps - 2 * N * alpha == pytest.approx((cm.t_comm_ring(N, K, 0, B)) * N / (N - 1))

