"""kit: plumbing for the notebooks (clusters, data, monitors, plots, benchmarks).

The algorithms being taught live in the notebooks; this package hides only what every notebook would
otherwise repeat. One concept per module: ``kit.cluster``, ``kit.data``, ``kit.monitor``, ``kit.ps``,
``kit.ring``, ``kit.bench``, ``kit.plots``; ``kit.env`` holds the framework environment (Keras 2, cores, ranks).
"""
from importlib import import_module as _import_module

from . import env as _env

# Horovod's Keras integration needs the Keras 2 API (tf-keras), chosen before TensorFlow is first imported
# (README "Why tf-keras"). kit.env is the one place that knows the variables; engines get them too.
_env.use_legacy_keras()
# With a CUDA build of PyTorch (Triton installed), Triton must load before TensorFlow or it segfaults later.
_env.load_triton_before_tensorflow()

__version__ = "0.1.0"
_SUBMODULES = ("env", "cluster", "launchers", "engines", "datasets", "sysinfo", "data", "data_tf", "monitor",
               "profiler", "ps", "mlp", "ps_bench", "link", "costmodel", "ring", "ring_sim", "ring_bench", "bench",
               "plots", "plots_data", "mnist", "checkpoint", "timeline", "netlab", "netlab_ssh", "netlab_rate",
               "remote", "stall", "scratch", "devices", "elastic", "mnist_lab")


def __getattr__(name):
    """Import submodules lazily, so that `import kit` stays fast and imports no framework."""
    if name in _SUBMODULES:
        return _import_module(f"{__name__}.{name}")
    if name == "profile_loader":
        return _import_module(f"{__name__}.profiler").profile_loader
    raise AttributeError(f"module 'kit' has no attribute {name!r}")
