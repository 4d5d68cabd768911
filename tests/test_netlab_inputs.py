"""kit.netlab checks its inputs at the door (issue 50): `start(hosts=, rate=)`, `set_rate`, host names and the
other arguments of a Lab's methods. Each error names the argument, the value and what is allowed, and comes before
anything is started: these tests make every system command and the lab's lock fail if they are reached."""
import math

import pytest

from kit import netlab
from kit.netlab import lab as netlab_lab
from kit.netlab import registry


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail the test if kit.netlab gets as far as a requirement check, the lab lock or a system command."""
    def reached(*args, **kwargs):
        raise AssertionError(f"kit.netlab went past its input checks: called with {args}")
    monkeypatch.setattr(netlab_lab, "check_requirements", reached)
    monkeypatch.setattr(netlab_lab, "run", reached)
    monkeypatch.setattr(registry, "lock", reached)
    monkeypatch.setattr(registry, "run", reached)


BAD_HOSTS = [True, False, 0, -1, 201, 2.0, "2", None, ["h1"], math.nan]


@pytest.mark.parametrize("hosts", BAD_HOSTS, ids=repr)
def test_start_refuses_a_bad_host_count(hosts, nothing_runs):
    with pytest.raises(netlab.LabError) as e:
        netlab.start(hosts=hosts)
    assert f"hosts={hosts!r}" in str(e.value) and "an int from 1 to 200" in str(e.value)


BAD_RATES = {                       # value -> what the error must also say
    "1.2.3mbit": "'8bit' to '1000gbit'",
    "0.0001bit": "outside what tc's token bucket takes",
    "7bit": "outside what tc's token bucket takes",
    "2000gbit": "outside what tc's token bucket takes",
    "0mbit": "outside what tc's token bucket takes",
    "": "a number and a unit",
    "-1mbit": "a number and a unit",
    "fast": "a number and a unit",
    "5 furlongs": "a number and a unit",
    "nanmbit": "a number and a unit",
    "1e9bit": "a number and a unit",
    None: "give a string",
    1e9: "give a string",
    100: "give a string",
    b"1gbit": "give a string",
}


@pytest.mark.parametrize("rate", list(BAD_RATES), ids=repr)
def test_start_refuses_a_bad_rate(rate, nothing_runs):
    with pytest.raises(netlab.LabError) as e:
        netlab.start(hosts=2, rate=rate)
    assert f"rate={rate!r}" in str(e.value) and BAD_RATES[rate] in str(e.value), str(e.value)
    assert "'1gbit'" in str(e.value)                     # and an example of what is allowed


def test_good_rates_parse_to_bits_per_second():
    assert netlab.parse_rate("1gbit") == 1e9 and netlab.parse_rate("12.5mbps") == 1e8
    assert netlab.parse_rate(" 100MBIT ") == 1e8 and netlab.parse_rate(".5kbit") == 500
    assert netlab.parse_rate("8bit") == 8 and netlab.parse_rate("1000gbit") == 1e12


@pytest.fixture
def lab(monkeypatch, nothing_runs):
    """A Lab object of 2 hosts that believes its owner record is its own, with no lab behind it."""
    monkeypatch.setattr(registry, "read_record", lambda path: {"token": "t"})
    return netlab_lab.Lab(63, 2, "1gbit", "/nonexistent/kitlab63-x", token="t")


@pytest.mark.parametrize("rate", list(BAD_RATES), ids=repr)
def test_set_rate_refuses_a_bad_rate(lab, rate):
    with pytest.raises(netlab.LabError, match=r"rate=.*'8bit' to '1000gbit'"):
        lab.set_rate(rate)
    assert lab.rate == "1gbit"


CALLS = [                            # (what, call, text the error must hold)
    ("unknown host", lambda lab: lab.cut("h9"), "no host 'h9' in this lab: its hosts are ['h1', 'h2']"),
    ("host not a str", lambda lab: lab.restore(1), "no host 1 in this lab: its hosts are ['h1', 'h2']"),
    ("unknown host ns", lambda lab: lab.ns("h3"), "no host 'h3'"),
    ("unknown host ssh", lambda lab: lab.ssh("h0", "hostname"), "no host 'h0'"),
    ("ssh cmd a list", lambda lab: lab.ssh("h1", ["hostname"]), "cmd=['hostname']: give one shell command line"),
    ("ssh timeout nan", lambda lab: lab.ssh("h1", "true", timeout=math.nan), "timeout=nan: give a finite number"),
    ("ssh timeout 0", lambda lab: lab.ssh("h1", "true", timeout=0), "timeout=0: give a finite number"),
    ("launch argv a str", lambda lab: lab.launch("h1", "hostname"), "argv='hostname': give the command as a"),
    ("launch argv empty", lambda lab: lab.launch("h1", []), "argv=[]: give the command as a non-empty list"),
    ("measure one host", lambda lab: lab.measure_rate("h1", "h1"), "give two different hosts of ['h1', 'h2']"),
    ("measure inf", lambda lab: lab.measure_rate("h1", "h2", math.inf), "seconds=inf: give a finite number"),
    ("measure unknown", lambda lab: lab.measure_rate("h1", "h5"), "no host 'h5'"),
    ("jobs_left -1", lambda lab: lab.jobs_left(-1), "seconds=-1: give a finite number of seconds, 0 to"),
    ("slots 0", lambda lab: lab.horovodrun_args(0), "slots=0: give the processes per host, an int from 1"),
    ("slots True", lambda lab: lab.mpi_args(True), "slots=True: give the processes per host"),
    ("hosts a str", lambda lab: lab.mpi_args(1, "h1"), "hosts='h1': give a non-empty list of the lab's hosts"),
    ("hosts unknown", lambda lab: lab.horovodrun_args(1, ["h1", "h7"]), "no host 'h7'"),
    ("keep a name", lambda lab: lab.keep(["sshd"]), "pids=['sshd']: give process ids"),
    ("on_stop not callable", lambda lab: lab.on_stop("stop"), "fn='stop': give a function"),
]


@pytest.mark.parametrize("call,text", [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_lab_methods_refuse_bad_arguments(lab, call, text):
    with pytest.raises(netlab.LabError) as e:
        call(lab)
    assert text in str(e.value), str(e.value)


def test_a_lab_whose_record_is_not_its_own_refuses(monkeypatch, nothing_runs):
    monkeypatch.setattr(registry, "read_record", lambda path: {"token": "another lab's"})
    lab = netlab_lab.Lab(5, 2, "1gbit", "/nonexistent/kitlab5-x", token="mine")
    with pytest.raises(netlab.LabError, match=r"this lab \(kitlab5, started at .*\) is no longer registered"):
        lab.cut("h1")
