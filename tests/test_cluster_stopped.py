"""A stopped or broken cluster refuses (issue 50): a dead rank, a dead controller, a stale view or result, abort() of
a running task, and the ring's crash quoted from the call that crashed. One 2-engine Gloo cluster serves the module;
its tests run in file order, each leaving it mended (restart) for the next; the last one stops it."""
import os
import signal
import time

import psutil
import pytest

import kit.cluster as kc
from conftest import engines_job, importable

pytestmark = pytest.mark.engines

TIMEOUT = 20


@pytest.fixture(scope="module")
def c2():
    yield from engines_job(2, timeout=TIMEOUT, devices="cpu")      # CPU engines, whatever the host


def _ring(check):
    import torch
    import torch.distributed as dist
    from kit.comm import ring
    t = torch.ones(10 + 1000 * dist.get_rank())     # every rank a different shape
    ring.allreduce(t, check=check)


def _sleep(seconds):
    import time
    time.sleep(seconds)
    return seconds


@pytest.mark.timeout(600)
def test_the_ring_crash_is_quoted_from_the_call_that_crashed_not_the_one_before(c2):
    c2.init_process_group()
    before = c2.view.apply_async(_ring, True)
    with pytest.raises(Exception, match="RingError: allreduce needs one shape and dtype on every rank"):
        c2.wait(before)                                    # checked: a RingError on every rank, nothing sent
    try:
        crashed = c2.view.apply_async(_ring, False)        # unchecked: Gloo aborts the process
        with pytest.raises(kc.RankDiedError) as e:
            c2.wait(crashed)
        said = str(e.value)
        # Python names the abort "Aborted" or, when it catches Gloo's C++ exception first, "terminate called after
        # throwing an instance of 'gloo::EnforceNotMet'": both seen here, run to run. The quote names the crashed
        # call by its stack (scatter_reduce) or, when the heap Gloo overran makes the fault handler itself crash
        # before it reaches the main thread (seen once in CI's dry run), by the engine's log line of that request.
        assert "Fatal Python error: " in said, said
        assert "scatter_reduce" in said or any(m in said for m in crashed.msg_ids), said
        assert not any(m in said for m in before.msg_ids), said       # not the call before
        assert "RingError" not in said and "\x1b[" not in said, said     # not the last call's error, no colour codes
    finally:
        importable(c2.restart())                           # the module's later tests get a working cluster


def test_nccl_on_cpu_engines_is_refused_before_torch_is_called(c2):
    with pytest.raises(kc.ClusterError, match=r"init_process_group: backend='nccl' needs one GPU per engine, and "
                                              r"these engines run on the CPU \(devices='cpu', no GPU given to them\): "
                                              r"use backend='gloo'"):
        c2.init_process_group("nccl")
    with pytest.raises(ValueError, match=r"backend='mpi' is not allowed: use 'gloo' or 'nccl'"):
        c2.init_process_group("mpi")


@pytest.mark.timeout(600)
def test_using_the_view_after_a_rank_died_names_the_rank(c2):
    os.kill(c2._pids[1], signal.SIGKILL)
    deadline = time.time() + TIMEOUT
    while 1 not in c2.dead and time.time() < deadline:
        time.sleep(0.1)
    for use in (lambda: c2.view.apply_sync(os.getpid), lambda: c2.view.execute("x = 1"), c2.init_process_group):
        with pytest.raises(kc.RankDiedError, match=r"rank 1 died \(engine 1 \(pid \d+\) exited.*cluster.restart\(\)"):
            use()                                          # not ipyparallel's KeyError: 1
    assert "broken (RankDiedError: dead ranks [1])" in repr(c2)
    importable(c2.restart())
    assert len(set(c2.view.apply_sync(os.getpid))) == 2 and repr(c2).endswith("running>")


