"""kit.cluster.stall: a rank that never joins a collective is named, within the cluster's timeout; restart()
recovers."""
import os
import time

import pytest

import kit.cluster as kc
from conftest import importable
from kit.cluster import stall


# ------------------------------------------------------------------ the rule (no processes)
def S(busy, tensor=None, since=None):
    return {"busy": busy, "tensor": tensor, "since": since}


def test_an_idle_rank_missing_from_an_old_collective_is_a_stall():
    states = {0: S(True, "grad.w", 100.0), 1: S(False)}
    found = stall.find_stall(states, 2, timeout=10, now=115.0)
    assert found == stall.Stall(missing=(1,), tensor="grad.w", waiting=(0,), seconds=15.0)
    msg = found.message()
    assert "rank(s) 1 never joined collective 'grad.w'" in msg and "cluster.restart()" in msg


def test_ranks_in_different_collectives_are_a_stall():
    states = {0: S(True, "a", 100.0), 1: S(True, "b", 104.0), 2: S(True, "a", 101.0)}
    assert stall.find_stall(states, 3, timeout=10, now=120.0).missing == (1,)


@pytest.mark.parametrize("states", [
    {0: S(True, "grad.w", 100.0), 1: S(True)},              # rank 1 still computing: a slow step, not a stall
    {0: S(True, "grad.w", 100.0), 1: S(True, "grad.w", 100.5)},   # everyone in it: a slow collective
    {0: S(True, "grad.w", 112.0), 1: S(False)},              # not waited `timeout` yet
    {0: S(True, "grad.w", 100.0)},                            # rank 1 unknown (no state file): not named
])
def test_no_stall_when_nobody_is_known_to_be_missing(states):
    assert stall.find_stall(states, 2, timeout=10, now=115.0) is None


def test_horovod_stall_inspector_settings_follow_the_timeout():
    assert stall.horovod_env(60) == {"HOROVOD_STALL_CHECK_TIME_SECONDS": 15, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": 60}
    env = kc.engine_env(kc.assign_slots({0: "h"})[0], gpus=[], threads=1, timeout=20)
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "20" and env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "5"


# ------------------------------------------------------------------ a real job
def _rank0_only_allreduce():
    import horovod.torch as hvd
    import torch
    if hvd.rank() == 0:                     # the bug: rank 1 never calls the collective
        return hvd.allreduce(torch.ones(4), name="grad.w").tolist()
    return "skipped"


def _rank0_only_dist_allreduce():
    import torch
    import torch.distributed as dist
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    return t.tolist()


def _hvd_sum():
    import horovod.torch as hvd
    import torch
    return hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name="ok").item()


@pytest.mark.timeout(900)   # starts engines twice: minutes on a busy 2-core machine
@pytest.mark.engines
def test_a_rank_that_never_joins_is_named_within_the_timeout_then_restart_works(no_leaks):
    timeout = 10
    with kc.start(2, "gloo", timeout=timeout, quiet=True) as c:
        importable(c)
        t0 = time.monotonic()
        with pytest.raises(kc.StallError, match=r"rank\(s\) 1 never joined collective 'grad.w'.*cluster.restart\(\)"):
            c.wait(c.view.apply_async(_rank0_only_allreduce))
        seconds = time.monotonic() - t0
        print(f"\nhorovod stall named after {seconds:.1f} s (timeout {timeout} s)")
        assert seconds < timeout + 30
        importable(c.restart())
        assert c.view.apply_sync(_hvd_sum) == [3.0, 3.0]
        c.init_process_group()              # torch.distributed through the kit's group (timeout= the cluster's)
        t0 = time.monotonic()
        with pytest.raises(kc.StallError, match=r"rank\(s\) 1 never joined collective 'all_reduce"):
            c.wait(c.view.apply_async(_rank0_only_dist_allreduce))
        seconds = time.monotonic() - t0
        print(f"torch.distributed stall named after {seconds:.1f} s (timeout {timeout} s)")
        assert seconds < timeout + 30
        scratch = c._dir
    assert not os.path.exists(scratch)


@pytest.mark.timeout(600)   # starts engines: minutes on a busy 2-core machine
@pytest.mark.engines
def test_a_px_cell_with_a_stall_returns_and_says_which_rank_and_what_to_do(no_leaks, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    try:
        with kc.start(2, "gloo", timeout=10, quiet=True):      # in IPython: %%px targets this job
            t0 = time.monotonic()
            result = shell.run_cell("%%px\nimport horovod.torch as hvd, torch\n"
                                    "if hvd.rank() == 0:\n    hvd.allreduce(torch.ones(4), name='grad.w')\n")
            seconds = time.monotonic() - t0
            assert result.error_in_exec is not None and seconds < 10 + 30
            err = capsys.readouterr().err
            assert "StallError: rank(s) 1 never joined collective 'grad.w'" in err and "cluster.restart()" in err
    finally:
        InteractiveShell.clear_instance()


def test_only_calls_that_wait_for_other_ranks_count_as_collectives():
    import types

    def frame_in(path, func, **local):      # what collective_of reads of a frame
        return types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=path, co_name=func),
                                     f_locals=local, f_back=None)
    hvd = "/venv/site-packages/horovod/torch/mpi_ops.py"
    sync = frame_in(hvd, "synchronize", handle=7)
    sync.f_back = frame_in(hvd, "allreduce", name="grad.w")
    assert stall.collective_of(sync) == ("grad.w", 7)
    assert stall.collective_of(frame_in("/venv/site-packages/horovod/torch/__init__.py", "init")) is None
    assert stall.collective_of(frame_in("/venv/site-packages/horovod/tensorflow/__init__.py", "<module>")) is None
    assert stall.collective_of(frame_in("/work/kit/engines.py", "all_reduce")) is None
