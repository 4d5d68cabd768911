"""Interrupting a %%px cell (JupyterLab's stop button) stops the engines' work too; a cut collective is named.

The kernel's interrupt is a SIGINT to the kernel process (jupyter_client's interrupt_kernel, interrupt_mode
"signal"), which raises KeyboardInterrupt in the running cell; here the test process signals itself the same way
while IPython runs the %%px magic. ipyparallel's magic then sends SIGINT to the engines; the kit looks whether
that cut a collective in half.
"""
import contextlib
import os
import signal
import threading
import time

import pytest

import kit.cluster as kc
from kit.cluster import stall


def S(busy, tensor=None, since=None):
    return {"busy": busy, "tensor": tensor, "since": since}


def test_a_cut_collective_is_named_as_cut_by_the_interrupt(tmp_path):
    """The rule without processes: rank 0 waits in 'grad.w', rank 1 stopped: cut, even a second after it began."""
    for r, state in {0: S(True, "grad.w", time.time() - 1), 1: S(False)}.items():
        (tmp_path / f"rank-{r}.json").write_text(__import__("json").dumps({"rank": r, **state}))
    watch = stall.Watch(str(tmp_path), 2, timeout=600, interval=0.1)
    try:
        cut = watch.after_interrupt(grace=0.3)
    finally:
        watch.stop()
    assert cut.interrupted and cut.missing == (1,) and cut.waiting == (0,) and cut.tensor == "grad.w"
    assert "cut collective 'grad.w' in half" in cut.message() and "cluster.restart()" in cut.message()
    assert (tmp_path / stall.STOP).exists()                    # every engine's watch shuts Horovod down


def test_nothing_is_cut_when_every_rank_stopped(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank-{r}.json").write_text(__import__("json").dumps({"rank": r, **S(False)}))
    watch = stall.Watch(str(tmp_path), 2, timeout=600, interval=0.1)
    try:
        assert watch.after_interrupt(grace=0.3) is None and watch.stall is None
    finally:
        watch.stop()
    assert not (tmp_path / stall.STOP).exists()


@contextlib.contextmanager
def interrupt_after(seconds: float):
    """Send this process SIGINT after `seconds`, as jupyter_client's interrupt_kernel does to a kernel, while the
    block runs IPython's %%px cell; an interrupt that reaches the test itself fails the test (not the session).
    SIGINT raises KeyboardInterrupt here as in a kernel, even where this process inherited it ignored (a shell's
    background job starts with SIGINT ignored, and Python then installs no handler)."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        yield
        timer.join()
    except KeyboardInterrupt:
        pytest.fail("the interrupt reached the test instead of the %%px magic (did the cell end before it?)")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    yield sh
    InteractiveShell.clear_instance()


@pytest.mark.timeout(600)   # starts engines: minutes on a busy 2-core machine
@pytest.mark.engines
def test_an_interrupted_px_cell_stops_the_engines_and_the_next_cell_runs(shell, no_leaks, capsys):
    with kc.start(2, "gloo", timeout=60, quiet=True) as c:
        t0 = time.monotonic()
        with interrupt_after(4.0):
            shell.run_cell("%%px\nimport time\ntime.sleep(600)\n")
        seconds = time.monotonic() - t0
        err = capsys.readouterr().err
        print(f"interrupted %%px cell returned after {seconds:.1f} s")
        assert seconds < 4 + 20 and "Sending signal SIGINT to engines" in err and "cut collective" not in err
        t1 = time.monotonic()
        result = shell.run_cell("%%px\nafter = 1 + 1\n")       # the engines are free: the next cell runs
        assert result.error_in_exec is None and time.monotonic() - t1 < 20
        assert c.view.pull("after", block=True) == [2, 2]


@pytest.mark.timeout(600)
@pytest.mark.engines
def test_an_interrupt_that_cuts_a_collective_says_restart_and_restart_works(shell, no_leaks, capsys):
    """Rank 1 sleeps, rank 0 waits for it in an allreduce; the interrupt stops rank 1's sleep: the allreduce can
    never finish. The kit says so at once (not after the 60 s stall timeout) and frees rank 0."""
    with kc.start(2, "gloo", timeout=60, quiet=True) as c:
        shell.run_cell("%%px\nimport time, torch, horovod.torch as hvd\nhvd.init()\n")
        t0 = time.monotonic()
        with interrupt_after(6.0):
            shell.run_cell("%%px\nif hvd.rank() == 1:\n    time.sleep(600)\n"
                           "hvd.allreduce(torch.ones(4), name='grad.w')\n")
        seconds = time.monotonic() - t0
        err = capsys.readouterr().err
        print(f"cut collective named after {seconds:.1f} s (stall timeout 60 s)")
        assert "the interrupt cut collective 'grad.w' in half" in err and "rank(s) 0 waited" in err, err[-2000:]
        assert "cluster.restart()" in err and seconds < 6 + 30
        t1 = time.monotonic()
        shell.run_cell("%%px\nfreed = True\n")                  # rank 0 is no longer stuck in the allreduce
        assert c.view.pull("freed", block=True) == [True, True] and time.monotonic() - t1 < 30
        c.restart()
        result = shell.run_cell("%%px\nimport torch, horovod.torch as hvd\nhvd.init()\n"
                                "total = hvd.allreduce(torch.ones(4), op=hvd.Sum, name='again').tolist()\n")
        assert result.error_in_exec is None
        assert c.view.pull("total", block=True) == [[2.0] * 4] * 2
