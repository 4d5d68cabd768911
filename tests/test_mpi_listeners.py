"""backend="mpi" and the network (issue 50): what `mpiexec` (Open MPI 5's `prterun`) listens on.

The ranks of a one-host job talk through shared memory (no TCP listener of theirs; test_cluster.py's 4-engine job
lists every listener). prterun's own daemon-control (OOB) listener cannot be kept off 0.0.0.0 and [::] with the
Open MPI that pip installs: PRRTE drops loopback before it reads the include list, so `prte_if_include=lo` selects
nothing and prterun refuses to start, and the listener binds the wildcard whatever the list says
(open-mpi/ompi#14441, fixed by openpmix/prrte#2788 after Open MPI 5.0.x). This test checks that this is still so;
when it fails, the Open MPI here has the fix: pass `--prtemca prte_if_include lo` in
kit.cluster.launchers.MPILauncher.configure and let test_cluster.py allow no wildcard listener for mpi either."""
import os
import subprocess
import sys

import pytest

import kit.cluster as kc
from kit import env

pytestmark = pytest.mark.engines


def _mpiexec(*args, seconds=1):
    mpiexec = kc.launchers.find_mpiexec()
    assert mpiexec, "no mpiexec: make setup installs Open MPI into .venv"
    run_env = {**os.environ, **env.MPI_ENV, "OMPI_MCA_btl": "self,sm"}
    return subprocess.Popen([mpiexec, "--oversubscribe", *args, "-n", "1", sys.executable, "-c",
                             f"import time; time.sleep({seconds})"], env=run_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(300)
def test_prterun_cannot_yet_be_kept_off_the_wildcard_addresses(no_leaks):
    p = _mpiexec("--prtemca", "prte_if_include", "lo", "--prtemca", "oob_tcp_disable_ipv6", "1")
    out, _ = p.communicate(timeout=240)
    assert p.returncode != 0 and "No network interfaces were found for out-of-band communications" in out, (
        "prterun started with only loopback: the PRRTE fix (openpmix/prrte#2788) has arrived, see this module's "
        f"docstring. Its output: {out[-2000:]}")
