"""The input pipeline of notebook 01 (pipeline; its names are this package's), Keras/tf.data loaders (tfdata),
the starvation monitor (monitor), the loader profiler (profiler) and the lessons' checks on a run (lesson)."""
from kit.data.pipeline import (
    FORMATS, ImageStore, encode, make_store, read, decode, augment,
    load_sample, checked_sample, SampleError, ImageDataset, CheckedDataset, Loader, make_loader, make_model,
    make_step, sync_fn, queued, measure, fit_model, handover, predicted, sweep, table, DEFAULT, AHEAD, setup,
    sweep_experiment, text_table, SWEEP_COLUMNS)
from kit.plots.data import plot_kinds, plot_sweep, plot_timelines   # notebook 01 draws them as data.plot_*
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
