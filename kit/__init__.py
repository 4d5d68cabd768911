"""kit: plumbing for the notebooks (clusters, data, monitors, plots, benchmarks).

The algorithms being taught live in the notebooks; this package hides only what every notebook would
otherwise repeat. One concept per module: ``kit.cluster``, ``kit.data``, ``kit.monitor``, ``kit.ps``,
``kit.ring``, ``kit.bench``, ``kit.plots``.
"""
import os as _os

# Horovod's Keras integration needs the Keras 2 API (tf-keras), chosen before TensorFlow is first imported.
# See README "Why tf-keras". Engines started by kit.cluster get the same variable.
_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from importlib import import_module as _import_module

__version__ = "0.1.0"
_SUBMODULES = ("cluster", "datasets", "sysinfo", "data", "monitor", "ps", "ring", "bench", "plots", "mnist")


def __getattr__(name):
    """Import submodules lazily, so that `import kit` stays fast and imports no framework."""
    if name in _SUBMODULES:
        return _import_module(f"{__name__}.{name}")
    if name == "profile_loader":
        return _import_module(f"{__name__}.monitor").profile_loader
    raise AttributeError(f"module 'kit' has no attribute {name!r}")