@pytest.mark.timeout(600)
def test_abort_interrupts_a_running_task(c2):
    ar = c2.view.apply_async(_sleep, 120)
    time.sleep(2)                                          # running, not queued: ipyparallel's abort alone would not
    t0 = time.monotonic()
    ar.abort()
    with pytest.raises(Exception, match="KeyboardInterrupt"):
        ar.get(timeout=TIMEOUT)
    assert time.monotonic() - t0 < TIMEOUT
    assert c2.view.apply_sync(_sleep, 0) == [0, 0]          # the engines carry on
    with pytest.raises(RuntimeError, match="already done"):
        ar.abort()


@pytest.mark.timeout(600)
def test_a_live_engine_that_does_not_answer_a_setup_call_is_named_not_waited_for(c2):
    # A set-up call (who the engines are, init_process_group) waits a bounded time: an engine that is alive but
    # silent (here: stopped by SIGSTOP, as a lost message would leave it) is named, never waited for forever.
    os.kill(c2._pids[1], signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        ar = c2.view.apply_async(os.getpid)
        with pytest.raises(kc.NoAnswerError, match=r"^a probe: engine\(s\) \[1\] did not answer in 3 s, none seen "
                                                   r"to die \(the request was sent; the client's I/O thread is "
                                                   r"alive\)\. Run cluster.restart\(\)"):
            c2.answers(ar, "a probe", 3)
        assert time.monotonic() - t0 < TIMEOUT
    finally:
        os.kill(c2._pids[1], signal.SIGCONT)
    assert sorted(c2.wait(ar, timeout=TIMEOUT)) == sorted(c2._pids.values())   # the engine carries on


@pytest.mark.timeout(600)
def test_a_dead_controller_is_named_within_the_timeout(c2):
    ar = c2.view.apply_async(_sleep, 120)
    direct = c2.client[0].apply_async(_sleep, 120)         # a result the view did not hand out
    ctl = psutil.Process(c2._ipp.controller.pid)
    for p in [ctl, *ctl.children(recursive=True)]:         # every controller process
        p.kill()
    t0 = time.monotonic()
    with pytest.raises(kc.ControllerDiedError, match=r"the controller of this cluster \(2 engines, backend 'gloo'\) "
                                                      r"\(pid \d+\) died at .*Run cluster.restart\(\)"):
        ar.get(timeout=TIMEOUT)
    with pytest.raises(kc.ControllerDiedError):
        c2.wait(direct)
    with pytest.raises(kc.ControllerDiedError):
        c2.view.apply_sync(os.getpid)
    assert time.monotonic() - t0 < TIMEOUT
    assert "running" not in repr(c2) and "broken (ControllerDiedError)" in repr(c2)
    importable(c2.restart())
    assert len(c2.view.apply_sync(os.getpid)) == 2


@pytest.mark.timeout(600)
def test_a_stopped_cluster_and_everything_it_handed_out_refuse(c2):
    view, pending = c2.view, c2.view.apply_async(_sleep, 120)
    c2.stop()
    stopped = r"this cluster \(2 engines, backend 'gloo'\) was stopped at \d\d:\d\d:\d\d; start a new one with " \
              r"kit.cluster.start\(\)"
    with pytest.raises(kc.ClusterStoppedError, match=stopped):
        pending.get(timeout=5)                             # a result pending at stop(): failed, not left hanging
    uses = {"view": lambda: c2.view, "client": lambda: c2.client, "size": lambda: c2.size,
            "rank_of": lambda: c2.rank_of(0), "engine_of": lambda: c2.engine_of(0), "stall": lambda: c2.stall,
            "wait": lambda: c2.wait(pending), "init_process_group": c2.init_process_group, "restart": c2.restart,
            "start": c2.start, "poll_dead": c2.poll_dead, "old view apply": lambda: view.apply_sync(os.getpid),
            "old view execute": lambda: view.execute("1"), "old view map": lambda: view.map_sync(abs, [1, 2])}
    for name, use in uses.items():
        with pytest.raises(kc.ClusterStoppedError, match=stopped):
            use()
            pytest.fail(f"{name} did not refuse")
    assert repr(c2).endswith(" stopped>")       # no time: notebooks print it in checked cells
    c2.stop()                                              # a second stop() does nothing
