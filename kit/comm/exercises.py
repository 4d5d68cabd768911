"""Checks of notebooks 02's and 03's cost-model exercises, written once for the notebook and its solutions: the
check computes the right answer here, so no visible cell of the notebook holds it.

    check_ring_vs_ps(gap, k_star, ps_wins, alpha, o, B, N=64)   # notebook 03, exercise 3
"""
from __future__ import annotations

import numpy as np

from kit.comm.costmodel import crossover_bytes, t_comm_ps, t_comm_ring

GRID = np.array([0, 4, 1 << 10, 4 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30], dtype=float)


def check_ring_vs_ps(gap, k_star, ps_wins, alpha: float, o: float, B: float, N: int = 64) -> str:
    """Notebook 03, exercise 3: t_ps - t_ring as a function of K (one server paying 2(alpha + (N-1) o) + 2NK/B,
    the ring 2(N-1)(alpha + K/(NB))), the K below which the server is faster (within 1%; 0 if never), and whether
    it is faster at some K. Say which parts are right, never the answer."""
    if gap is None or k_star is None or ps_wins is None:
        return "exercise 3: not answered yet"
    diff = t_comm_ps(N, GRID, alpha, B, o=o) - t_comm_ring(N, GRID, alpha, B)
    try:
        right_gap = bool(np.allclose(np.asarray(gap(GRID), dtype=float), diff, rtol=1e-9, atol=1e-15))
    except Exception as e:            # a lambda that fails on arrays is a wrong answer, said plainly
        return f"exercise 3: your gap raised {type(e).__name__}: {e} (it takes a numpy array of K)"
    want = float(crossover_bytes(N, alpha, B, o))
    right_k = abs(float(k_star) - want) <= 0.01 * want if want > 0 else float(k_star) == 0
    right_wins = bool(ps_wins) == bool(want > 0)
    if right_gap and right_k and right_wins:
        return "exercise 3: correct"
    word = lambda ok: "right" if ok else "wrong"  # noqa: E731
    return (f"exercise 3: t_ps - t_ring {word(right_gap)}, the crossover K {word(right_k)}, "
            f"'the server wins at some K' {word(right_wins)}")
