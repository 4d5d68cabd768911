"""Inputs checked at the door (issue 50): every bad argument of kit.cluster.start, kit.datasets and kit.mnist.train
is refused with an error naming the argument, the value and what is allowed, before anything starts. No process is
started here: the launchers, ipyparallel and subprocess are replaced by traps that fail the test if called."""
import math

import numpy as np
import pytest

import kit.cluster as kc
from kit import datasets
from kit.cluster import checks


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if a launcher or ipyparallel were reached (validation must come first)."""
    def trap(*a, **k):
        raise AssertionError("something was started before the arguments were checked")
    import ipyparallel
    monkeypatch.setattr(kc.core, "launcher", trap)
    monkeypatch.setattr(kc.remote, "launcher_for", trap)
    monkeypatch.setattr(kc.core.kit_slurm, "launcher_for", trap)
    monkeypatch.setattr(ipyparallel.Cluster, "__init__", trap)
    # (subprocess and os.fork: the fast tier's guard in tests/conftest.py refuses them already)


class FakeLab:
    """Just what kit.cluster.Hosts asks for."""
    hosts, ssh_config, dir, addr = ["h1", "h2"], "/nonexistent/ssh_config", "/nonexistent", "198.18.0.1"

    def launch_env(self):
        return {}


BAD_START = [   # (arguments, the words the error must hold: the argument, the value, what is allowed)
    (dict(n=0), "n=0 is not allowed: a whole number of engines >= 1"),
    (dict(n=-2), "n=-2 is not allowed"),
    (dict(n="2"), "n='2' is not allowed"),
    (dict(n=True), "n=True is not allowed"),                       # a bool is not a number of engines
    (dict(n=2.0), "n=2.0 is not allowed"),
    (dict(backend="nccl"), "backend='nccl' is not allowed: one of 'gloo', 'mpi'"),
    (dict(backend=None), "backend=None is not allowed"),
    (dict(timeout=0), "timeout=0 is not allowed: a finite number of seconds > 0"),
    (dict(timeout=-1), "timeout=-1 is not allowed"),
    (dict(timeout="5"), "timeout='5' is not allowed"),
    (dict(timeout=math.nan), "timeout=nan is not allowed"),
    (dict(timeout=math.inf), "timeout=inf is not allowed"),
    (dict(timeout=True), "timeout=True is not allowed"),
    (dict(threads=-3), "threads=-3 is not allowed: a whole number of threads per engine >= 1"),
    (dict(threads=0), "threads=0 is not allowed"),
    (dict(threads=1.5), "threads=1.5 is not allowed"),
    (dict(devices="cuda"), "devices='cuda' is not allowed: one of 'auto', 'cpu', 'gpu'"),
    (dict(share_gpus="yes"), "share_gpus='yes' is not allowed: True or False"),
    (dict(quiet=1), "quiet=1 is not allowed: True or False"),
    (dict(mpiexec=3), "mpiexec=3 is not allowed: the path of an mpiexec"),
    (dict(ip="localhost:80"), "ip='localhost:80' is not allowed: an address of this machine"),
    (dict(ip=None), "ip=None is not allowed"),
    (dict(hosts=5), "hosts=5 is not allowed: horovodrun's 'server1:4,server2:4', a list of host names"),
    (dict(hosts=""), "hosts='' is not allowed"),
    (dict(hosts=[]), r"hosts=\[\] is not allowed"),
    (dict(hosts=["h1", 2]), r"hosts=\['h1', 2\] is not allowed"),
    (dict(n=3, hosts=["h1", "h2"]), r"hosts=\['h1', 'h2'\] is not allowed: n=3 engines must split evenly"),
    (dict(hosts="server1:2", slurm=True), r"give hosts= \(SSH\) or slurm= \(a Slurm job\), not both"),
    (dict(slurm="gpu"), "slurm='gpu' is not allowed: a kit.netlab.slurm cluster, a dict of options"),
]


@pytest.mark.parametrize("kwargs, match", BAD_START, ids=[repr(k) for k, _ in BAD_START])
def test_every_bad_argument_of_start_is_named_before_anything_starts(nothing_starts, kwargs, match):
    args = {"n": 2, **kwargs}
    with pytest.raises(kc.ArgumentError, match=match) as e:
        kc.start(**args)
    assert "Nothing was started" in str(e.value) or "not both" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError)   # either `except` catches it


def test_start_takes_its_settings_by_name_only_and_lists_each_once():
    import inspect
    sig = inspect.signature(kc.start)
    assert [p.name for p in sig.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD] == ["n", "backend"]
    keyword = [p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
    assert keyword == ["timeout", "devices", "share_gpus", "threads", "mpiexec", "hosts", "slurm", "ip", "quiet",
                       "oversubscribe", "allow_all_interfaces"]
    assert not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    doc = kc.start.__doc__
    for name in ["n", "backend", *keyword]:
        assert doc.count(f"\n    {name}: ") + doc.count(f" {name}: ") >= 1, name
    with pytest.raises(TypeError):
        kc.start(2, "gloo", 60)                       # timeout by position: refused by Python itself


def test_a_timeout_under_a_second_is_rounded_up_for_whole_second_settings():
    slot = kc.assign_slots({0: "h"})[0]
    for timeout, whole in ((0.5, 1), (1.0, 1), (1.2, 2), (60, 60)):
        env = kc.engine_env(slot, gpus=[], threads=1, timeout=timeout)
        assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == env["KIT_TIMEOUT"] == str(whole)
        assert int(env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]) == whole
        assert int(env["HOROVOD_STALL_CHECK_TIME_SECONDS"]) >= 1
    assert checks.seconds("timeout", 0.5) == 0.5


def test_hosts_may_be_a_string_a_list_or_anything_shaped_like_a_lab():
    assert checks.check_hosts("server1:2,server2:2", 4) == "server1:2,server2:2"
    assert checks.check_hosts(["server1", "server2"], 4) == "server1:2,server2:2"
    assert checks.check_hosts(["server1:3", "server2:1"], 4) == "server1:3,server2:1"
    lab = FakeLab()
    assert isinstance(lab, kc.Hosts) and checks.check_hosts(lab, 4) is lab
    assert not isinstance(["h1"], kc.Hosts) and not isinstance("h1:1", kc.Hosts)


def test_a_list_of_hosts_reaches_the_launcher_as_horovodruns_string(monkeypatch):
    seen = {}

    def fake(backend, hosts, n, ip, mpiexec):
        seen.update(hosts=hosts, ip=ip)
        raise kc.ClusterError("stop here")
    monkeypatch.setattr(kc.remote, "launcher_for", fake)
    with pytest.raises(kc.ClusterError, match="stop here"):
        kc.start(4, "gloo", hosts=["a", "b"], ip="198.18.0.1")
    assert seen == {"hosts": "a:2,b:2", "ip": "198.18.0.1"}


# ----------------------------------------------------------------------------------- data sets
def _arrays(**over):
    rng = np.random.default_rng(0)
    a = {"x_train": rng.integers(0, 256, (20, 28, 28), dtype=np.uint8), "y_train": np.arange(20) % 10,
         "x_test": rng.integers(0, 256, (10, 28, 28), dtype=np.uint8), "y_test": np.arange(10) % 10}
    a.update(over)
    return a


BAD_DATA = [
    (dict(x_train=np.random.default_rng(0).random((20, 28, 28))),
     r"x_train: float images with values in 0\.\.1 \(max [0-9.]+\) would all become 0 as uint8: "
     r"multiply by 255 first"),
    (dict(x_train=np.arange(20 * 28 * 28).reshape(20, 28, 28) % 301), r"x_train: values 0\.\.300 do not fit 0\.\.255"),
    (dict(x_train=np.full((20, 28, 28), -1)), r"x_train: values -1\.\.-1 do not fit 0\.\.255"),
    (dict(x_train=np.full((20, 28, 28), 3.5)), r"x_train: float images with fractions"),
    (dict(x_train=np.full((20, 28, 28), np.nan)), r"x_train: .*NaN"),
    (dict(x_train=np.zeros((20, 28, 28), dtype=complex)), r"x_train: dtype complex128 is not allowed"),
    (dict(x_train=np.zeros((20, 32, 32), np.uint8)), r"x_train: shape \(20, 32, 32\) is not allowed: \(N, 28, 28\)"),
    (dict(y_train=(np.arange(20) % 10)[:, None]), r"y_train: shape \(20, 1\) is not allowed: \(N,\) class numbers"),
    (dict(y_train=np.eye(10)[np.arange(20) % 10]), r"y_train: shape \(20, 10\) .*one-hot.*argmax"),
    (dict(y_train=np.arange(20)), r"y_train: labels 0\.\.19 are not allowed: class numbers 0\.\.9"),
    (dict(y_train=np.arange(20) - 1), r"y_train: labels -1\.\.18 are not allowed"),
    (dict(y_train=np.arange(20) % 10 + 0.5), r"y_train: dtype float64 with fractions is not allowed"),
    (dict(y_train=np.arange(19) % 10), r"train: 20 images but 19 labels"),
    (dict(x_train=np.zeros((0, 28, 28), np.uint8), y_train=np.zeros(0, int)), r"x_train: no images \(N = 0\)"),
]


@pytest.mark.parametrize("over, match", BAD_DATA, ids=[next(iter(o)) + str(i) for i, (o, _) in enumerate(BAD_DATA)])
def test_every_bad_data_set_is_refused_with_what_is_wrong(over, match):
    with pytest.raises(datasets.DatasetError, match=match):
        datasets.checked("test", "here", _arrays(**over))
    a = _arrays(**over)
    with pytest.raises(datasets.DatasetError, match=match):     # the constructor checks too
        datasets.Dataset("test", "here", a["x_train"], a["y_train"], a["x_test"], a["y_test"])


def test_good_data_in_other_integer_types_and_whole_floats_is_taken_as_it_is():
    a = _arrays()
    ds = datasets.checked("test", "here", {**a, "x_train": a["x_train"].astype(np.int64),
                                           "x_test": a["x_test"].astype(np.float32), "y_test": a["y_test"] * 1.0})
    assert ds.x_train.dtype == np.uint8 and np.array_equal(ds.x_train, a["x_train"])
    assert np.array_equal(ds.x_test, a["x_test"]) and ds.y_test.dtype == np.int64


def test_a_bad_npz_file_is_named_with_what_is_wrong(tmp_path, monkeypatch):
    a = _arrays(x_train=np.random.default_rng(1).random((20, 28, 28)).astype(np.float32))
    np.savez(tmp_path / "mnist.npz", **a)
    monkeypatch.setenv("KIT_DATA_DIR", str(tmp_path))
    with pytest.raises(datasets.DatasetError, match=rf"{tmp_path / 'mnist.npz'}: x_train: float images"):
        datasets.load("mnist", download=False, verbose=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="MNIST"), r"name='MNIST' is not allowed: one of auto, mnist, fashion_mnist, digits"),
    (dict(name=None), r"name=None is not allowed"),
    (dict(download="no"), r"download='no' is not allowed: True or False"),
    (dict(verbose=None), r"verbose=None is not allowed: True or False"),
])
def test_bad_arguments_of_load_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        datasets.load(**{"name": "digits", **kwargs})


# ----------------------------------------------------------------------------------- kit.mnist.train's arguments
@pytest.mark.parametrize("argv, match", [
    (["--epochs", "0"], r"--epochs must be at least 1 \(got 0\)"),
    (["--batch-size", "-1"], r"--batch-size must be at least 1 \(got -1\)"),
    (["--threads", "0"], r"--threads must be at least 1"),
    (["--warmup-epochs", "nan"], r"--warmup-epochs must be a finite number >= 0 \(got nan\)"),
    (["--warmup-epochs", "-1"], r"--warmup-epochs must be a finite number >= 0 \(got -1.0\)"),
    (["--init-timeout", "inf"], r"--init-timeout must be a finite number >= 0 \(got inf\)"),
    (["--seed", "-5"], r"--seed must be a whole number in 0\.\.4294963199 \(got -5\); each rank uses seed \+ rank"),
    (["--seed", str(2**40)], r"--seed must be a whole number in 0\.\.4294963199"),
    (["--json", "/nonexistent-dir/out.json"], r"--json /nonexistent-dir/out.json: its folder /nonexistent-dir "
                                              r"does not exist"),
    (["--events", "/nonexistent-dir/e.jsonl"], r"--events .*its folder /nonexistent-dir does not exist"),
    (["--as-workers", "2", "--elastic"], r"--as-workers is a one-process control run"),
    (["--dataset", "cifar"], r"argument --dataset: invalid choice: 'cifar'"),
])
def test_bad_training_arguments_are_named_before_tensorflow_starts(argv, match, capsys):
    from kit.mnist import train
    with pytest.raises(SystemExit) as e:
        train.parse_args(argv)
    assert e.value.code == 2
    import re
    assert re.search(match, capsys.readouterr().err), match
