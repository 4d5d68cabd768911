"""The one style of the kit's figures: how a plot gets its axes, the figure benchmarks save, the labels.

A ``plot_x(data, ..., ax=None)`` function draws on the Axes it is given (one, or a sequence for several panels), or
on a new pyplot figure; it never shows, saves or switches matplotlib's backend: the notebook shows, `kit.bench`
saves. Benchmarks draw on a ``matplotlib.figure.Figure`` made without pyplot (``figure``), so they leave a
notebook's plotting state alone.
"""
from __future__ import annotations

# What each allreduce / PS implementation is called in tables and legends (notebooks 02, 03; kit.bench).
LABELS = {"ring": "kit ring", "naive": "naive (gather to rank 0 + broadcast)", "torch": "torch.distributed (gloo)",
          "horovod": "Horovod (Gloo)", "horovod_mpi": "Horovod (MPI)",
          "byteps": "PS, k=N servers co-located on the workers", "ps": "PS, one server on its own host"}


def axes(ax, n: int = 1, figsize=(5, 3.5), **kw):
    """Return (axes, created): `ax` as given, or `n` new Axes in a row on a new pyplot figure (one Axes for n=1)."""
    if ax is not None:
        return ax, False
    import matplotlib.pyplot as plt
    return plt.subplots(1, n, figsize=figsize, **kw)[1], True


def figure(cols: int = 1, rows: int = 1, figsize=(10, 3.2), **kw):
    """Return (fig, axes) of a Figure made without pyplot, axes[row, col] (for benchmarks: fig.savefig)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, cols, squeeze=False, **kw)
