"""A stopped or broken cluster refuses (used by ``kit.cluster``): its client, its view, the results it handed out.

ipyparallel's own answers to a stale handle are a closed socket ("Client cannot be used after its sockets have been
closed"), ``KeyError: 1`` for an engine that died, and an AsyncResult that never resolves when the controller is
gone. Here the cluster's client and view are given a subclass of their own class (one object each, nothing global
is patched) that asks the cluster first (``Cluster.refusal()``: stopped, controller dead, a rank dead) and raises
that error; every AsyncResult the view hands out is remembered, so that stop() or the controller's death fails it
with the error instead of leaving it pending; a blocking call through the view waits with ``Cluster.wait``, which
notices dead ranks, lost hosts and a dead controller. ``ar.abort()`` on a task that is already running interrupts
it (SIGINT to its engines, as the notebook's stop button does): ipyparallel's abort only removes queued tasks.
"""
from __future__ import annotations

import os
import signal
import time
import weakref

from kit.cluster import engines
from kit.cluster.launchers import ClusterError


class RankDiedError(ClusterError):
    """An engine died while the job was running."""


class StallError(ClusterError):
    """Some rank never joined a collective that the others waited in (kit.cluster.stall)."""


class ClusterStoppedError(ClusterError):
    """This cluster was stopped: start a new one with kit.cluster.start()."""


class ControllerDiedError(ClusterError):
    """The cluster's ipyparallel controller is gone: nothing sent to the engines can come back."""


class NoAnswerError(ClusterError):
    """Live engines did not answer a short set-up call in time (a lost message: ipython/ipyparallel#373)."""


_CLASSES: dict[type, type] = {}


def _subclass(base: type, body: dict) -> type:
    """Return (once per base class) a subclass of `base` named Kit<base> with the methods in `body`."""
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Kit{base.__name__}", (base,), dict(body))
    return _CLASSES[base]


# ----------------------------------------------------------------------------------- the client
def _client_build_targets(self, targets):
    _refuse(self)
    try:
        return super(type(self), self)._build_targets(targets)
    except KeyError as e:          # an engine that unregistered (it died): say which rank, not KeyError: 1
        owner = self._kit_owner()
        raise (owner.died_error() if owner is not None and owner.poll_dead() else
               ClusterError(f"engine {e} is no longer registered with the controller (it died): run "
                            "cluster.restart() for a fresh job")) from None


def _client_send_apply(self, *args, **kwargs):
    _refuse(self, kwargs.get("ident"))
    return super(type(self), self).send_apply_request(*args, **kwargs)


def _client_send_execute(self, *args, **kwargs):
    _refuse(self, kwargs.get("ident"))
    return super(type(self), self).send_execute_request(*args, **kwargs)


def _refuse(obj, ident=None):
    owner = obj._kit_owner()
    err = owner.refusal() if owner is not None else None
    if err is not None:
        raise err
    if owner is not None and ident is not None:
        owner.note_send(ident)


def guard_client(client, cluster):
    """Make `client` ask `cluster` before it sends anything (class swap on this one object)."""
    client.__class__ = _subclass(type(client), {"_build_targets": _client_build_targets,
                                                "send_apply_request": _client_send_apply,
                                                "send_execute_request": _client_send_execute})
    client._kit_owner = weakref.ref(cluster)
    return client


# ----------------------------------------------------------------------------------- the view
def _view_really_apply(self, f, args=None, kwargs=None, targets=None, block=None, **options):
    block = self.block if block is None else block
    _refuse(self)
    ar = super(type(self), self)._really_apply(f, args, kwargs, targets=targets, block=False, **options)
    return _after_send(self, ar, block)


def _view_execute(self, code, silent=True, targets=None, block=None, **options):
    block = self.block if block is None else block
    _refuse(self)
    ar = super(type(self), self).execute(code, silent=silent, targets=targets, block=False, **options)
    if block:
        _after_send(self, ar, True)
    return ar


def _after_send(view, ar, block: bool):
    owner = view._kit_owner()
    if owner is None:
        return ar.get() if block else ar
    owner.track(ar)
    return owner.wait(ar) if block else ar


def guard_view(view, cluster):
    """Make `view` ask `cluster` before it sends, remember its AsyncResults, and wait with cluster.wait."""
    view.__class__ = _subclass(type(view), {"_really_apply": _view_really_apply, "execute": _view_execute})
    view._kit_owner = weakref.ref(cluster)
    return view


# ----------------------------------------------------------------------------------- the results
class Pending:
    """The AsyncResults a cluster's view handed out that may still be waited on."""

    def __init__(self):
        self._results: weakref.WeakSet = weakref.WeakSet()

    def add(self, ar, client):
        """Remember `ar`, and make its abort() interrupt a task that already runs."""
        self._results.add(ar)
        ar.abort = lambda: abort_or_interrupt(ar, client)

    def fail(self, err: Exception) -> int:
        """Fail every AsyncResult not yet resolved with `err`; return how many."""
        failed = 0
        for ar in list(self._results):
            if not ar.done():
                try:
                    ar.set_exception(err)
                    failed += 1
                except Exception:      # it resolved meanwhile (InvalidStateError)
                    pass
        self._results = weakref.WeakSet()
        return failed


