"""kit: plumbing for the notebooks (clusters, the lab, communication, data, MNIST, plots, benchmarks).

The algorithms being taught live in the notebooks; this package hides only what every notebook would otherwise
repeat. Its floors, each importing only from the floors below it (as docs/design.md draws them and
tests/test_kit.py FLOORS checks):

    kit.bench                                   one module per `python -m kit.bench NAME` target
    kit.mnist                                   Horovod MNIST jobs, the training script, the lab runs
    kit.netlab  kit.data                        the emulated-host lab; the input pipeline
    kit.cluster  kit.plots                      engines as one job; every figure
    kit.comm                                    links, parameter server, ring, cost model
    kit.env  kit.sysinfo  kit.scratch  kit.datasets     the base

Every submodule loads on first use: ``import kit; kit.comm.ring.allreduce`` works without importing it first.
"""
from importlib import import_module as _import_module
import pkgutil as _pkgutil

from kit import env as _env

# Horovod's Keras integration needs the Keras 2 API (tf-keras), chosen before TensorFlow is first imported
# (docs/install.md "Why tf-keras"). kit.env is the one place that knows the variables; engines get them too.
_env.use_legacy_keras()
# With a CUDA build of PyTorch (Triton installed), Triton must load before TensorFlow or it segfaults later.
_env.load_triton_before_tensorflow()

__version__ = "0.1.0"


def _lazy_submodules(name: str, path, namespace: dict):
    """Return (__getattr__, __dir__) for package `name`: its submodules and subpackages, found on disk, load on
    first attribute access (so that `import kit` stays fast and imports no framework)."""
    subs = {m.name for m in _pkgutil.iter_modules(path) if not m.name.startswith("_")}

    def __getattr__(attr):
        if attr in subs:
            return _import_module(f"{name}.{attr}")
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    def __dir__():
        return sorted(set(namespace) | subs)

    return __getattr__, __dir__


_getattr, __dir__ = _lazy_submodules(__name__, __path__, globals())


def __getattr__(name):
    if name == "profile_loader":       # notebook 01's one-call profiler
        return _import_module("kit.data.profiler").profile_loader
    return _getattr(name)
