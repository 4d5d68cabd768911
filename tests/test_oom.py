"""An engine killed by the kernel's OOM killer is a dead rank whose error says "out of memory" (issue 15, point 3).

The OOM killer is made to strike one engine only: that engine is moved into a memory cgroup with a small limit
(root; CI runs as root) and allocates more. The kernel logs "Memory cgroup out of memory: Killed process PID",
which the kit reads (kit.cluster.engines.how_it_died) where the kernel log is readable (root, or dmesg_restrict=0).
"""
import os
import time
from pathlib import Path

import pytest

import kit.cluster as kc
from conftest import importable
from kit.cluster import engines


def _allocate(nbytes):
    import numpy as np
    block = np.ones(nbytes, dtype=np.uint8)          # touches every page: the cgroup's limit is hit at once
    return int(block[::4096].sum())


class MemoryCgroup:
    """A memory cgroup (v2 where the memory controller is unified, else v1) with a hard limit and no swap."""

    def __init__(self, limit: int):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists() and "memory" in v2.read_text():
            self.path = Path(f"/sys/fs/cgroup/kit-test-oom-{os.getpid()}")
            self.path.mkdir()
            (self.path / "memory.max").write_text(str(limit))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")
        else:
            self.path = Path(f"/sys/fs/cgroup/memory/kit-test-oom-{os.getpid()}")
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit))

    def add(self, pid: int):
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self):
        deadline = time.time() + 10
        while True:                                        # empty once the killed engine is reaped
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)


def test_an_oom_kill_in_the_kernel_log_is_named_and_an_old_one_is_not():
    log = [(100.0, "Memory cgroup out of memory: Killed process 4242 (python) total-vm:1024kB, anon-rss:512kB"),
           (100.0, "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python,pid=77,uid=0")]
    assert "OOM killer: out of memory" in engines.how_it_died(4242, log=log)
    assert "OOM killer: out of memory" in engines.how_it_died(77, log=log)
    assert engines.how_it_died(424, log=log) == "exited"          # pid 424 is not pid 4242
    started_later = 200 * os.sysconf("SC_CLK_TCK")                  # a process that started after that kill
    assert engines.how_it_died(4242, started=started_later, log=log) == "exited"   # the pid was reused


@pytest.mark.timeout(600)   # starts engines: minutes on a busy 2-core machine
@pytest.mark.requires_root     # a memory cgroup (the rule itself is tested above without root)
@pytest.mark.engines
def test_an_engine_killed_by_the_oom_killer_is_a_dead_rank_out_of_memory(no_leaks):
    cgroup = MemoryCgroup(256 * 2**20)
    try:
        with kc.start(2, "gloo", timeout=30, quiet=True) as c:
            importable(c)
            cgroup.add(c._pids[1])
            t0 = time.monotonic()
            with pytest.raises(kc.RankDiedError) as caught:
                c.wait(c.client[c.engine_of(1)].apply_async(_allocate, 2**30))
            msg = str(caught.value)
            print(f"RankDiedError after {time.monotonic() - t0:.1f} s: {msg}")
            assert msg.startswith("rank 1 died (engine") and "OOM killer: out of memory" in msg, msg
            assert "cluster.restart()" in msg
    finally:
        cgroup.remove()
