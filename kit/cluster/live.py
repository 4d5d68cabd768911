"""The clusters this process started and has not stopped (used by ``kit.cluster``): stopped at exit, explained after a
failed %%px cell, and replaced when a notebook's start cell runs again.

Re-running `cluster = kit.cluster.start(...)` in a notebook would leave the first cluster running (its engines on
the same cores) with no name left to stop it by. So, in an IPython kernel or shell, starting a cluster first stops
any cluster of the same kind (same backend, same place: this machine, the same hosts, or Slurm) that this kernel
started and has not stopped, and says so. Outside IPython (scripts, tests) clusters of one kind may coexist.
"""
from __future__ import annotations

import atexit
import sys

from kit.cluster import engines

_LIVE: list = []   # started and not yet stopped, oldest first


def add(cluster):
    """Note a cluster that starts."""
    if cluster not in _LIVE:
        _LIVE.append(cluster)


def discard(cluster):
    """Forget a cluster that stops."""
    if cluster in _LIVE:
        _LIVE.remove(cluster)


def live() -> list:
    """Return the clusters started and not yet stopped, oldest first."""
    return list(_LIVE)


def replace_same_kind(new, interactive: bool | None = None) -> list:
    """In IPython (or `interactive`), stop every live cluster of `new`'s kind, saying so; return them."""
    if not (engines.in_ipython() if interactive is None else interactive):
        return []
    old = [c for c in _LIVE if c is not new and c.kind == new.kind]
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
