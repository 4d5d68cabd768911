"""Bad input: each a clear error that says what to do, and nothing left running (issue 15, point 6): hosts=
strings, unreachable hosts, an unwritable checkpoint folder, a data folder that does not exist. (A loader
worker that raises: tests/test_data_loading.py.)"""
import subprocess
import sys
from pathlib import Path

import pytest

import kit.cluster as kc
from conftest import descendants
from kit import datasets, mnist


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
@pytest.mark.engines
def test_a_host_that_cannot_be_reached_is_named_and_nothing_starts(no_leaks, host, why, backend):
    before = descendants()
    with pytest.raises(kc.ClusterError, match=r"cannot reach " + why + r".*Nothing was started"):
        kc.start(2, backend, hosts=f"{host}:2", ip="198.18.0.1", quiet=True)
    assert descendants() == before


@pytest.mark.parametrize("kwargs, match", [
    (dict(slurm=dict(partion="gpu"), ip="198.18.0.1"), r"slurm= options \['partion'\] unknown: use partition, "),
    (dict(slurm=True), r"engines in a Slurm job need ip= an address of this machine that the nodes reach"),
    (dict(slurm=dict(nodes=4), ip="198.18.0.1"), r"n=6 engines do not split evenly over nodes=4"),
    (dict(slurm=True, hosts="server1:6", ip="198.18.0.1"), r"give hosts= \(SSH\) or slurm= \(a Slurm job\)"),
])
def test_slurm_options_that_cannot_work_say_so_before_anything_starts(no_leaks, kwargs, match):
    before = descendants()
    with pytest.raises(ValueError, match=match):
        kc.start(6, "gloo", **kwargs)
    assert descendants() == before


@pytest.mark.engines
def test_slurm_without_its_clients_says_so_and_nothing_starts(no_leaks, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))          # no sinfo, sbatch, ... here
    with pytest.raises(kc.ClusterError, match=r"cannot run Slurm's clients \(sinfo: .*is this a Slurm login node"):
        kc.start(2, "gloo", slurm=dict(partition="gpu"), ip="198.18.0.1", quiet=True)


def test_the_engines_batch_script_carries_the_options_and_keeps_braces():
    from kit.cluster import slurm
    job, ip = slurm.job_for(dict(partition="gpu", account="proj42", time="00:30:00", nodes=2,
                                 sbatch=["--gres=gpu:4", "--comment={x}"]), 4, "198.18.0.1")
    assert ip == "198.18.0.1" and job.per_node() == 2
    from IPython.utils.text import EvalFormatter     # what ipyparallel formats batch scripts with
    text = EvalFormatter().format(job.header())
    assert text.splitlines() == ["#SBATCH " + o for o in (
        "--export=ALL", "--no-requeue", "--ntasks=4", "--nodes=2", "--ntasks-per-node=2", "--partition=gpu",
        "--account=proj42", "--time=00:30:00", "--gres=gpu:4", "--comment={x}")]


# ----------------------------------------------------------------------------------- checkpoints and data sets
def test_unwritable_checkpoint_folder_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for bad in (blocker / "ckpt", blocker):      # a path below a file, a file: unwritable for root as well
        with pytest.raises(mnist.CheckpointError, match=rf"checkpoint folder {bad} cannot be written .*choose a"):
            mnist.checkpoint_callback(bad)       # at once, not at the end of the first epoch
    assert blocker.read_text() == "not a folder"
    good = tmp_path / "new" / "ckpt"
    assert mnist.check_writable(good) == good and good.is_dir() and not list(good.iterdir())


@pytest.mark.timeout(400)   # a horovodrun job: imports TF on 2 ranks, slow on a busy 2-core machine
@pytest.mark.engines
def test_script_with_unwritable_checkpoint_folder_stops_every_rank_with_the_reason(tmp_path, no_leaks):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    script = Path(__file__).resolve().parent.parent / "scripts" / "train_keras_mnist.py"
    cmd = [str(Path(sys.executable).parent / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2",
           sys.executable, str(script), "--dataset", "digits", "--train-samples", "256", "--epochs", "1",
           "--checkpoint-dir", str(blocker / "ckpt")]
    p = subprocess.run(cmd, env=mnist.launch_env(), capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and f"checkpoint folder {blocker / 'ckpt'} cannot be written" in out, out[-3000:]
    assert "training on" not in out, "training started before the checkpoint folder was checked"


def test_data_folder_that_does_not_exist_is_named(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv("KIT_DATA_DIR", str(missing))
    for name in ("auto", "mnist", "fashion_mnist"):     # "auto" must not quietly fall back to digits
        with pytest.raises(datasets.DatasetError, match=rf"KIT_DATA_DIR={missing} is not a folder: create it"):
            datasets.load(name, download=False, verbose=False)
    assert datasets.load("digits", verbose=False).name == "digits"      # asked for by name: needs no folder
