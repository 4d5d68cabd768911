"""Every figure of the notebooks, one style (style): communication (comm), data and MNIST (data), the network
benchmark (network, with its tables), notebook 05's schemes (ddp). ``plot_x(data, ..., ax=None) -> ax``."""
from kit.plots.comm import (
    plot_parallelism, plot_ps_bytes, plot_ps_split, plot_ps_model, plot_ps_extrapolation, plot_ring_step,
    plot_ring_steps, ring_step_slider, plot_busbw, plot_ring_model, plot_fusion)
from kit.plots.data import (
    plot_monitor, plot_sweep, plot_timelines, plot_kinds, plot_history, plot_throughput, plot_accuracy,
    plot_timeline, plot_elastic, plot_lab_scaling)
from kit.plots.ddp import plot_schemes, plot_ddp_lab, plot_overlap_step
from kit.plots.network import plot_network  # its tables and summary: kit.plots.network
from kit.plots.trace import plot_trace, plot_traces, plot_ranks  # torch.profiler traces (kit.trace)
from kit.plots.style import LABELS, axes, figure
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
