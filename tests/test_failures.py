"""Bad input: each a clear error that says what to do, and nothing left running (issue 15, point 6)."""
import pytest

import kit.cluster as kc
from conftest import descendants


@pytest.mark.parametrize("hosts, match", [
    ("server1", r"hosts='server1': write it as horovodrun does, e.g. 'server1:4,server2:4'"),
    ("server1:four", r"write it as horovodrun does"),
    ("server1:2,server2:2", r"hosts='server1:2,server2:2' has 4 slots but n=6"),      # n larger than the slots
])
def test_hosts_that_do_not_parse_or_add_up_say_so_before_anything_starts(no_leaks, hosts, match):
    before = descendants()
    with pytest.raises(ValueError, match=match):
        kc.start(6 if "," in hosts else 2, "gloo", hosts=hosts, ip="198.18.0.1")
    assert descendants() == before


@pytest.mark.timeout(400)   # backend="mpi" first probes Horovod's build (imports torch and TF): slow under load
@pytest.mark.parametrize("host, why", [
    ("no-such-host.invalid", r"no-such-host.invalid over SSH \(.*(resolve|not known)"),   # does not resolve
    ("127.0.0.1", r"127.0.0.1 over SSH \(.*(refused|Permission denied|closed)"),          # no SSH server, or refused
])
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_host_that_cannot_be_reached_is_named_and_nothing_starts(no_leaks, host, why, backend):
    before = descendants()
    with pytest.raises(kc.ClusterError, match=r"cannot reach " + why + r".*Nothing was started"):
        kc.start(2, backend, hosts=f"{host}:2", ip="198.18.0.1", quiet=True)
    assert descendants() == before