def abort_or_interrupt(ar, client, grace: float = 1.0):
    """Abort `ar`'s queued tasks (ipyparallel's abort); interrupt the engines where it already runs (SIGINT, as
    the notebook's stop button does), so that its get() raises KeyboardInterrupt from those engines."""
    if ar.ready():
        raise RuntimeError("Can't abort, I am already done!")
    type(ar).abort(ar)                       # queued tasks: removed from the engines' queues
    deadline = time.time() + grace
    while not ar.ready() and time.time() < deadline:
        ar.wait(0.1)
    if not ar.ready():
        targets = ar._targets if isinstance(ar._targets, list) else [ar._targets]
        running = [t for t, f in zip(targets, ar._children) if not f.done()]
        client.send_signal(int(signal.SIGINT), targets=running, block=True)


# ----------------------------------------------------------------------------------- the cluster's side
class Refusing:
    """What kit.cluster.Cluster refuses with: its state (new, starting, running, stopped), dead ranks, a dead
    controller."""
    n: int
    backend: str
    dead: dict
    _state: str
    _stopped_at: str
    _controller: tuple | None
    _pending: Pending

    def refusal(self) -> ClusterError | None:
        """Return the error any use of this cluster raises now (stopped, not started, controller or a rank dead),
        or None while it works."""
        what = f"this cluster ({self.n} engines, backend {self.backend!r})"
        if self._state == "stopped":
            return ClusterStoppedError(f"{what} was stopped at {self._stopped_at}; start a new one with "
                                       "kit.cluster.start()")
        if self._state == "new":
            return ClusterError(f"{what} was never started: use kit.cluster.start(...) (or cluster.start())")
        if self._controller is not None:
            pid, when = self._controller
            return ControllerDiedError(f"the controller of {what} (pid {pid}) died at {when}: nothing sent to the "
                                       "engines can come back. Run cluster.restart() for a fresh job (no kernel "
                                       "restart needed).")
        if self.dead and self._state == "running":
            return self.died_error()
        return None

    def died_error(self, lost=None) -> RankDiedError:
        """Return the RankDiedError naming the first rank that died (and those that went down with it)."""
        for rank, why in (lost or {}).items():
            self.dead.setdefault(rank, why)
        (first, why), *rest = self.dead.items()
        then = f"; then rank(s) {', '.join(str(r) for r, _ in rest)} went down with it" if rest else ""
        return RankDiedError(f"rank {first} died ({why}){then}. The job is broken: run cluster.restart() for a "
                             "fresh one (no kernel restart needed).")

    def answers(self, async_result, what: str, seconds: float):
        """Return the answers of a short set-up call (`what`: who the engines are, the rendezvous' address,
        init_process_group), waiting at most `seconds`. A dead engine is named as by wait(); live engines that do
        not answer by then raise NoAnswerError naming them, where ipyparallel would wait forever (a request or a
        reply lost: ipython/ipyparallel#373)."""
        from ipyparallel.error import TimeoutError as NoReply
        try:
            return self.wait(async_result, timeout=seconds)
        except NoReply:
            targets = async_result._targets if isinstance(async_result._targets, list) else [async_result._targets]
            silent = [t for t, m in zip(targets, async_result.msg_ids) if m in self._client.outstanding]
            io = getattr(self._client, "_io_thread", None)
            raise NoAnswerError(
                f"{what}: engine(s) {silent or targets} did not answer in {seconds:.0f} s, none seen to die (the "
                f"request was {'sent' if async_result.sent else 'never sent'}; the client's I/O thread is "
                f"{'alive' if io is not None and io.is_alive() else 'gone'}). Run cluster.restart() for a fresh "
                "job, or stop it and start again.") from None

    def track(self, async_result):
        """Remember an AsyncResult of this cluster's view: stop() or the controller's death fails it if pending."""
        self._pending.add(async_result, self._client)

    def note_send(self, ident):
        """A task goes to the engine `ident` (its uuid): note where its output file ends now, so that a death
        quotes only what this task wrote (engines.last_output), never an earlier task's error."""
        uuid = ident.decode() if isinstance(ident, bytes) else str(ident)
        eid = next((e for e, u in self._client._engines.items() if u == uuid), None)
        if eid is None or not self.slots or eid not in self.slots:
            return
        pid = self._pids.get(self.slots[eid].rank)
        path = self._outputs.get(pid, "")
        if path:
            try:
                self._marks[pid] = os.path.getsize(path)
            except OSError:
                pass

    def _usable(self, broken: bool = True):
        """Raise why this cluster cannot be used (stopped, never started; a dead rank or controller too unless
        `broken` is allowed: restart() mends those, and sending through the view names them)."""
        err = self.refusal()
        if err is not None and (not broken or not isinstance(err, (RankDiedError, ControllerDiedError))) \
                and self._state != "starting":
            raise err

    def _watch_controller(self):
        """Note the controller's death the moment it happens: pending results fail, wait() and the view say so."""
        pid = getattr(getattr(self._ipp, "controller", None), "pid", -1)
        if pid > 0:
            def died(_):
                if self._state in ("starting", "running") and self._controller is None:
                    self._controller = (pid, time.strftime("%H:%M:%S"))
                    self._pending.fail(self.refusal())
            self._ctl_w = engines.watch_deaths({0: pid}, died)

    def __repr__(self):
        if self._state == "running" and self._controller is None:
            self.poll_dead()
        err = self.refusal()
        state = "running" if err is None else "stopped" if self._state == "stopped" else \
            "not started" if self._state == "new" else f"broken ({type(err).__name__}: dead ranks " \
            f"{sorted(self.dead)})" if isinstance(err, RankDiedError) else f"broken ({type(err).__name__})"
        return f"<kit.cluster.Cluster n={self.n} backend={self.backend!r} {state}>"
