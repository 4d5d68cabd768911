"""Stalled collectives: a rank that never joins a collective the others wait in is named, and the job stopped.

Two watchers, both set from the cluster's `timeout`:

- Horovod's own stall inspector (HOROVOD_STALL_CHECK_TIME_SECONDS / HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, see
  :func:`horovod_env`). It names the missing ranks and tensors and shuts Horovod down, but it runs only where
  the coordinator keeps cycling: under MPI it did (rank 1 missing → shut down after the shutdown time); under
  the Gloo controller of Horovod 0.28.1 the coordinator blocks in a gather that an idle rank never joins, and
  the inspector never ran (tried: horovodrun --gloo, 40 s, no warning).
- The kit's own watch, for both backends: a thread on every engine (:func:`engine_watch`) writes, once a second,
  whether its engine is running a cell and which Horovod call its main thread waits in (from the thread's
  Python frames); the notebook's watch (:class:`Watch`) reads those files. A rank that has waited in collective
  X for longer than `timeout` while another rank has finished its cell, or waits in another collective, is a
  stall (:func:`find_stall`): the missing ranks are named, and every engine shuts its Horovod down, so every
  waiting call raises and the cell returns. A rank still computing is not missing: a slow step is not killed.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

STOP = "stop"          # the file whose appearance tells every engine's watch to shut Horovod down
BUSY_FRAMES = {"do_apply", "do_execute", "run_cell", "run_code"}   # the engine is running a cell


def horovod_env(timeout: float) -> dict[str, int]:
    """Return Horovod's stall-inspector settings for a cluster `timeout`: warn every timeout/4 s, shut Horovod
    down once a collective has waited `timeout` s for a rank that never joined."""
    check = max(1, int(timeout) // 4)
    return {"HOROVOD_STALL_CHECK_TIME_SECONDS": check, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": max(check, int(timeout))}


# ----------------------------------------------------------------------------------- on the engines
WRAPPERS = {"wrapper", "inner", "_fn", "<module>"}   # decorators around the call; imports
COLLECTIVE_FILES = (f"{os.sep}horovod{os.sep}", f"{os.sep}torch{os.sep}distributed{os.sep}")
# Calls that wait for the other ranks (horovod.torch waits in `synchronize`; horovod.tensorflow in its ops;
# torch.distributed in its collectives). hvd.init and imports are not counted: ranks reach them at their pace.
COLLECTIVES = {"synchronize", "_allreduce", "_grouped_allreduce", "allgather", "broadcast", "alltoall",
               "reducescatter", "barrier", "join", "all_reduce", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "reduce", "all_to_all",
               "all_to_all_single", "send", "recv"}


def collective_of(frame) -> tuple[str, object] | None:
    """Return (tensor name, identity of this call) of the Horovod or torch.distributed collective `frame`'s stack
    waits in, else None. The name is that of the outermost such frame (the user's call)."""
    outer, handle, waiting = None, None, False
    while frame is not None:
        code = frame.f_code
        if any(part in code.co_filename for part in COLLECTIVE_FILES) and code.co_name not in WRAPPERS:
            outer = frame
            waiting = waiting or code.co_name in COLLECTIVES
            if code.co_name == "synchronize":
                handle = frame.f_locals.get("handle")
        frame = frame.f_back
    if outer is None or not waiting:
        return None
    name = outer.f_locals.get("name")
    name = name if isinstance(name, str) else f"{outer.f_code.co_name} (no name)"
    return str(name), handle if handle is not None else id(outer)


def _busy(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name in BUSY_FRAMES:
            return True
        frame = frame.f_back
    return False


def _shutdown_horovod():
    import sys
    for mod in ("horovod.torch", "horovod.tensorflow"):
        if mod in sys.modules:
            try:
                sys.modules[mod].shutdown()
            except Exception:
                pass


def engine_watch(folder: str, rank: int, interval: float = 1.0):
    """Start this engine's watch thread: write folder/rank-R.json on each change; on folder/stop, shut down."""
    import sys
    main = threading.main_thread().ident
    path = os.path.join(folder, f"rank-{rank}.json")

    def loop():
        last, since, stopped = None, None, False
        while True:
            frame = sys._current_frames().get(main)
            coll = collective_of(frame)
            state = {"rank": rank, "busy": _busy(frame), "tensor": coll and coll[0]}
            if coll is None or last is None or coll[1] != last[1]:
                since = time.time() if coll else None
            if (coll, state["busy"]) != (last, getattr(loop, "busy", None)):
                with open(path + ".tmp", "w") as f:
                    json.dump({**state, "since": since}, f)
                os.replace(path + ".tmp", path)
            last, loop.busy = coll, state["busy"]
            if not stopped and os.path.exists(os.path.join(folder, STOP)):
                stopped = True
                _shutdown_horovod()
            time.sleep(interval)
    os.makedirs(folder, exist_ok=True)
    threading.Thread(target=loop, daemon=True, name="kit-stall-watch").start()


# ----------------------------------------------------------------------------------- in the notebook
@dataclass(frozen=True)
class Stall:
    """Rank(s) `missing` never joined collective `tensor`, which rank(s) `waiting` waited in for `seconds`."""
    missing: tuple[int, ...]
    tensor: str
    waiting: tuple[int, ...]
    seconds: float
    interrupted: bool = False      # cut in half by a kernel interrupt, not a stall of the code

    def message(self) -> str:
        if self.interrupted:
            waiting, missing = ", ".join(map(str, self.waiting)), ", ".join(map(str, self.missing))
            return (f"the interrupt cut collective {self.tensor!r} in half: rank(s) {waiting} waited in it, "
                    f"rank(s) {missing} stopped without joining. Horovod was "
                    "shut down on every engine so that nothing waits forever (a torch.distributed or kit ring wait "
                    "gives up at the cluster's timeout). The job is broken: run cluster.restart() for a fresh one "
                    "(no kernel restart needed).")
        return (f"rank(s) {', '.join(map(str, self.missing))} never joined collective {self.tensor!r}, which "
                f"rank(s) {', '.join(map(str, self.waiting))} waited in for {self.seconds:.0f} s (a stall: e.g. an "
                "`if hvd.rank() == 0:` around a collective, or ranks calling different collectives). The job is "
                "broken: run cluster.restart() for a fresh one (no kernel restart needed).")


def find_stall(states: dict[int, dict], n: int, timeout: float, now: float) -> Stall | None:
    """Return the Stall in {rank: engine state} (see engine_watch), or None.

    A stall: some rank has waited in collective X for more than `timeout` s, and some other rank is not in X but
    idle (its cell finished) or waiting in another collective. Ranks still computing, or with no state, are not
    missing (a slow step is not a stall)."""
    old = [(s["since"], s["tensor"]) for s in states.values() if s.get("tensor") and now - s["since"] > timeout]
    if not old:
        return None
    since, tensor = min(old)
    waiting = tuple(sorted(r for r, s in states.items() if s.get("tensor") == tensor))
    missing = tuple(r for r in range(n) if r not in waiting and r in states and
                    (not states[r].get("busy") or states[r].get("tensor")))
    return Stall(missing, tensor, waiting, now - since) if missing else None


class Watch:
    """The notebook's side: read the engines' states every second; on a stall, tell every engine to stop."""

    def __init__(self, folder: str, n: int, timeout: float, interval: float = 1.0):
        self.folder, self.n, self.timeout, self.interval = folder, n, timeout, interval
        self.stall: Stall | None = None
        self.suspect: Stall | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()      # check() (the watch thread) and after_interrupt() both record a stall
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kit-stall-watch")
        self._thread.start()

    def states(self) -> dict[int, dict]:
        out = {}
        for r in range(self.n):
            try:
                with open(os.path.join(self.folder, f"rank-{r}.json")) as f:
                    out[r] = json.load(f)
            except (OSError, ValueError):
                pass
        return out

    def check(self) -> Stall | None:
        """Look once; on a (first) stall, record it and ask every engine to shut Horovod down."""
        with self._lock:
            if self.stall is None:
                states = self.states()
                self.stall = find_stall(states, self.n, self.timeout, time.time())
                if self.stall is not None:
                    open(os.path.join(self.folder, STOP), "w").close()
                else:   # a stall in the making, for a collective that gives up by itself (torch.distributed)
                    self.suspect = find_stall(states, self.n, self.timeout / 2, time.time()) or self.suspect
            return self.stall

    def after_interrupt(self, grace: float = 15.0) -> Stall | None:
        """The kernel was interrupted and every engine sent SIGINT: wait until every engine has either stopped or
        waits in a collective (at most `grace` s: on a loaded machine a rank can take seconds to act on SIGINT).
        If a rank still waits in a collective that a stopped rank will never join, the collective was cut in half:
        record it, ask every engine to shut Horovod down (so the waiting call returns), and return it."""
        deadline = time.time() + grace
        while True:
            time.sleep(min(self.interval, max(0.0, deadline - time.time())))
            states = self.states()
            settled = all(not s.get("busy") or s.get("tensor") for s in states.values())
            if (settled and len(states) == self.n) or time.time() >= deadline:
                break
        cut = find_stall(states, self.n, 0.0, time.time() + 1e-6)
        with self._lock:           # (without it the watch thread's check() could overwrite the stall with None)
            if cut is None or self.stall is not None:
                return None
            stall = self.stall = Stall(cut.missing, cut.tensor, cut.waiting, cut.seconds, interrupted=True)
            open(os.path.join(self.folder, STOP), "w").close()
        # wait (a little) until the waiting ranks have left the cut collective: the interrupt pending in them then
        # ends that cell, not the next one
        deadline = time.time() + grace
        while time.time() < deadline and any(self.states().get(r, {}).get("busy") for r in cut.waiting):
            time.sleep(self.interval / 2)
        return stall

    def explain(self) -> Stall | None:
        """After a collective failed: the stall found, or the one in the making when it failed (else None)."""
        return self.check() or self.suspect

    def _loop(self):
        while not self._done.wait(self.interval) and self.check() is None:
            pass

    def stop(self):
        self._done.set()
        self._thread.join(timeout=5)


def forward_interrupts(client, watch):
    """JupyterLab's stop button interrupts the kernel; ipyparallel's %%px then sends SIGINT to the engines
    (client.send_signal, ipyparallel >= 7). Wrap that: afterwards, look (with `watch()`, the cluster's current
    Watch or None) whether the interrupt cut a collective in half (a rank stopped outside it while others wait in
    it); if so, the waiting ranks are freed and the notebook is told the job is broken."""
    import signal
    import sys
    send = client.send_signal

    def send_signal(sig, targets=None, block=None):
        out = send(sig, targets=targets, block=block)
        w = watch()
        if w is not None and sig in ("SIGINT", signal.SIGINT, int(signal.SIGINT)):
            cut = w.after_interrupt()
            if cut is not None:
                print(f"kit.cluster: {cut.message()}", file=sys.stderr)
        return out
    client.send_signal = send_signal
