"""The clusters this process started and has not stopped (used by ``kit.cluster``): stopped at exit, explained after a
failed %%px cell, and replaced when a notebook's start cell runs again.

Re-running `cluster = kit.cluster.start(...)` in a notebook would leave the first cluster running (its engines on
the same cores) with no name left to stop it by. So a cluster started from a notebook cell (an IPython kernel or
shell: `kit.cluster.start` called by the cell's own code) first stops any cluster of the same kind (same backend,
same place: this machine, the same hosts, or Slurm) that a cell of this kernel started and has not stopped, and
says so. Clusters started inside a function (the kit's own experiments), by scripts or by tests may coexist.
"""
from __future__ import annotations

import atexit
import sys

from kit import scratch

_LIVE: list = []   # started and not yet stopped, oldest first


def add(cluster):
    """Note a cluster that starts."""
    if cluster not in _LIVE:
        _LIVE.append(cluster)
    scratch.end_with_process(stop_all)     # SIGTERM, SIGHUP: stopped as at exit


def discard(cluster):
    """Forget a cluster that stops; if %%px targets it, make %%px target the newest live cluster again (a notebook
    that ran a `with kit.cluster.start(...)` cell goes on with its own cluster's %%px cells)."""
    if cluster in _LIVE:
        _LIVE.remove(cluster)
    views = [c._view for c in _LIVE if getattr(c, "_view", None) is not None]
    view = getattr(cluster, "_view", None)
    if view is None or not views:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    magics = shell.magics_manager.registry.get("ParallelMagics") if shell is not None else None
    if magics is not None and getattr(magics, "view", None) is view:
        views[-1].activate()


def live() -> list:
    """Return the clusters started and not yet stopped, oldest first."""
    return list(_LIVE)


def called_from_cell(depth: int = 2) -> bool:
    """Return whether the code `depth` frames up (the caller's caller) runs in an IPython cell's namespace."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and sys._getframe(depth).f_globals is getattr(shell, "user_global_ns", None)


def replace_same_kind(new) -> list:
    """If `new` was started from a cell, stop every live cluster of its kind also started from a cell, saying so;
    return them."""
    if not getattr(new, "from_cell", False):
        return []
    old = [c for c in _LIVE if c is not new and c.kind == new.kind and getattr(c, "from_cell", False)]
    for c in old:
        print(f"kit.cluster: stopping {c!r}, started by this kernel at {c.started_at} and not stopped: a start "
              f"cell run again replaces its cluster of the same kind ({new.kind_text}), whose engines would "
              "otherwise share the cores with the new one's.", file=sys.stderr)
        c.stop()
    return old


def explain(shell, etype, value, tb, tb_offset=None):
    """After a %%px cell failed: say which rank died or stalled, and what to do."""
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    for c in live():
        c.poll_dead()
        err = c.refusal()
        if err is not None:
            print(f"kit.cluster: {type(err).__name__}: {err}", file=sys.stderr)
        elif c.stall is not None:
            print(f"kit.cluster: StallError: {c.stall.message()}", file=sys.stderr)


@atexit.register
def stop_all():
    """The kernel is exiting: stop every cluster it started."""
    for c in reversed(live()):
        c.stop()
