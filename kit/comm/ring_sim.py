"""Ring-allreduce as a pure simulation (notebook 03), to watch step by step: no processes, any N.

    results, steps = kit.comm.ring_sim.simulate(arrays)   # any N, any equal-shape arrays: what each worker holds
    kit.plots.plot_ring_steps(steps)                 # one small figure per step, workers on a circle

The schedule (`chunk_bounds`, `send_chunk`, `recv_chunk`) is the one the real ring (`kit.comm.ring`) follows: N-1
scatter-reduce steps, then N-1 allgather steps; chunk c of worker r travels to worker (r + 1) % N.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


# ----------------------------------------------------------------------------------- the schedule
def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """Split range(length) into n contiguous chunks whose sizes differ by at most one (np.array_split's rule)."""
    q, r = divmod(length, n)
    starts = [c * q + min(c, r) for c in range(n + 1)]
    return list(zip(starts[:-1], starts[1:]))


def send_chunk(rank: int, step: int, n: int, phase: str) -> int:
    """Return the chunk `rank` sends to its right neighbour at `step` of `phase` ("scatter_reduce"/"allgather")."""
    return (rank - step + (phase == "allgather")) % n


def recv_chunk(rank: int, step: int, n: int, phase: str) -> int:
    """Return the chunk `rank` receives from its left neighbour at `step` of `phase` (what the left one sends)."""
    return send_chunk((rank - 1) % n, step, n, phase)


# ----------------------------------------------------------------------------------- the simulation
@dataclass
class Step:
    """The state of every worker after one step of the simulated ring."""
    phase: str                            # "start", "scatter_reduce" or "allgather"
    index: int                            # step number within the phase (0 for "start")
    sends: list[tuple[int, int, int]]     # (from worker, to worker, chunk) moved in this step
    contributions: np.ndarray             # [worker, chunk] -> how many workers' inputs that chunk now sums
    buffers: list[np.ndarray]             # each worker's (flat) buffer after the step: the partial sums

    @property
    def title(self) -> str:
        return "start" if self.phase == "start" else f"{self.phase.replace('_', '-')} step {self.index + 1}"


def simulate(arrays) -> tuple[list[np.ndarray], list[Step]]:
    """Run ring-allreduce on a list of equal-shape arrays (one per worker); return (results, steps).

    steps[0] is the starting state, then N-1 scatter-reduce steps and N-1 allgather steps follow.
    """
    arrays = [np.asarray(a) for a in arrays]
    n = len(arrays)
    if n == 0:
        raise ValueError("simulate needs at least one worker's array")
    if len({(a.shape, a.dtype) for a in arrays}) > 1:
        got = [(a.shape, str(a.dtype)) for a in arrays]
        raise ValueError(f"every worker needs the same shape and dtype, got {got}")
    buffers = [a.reshape(-1).copy() for a in arrays]
    bounds = chunk_bounds(buffers[0].size, n)
    held = np.ones((n, n), dtype=int)
    steps = [Step("start", 0, [], held.copy(), [b.copy() for b in buffers])]
    for phase in ("scatter_reduce", "allgather"):
        for s in range(n - 1):
            sends = [(r, (r + 1) % n, send_chunk(r, s, n, phase)) for r in range(n)]
            # Every worker sends at the same time: read all outgoing chunks before anyone updates.
            out = [buffers[src][slice(*bounds[c])].copy() for src, _, c in sends]
            counts = [held[src, c] for src, _, c in sends]
            for (src, dst, c), data, k in zip(sends, out, counts):
                if phase == "scatter_reduce":
                    buffers[dst][slice(*bounds[c])] += data
                    held[dst, c] += k
                else:
                    buffers[dst][slice(*bounds[c])] = data
                    held[dst, c] = k
            steps.append(Step(phase, s, sends, held.copy(), [b.copy() for b in buffers]))
    return [b.reshape(arrays[0].shape) for b in buffers], steps

