"""kit.cluster: N engines as one Horovod job (gloo and mpi), torch.distributed, failures, clean-up."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import kit

import kit.cluster as kc
import kit.env
from conftest import descendants, importable


# ------------------------------------------------------------------ pure functions (no processes)
def test_assign_slots_groups_ranks_by_host():
    slots = kc.assign_slots({0: "a", 1: "b", 2: "a", 3: "b", 4: "a"})
    assert [slots[e].rank for e in (0, 2, 4, 1, 3)] == [0, 1, 2, 3, 4]
    assert [slots[e].local_rank for e in (0, 2, 4, 1, 3)] == [0, 1, 2, 0, 1]
    assert {slots[e].local_size for e in (0, 2, 4)} == {3} and {slots[e].local_size for e in (1, 3)} == {2}
    assert (slots[1].cross_rank, slots[1].cross_size) == (1, 2)   # local rank 0 exists on both hosts
    assert (slots[4].cross_rank, slots[4].cross_size) == (0, 1)   # local rank 2 only on host a
    assert all(s.size == 5 for s in slots.values())


def test_engine_env_pins_one_gpu_per_local_rank_and_limits_threads():
    slots = kc.assign_slots({0: "h", 1: "h", 2: "h"})
    envs = [kc.engine_env(slots[e], gpus=["3", "5", "7"], threads=2, timeout=30) for e in range(3)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3", "5", "7"]
    assert all(e["OMP_NUM_THREADS"] == e["TF_NUM_INTRAOP_THREADS"] == "2" for e in envs)
    assert envs[2]["KIT_RANK"] == "2" and envs[2]["TF_USE_LEGACY_KERAS"] == "1"
    assert kc.engine_env(slots[0], gpus=[], threads=1, timeout=30)["CUDA_VISIBLE_DEVICES"] == ""


def test_gloo_env_is_what_horovodrun_gives_a_worker():
    s = kc.assign_slots({0: "localhost", 1: "localhost"})[1]
    env = kc.gloo_env(s, addr="127.0.0.1", port=1234, iface="lo")
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2" and env["HOROVOD_LOCAL_RANK"] == "1"
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1" and env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "1234"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"


def test_a_second_rendezvous_never_hands_out_the_first_ones_addresses():
    """What Gloo and Horovod send the rendezvous server for two hvd.init() in a row (horovod.torch's, then
    horovod.tensorflow's): each rank PUTs rank_R, GETs its peers' keys, then DELETEs R. In the second round a peer's
    key is there only once that peer has written it again; in the first, a key stays after its rank is through
    (a peer may still need it)."""
    import urllib.error
    import urllib.request
    from kit.cluster.launchers import Rendezvous

    def call(method, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/{path}", data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, b""

    server = Rendezvous("127.0.0.1")
    server.init(list(kc.assign_slots({0: "h", 1: "h"}).values()))
    try:
        for scope in ("global", "global_process_set_hash_1"):     # a scope of Horovod's plan, and one it adds
            assert call("PUT", f"{scope}/rank_0", b"old0")[0] == 200
            assert call("PUT", f"{scope}/rank_1", b"old1")[0] == 200
            assert call("DELETE", f"{scope}/0")[0] == 200          # rank 0 is through...
            assert call("GET", f"{scope}/rank_0") == (200, b"old0")  # ...rank 1 may still read its address
            assert call("DELETE", f"{scope}/1")[0] == 200
            assert call("PUT", f"{scope}/rank_0", b"new0")[0] == 200  # round two: rank 0 first
            assert call("GET", f"{scope}/rank_1")[0] == 404          # not rank 1's old address: wait for its new one
            assert call("GET", f"{scope}/rank_0") == (200, b"new0")
            assert call("PUT", f"{scope}/rank_1", b"new1")[0] == 200
            assert call("GET", f"{scope}/rank_1") == (200, b"new1")
    finally:
        server.stop()


def test_hosts_are_parsed_like_horovodrun_and_must_add_up():
    assert kc.parse_hosts("server1:4,server2:2", 6, ip="10.0.0.1") == {"server1": 4, "server2": 2}
    with pytest.raises(ValueError, match="6 slots but n=4"):
        kc.parse_hosts("server1:4,server2:2", 4, ip="10.0.0.1")
    with pytest.raises(ValueError, match="ip="):
        kc.parse_hosts("server1:4", 4, ip="127.0.0.1")
    with pytest.raises(ValueError, match="server1:4,server2:4"):
        kc.parse_hosts("server1", 1, ip="10.0.0.1")


# ------------------------------------------------------------------ bad input: clear error, nothing started
# (every bad argument of kit.cluster.start, one table: tests/test_inputs.py)
def test_mpi_without_mpiexec_says_what_to_do(no_leaks):
    with pytest.raises(kc.ClusterError, match="mpiexec.*make lab.*backend='gloo'"):
        kc.start(2, "mpi", mpiexec="/nonexistent/mpiexec")


def test_mpi_with_horovod_built_without_mpi_says_what_to_do(no_leaks, monkeypatch):
    monkeypatch.setattr(kc.launchers, "horovod_has_mpi", lambda: False)
    with pytest.raises(kc.ClusterError, match="built without MPI.*install_horovod.sh"):
        kc.start(2, "mpi")


# ------------------------------------------------------------------ device policy (a GPU list, no GPU needed)
GPUS = {0: [], 1: ["0"], 2: ["0", "1"], 4: ["0", "1", "2", "3"]}


@pytest.mark.parametrize("g", sorted(GPUS))
@pytest.mark.parametrize("engines", [1, 2, 4, 5])
def test_cpu_work_runs_with_any_number_of_engines_on_any_host(g, engines):
    assert kc.plan_devices(GPUS[g], engines, "cpu") == ([], "")
    gpus, notice = kc.plan_devices(GPUS[g], engines, "auto")
    if 0 < g < engines:                     # too few GPUs: CPU, and a one-line notice says so and what to do
        assert gpus == [] and "\n" not in notice and f"{engines} engines per host but {g} GPU(s)" in notice
        assert "share_gpus=True" in notice
    else:                                   # enough GPUs: one each; no GPU at all: CPU, nothing to say
        assert gpus == GPUS[g] and notice == ""


@pytest.mark.parametrize("g", sorted(GPUS))
@pytest.mark.parametrize("engines", [1, 2, 4, 5])
def test_gpu_work_gets_one_gpu_per_local_rank_or_a_clear_error(g, engines):
    if g == 0:
        with pytest.raises(kc.ClusterError, match="no GPU is visible.*devices='cpu'"):
            kc.plan_devices(GPUS[g], engines, "gpu", share_gpus=True)
    elif engines > g:
        with pytest.raises(kc.ClusterError, match=f"{engines} engines per host but only {g} GPU.*share_gpus=True"):
            kc.plan_devices(GPUS[g], engines, "gpu")
        assert kc.plan_devices(GPUS[g], engines, "gpu", share_gpus=True) == (GPUS[g], "")
    else:
        gpus, _ = kc.plan_devices(GPUS[g], engines, "gpu")
        slots = kc.assign_slots({e: "h" for e in range(engines)})
        seen = [kc.engine_env(slots[e], gpus=gpus, threads=1, timeout=30)["CUDA_VISIBLE_DEVICES"]
                for e in range(engines)]
        assert seen == GPUS[g][:engines]    # a different GPU for each local rank


def test_shared_gpus_are_dealt_round_robin():
    slots = kc.assign_slots({e: "h" for e in range(5)})
    gpus, _ = kc.plan_devices(["0", "1"], 5, "gpu", share_gpus=True)
    assert [kc.engine_env(slots[e], gpus=gpus, threads=1, timeout=30)["CUDA_VISIBLE_DEVICES"]
            for e in range(5)] == ["0", "1", "0", "1", "0"]


def test_bad_devices_value_says_what_is_allowed():
    with pytest.raises(ValueError, match="devices must be one of 'auto', 'cpu', 'gpu'"):
        kc.plan_devices([], 2, "cuda")


def test_start_refuses_gpu_work_on_too_few_gpus_before_starting_anything(no_leaks, monkeypatch):
    monkeypatch.setattr(kit.sysinfo, "visible_gpus", lambda: ["0"])
    before = descendants()
    with pytest.raises(kc.ClusterError, match="2 engines per host but only 1 GPU.*share_gpus=True"):
        kc.start(2, "gloo", devices="gpu")
    assert descendants() == before


# ------------------------------------------------------------------ launchers: one class per way, one dispatch
def test_a_new_launcher_is_one_entry_in_LAUNCHERS(no_leaks, monkeypatch):
    class Refuses(kc.launchers.Launcher):
        name = "refuses"

        def check(self):
            raise kc.ClusterError("the refuses launcher cannot run here")
    monkeypatch.setitem(kc.LAUNCHERS, "refuses", Refuses)
    with pytest.raises(kc.ClusterError, match="refuses launcher cannot run"):
        kc.start(2, "refuses")
    assert isinstance(kc.launcher("gloo"), kc.launchers.GlooLauncher)
    assert isinstance(kc.launcher("mpi"), kc.launchers.MPILauncher)


def test_mpi_launcher_orders_engines_by_mpi_rank_and_checks_the_slots():
    mpi = kc.launcher("mpi")
    swapped = {0: {"host": "h", "mpi": {"rank": 1}}, 1: {"host": "h", "mpi": {"rank": 0}}}
    assert mpi.rank_order(swapped) == [1, 0]
    slots = kc.assign_slots({0: "h", 1: "h"})
    mpi.check_slots(slots, {0: {"mpi": {"rank": 0}}, 1: {"mpi": {"rank": 1}}})   # Horovod rank == MPI rank
    with pytest.raises(kc.ClusterError, match="unexpected order"):
        mpi.check_slots(slots, swapped)     # the slots would give Horovod ranks other than MPI's
    kc.launcher("gloo").check_slots(slots, swapped)   # Gloo: the kit gives the ranks, nothing to disagree with


# ------------------------------------------------------------------ real jobs
def _hvd_torch():
    import horovod.torch as hvd
    import torch
    hvd.init()
    return hvd.rank(), hvd.size(), hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()


def _hvd_keras():
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf
    hvd.init()
    return hvd.rank(), hvd.size(), float(hvd.allreduce(tf.constant([hvd.rank() + 1.0]), op=hvd.Sum).numpy()[0])


def _torch_dist():
    import torch
    import torch.distributed as dist
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def _threads():
    import os
    return os.environ["OMP_NUM_THREADS"], os.environ["CUDA_VISIBLE_DEVICES"]


# Two engines with each backend run in notebook 00 on every `make test` (in the browser test, or under nbval where
# that cannot run): the same Horovod (PyTorch, Keras) and torch.distributed sums. Here the job is 4 engines, which
# also checks the rank order, the thread split, that every server listens on loopback, and that an exception
# inside the with block stops everything (no_leaks).
@pytest.mark.timeout(600)   # starts engines: minutes on a busy 2-core machine
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
@pytest.mark.engines
def test_one_job_of_four_for_horovod_torch_keras_and_torch_distributed_on_loopback(no_leaks, backend):
    n = 4
    want = [(r, n, n * (n + 1) / 2) for r in range(n)]
    with pytest.raises(ZeroDivisionError), kc.start(n, backend, quiet=True) as c:
        importable(c)
        assert c.size == n and c.view.targets == list(range(n))
        assert [c.rank_of(e) for e in c.view.targets] == list(range(n))
        assert c.wait(c.view.apply_async(_hvd_torch)) == want      # c.wait: a death is named, with its last words
        assert c.wait(c.view.apply_async(_hvd_keras)) == want
        assert c.init_process_group() == {r: r for r in range(n)}
        assert c.view.apply_sync(_torch_dist) == want
        threads = str(max(1, kit.env.cpu_cores() // n))             # cores split evenly between the engines
        cuda = [c.gpus[r % len(c.gpus)] if c.gpus else "" for r in range(n)]   # the device plan, whatever the host
        assert c.view.apply_sync(_threads) == list(zip([threads] * n, cuda))
        assert_listening_on_loopback_only(backend)
        controller = [p.cmdline() for p in psutil.Process().children(recursive=True)
                      if "ipyparallel.controller" in p.cmdline()]
        assert controller and set(kc.launchers.HEARTBEAT) <= set(controller[0]), controller   # beats every 1 s
        1 / 0                                                       # the with block ends by an exception
    with pytest.raises(kc.ClusterStoppedError, match="was stopped at .*start a new one with kit.cluster.start"):
        c.client


def assert_listening_on_loopback_only(backend):
    """The controller, the rendezvous and gloo's listeners bind 127.0.0.1 only."""
    pids = {os.getpid(), *descendants()}
    listening = [(x.laddr.ip, psutil.Process(x.pid).name()) for x in psutil.net_connections("inet")
                 if x.status == psutil.CONN_LISTEN and x.pid in pids]
    assert listening, "expected the controller, rendezvous and gloo listeners"
    wild = {(ip, name) for ip, name in listening if ip not in ("127.0.0.1", "::1")}
    # mpi: the ranks talk through shared memory (no TCP transport, no listener); Open MPI 5.0.x's mpiexec
    # (prterun) binds every address whatever its settings say (open-mpi/ompi#14441), so the kit preloads
    # kit.cluster.loopback into it (tests/test_mpi_listeners.py)
    assert not wild, listening


def _allreduce_forever():
    import time
    import horovod.torch as hvd
    import torch
    t0, i = time.time(), 0
    while time.time() - t0 < 300:
        hvd.allreduce(torch.ones(10_000), name=f"loop.{i}")
        i += 1


@pytest.mark.timeout(600)   # starts engines: minutes on a busy 2-core machine
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
@pytest.mark.engines
def test_killed_engine_raises_naming_the_rank_then_restart_works(no_leaks, backend):
    """mpi: rank 1 SIGKILLed. gloo: rank 1 aborts (SIGABRT, as a C++ exception nobody catches in a framework ends),
    and the error quotes what the engine's fault handler wrote (gloo engines have an output file each)."""
    timeout = 20
    c = importable(kc.start(2, backend, timeout=timeout, quiet=True))
    try:
        ar = c.view.apply_async(_allreduce_forever)
        time.sleep(2)
        assert not ar.ready()
        os.kill(c._pids[1], signal.SIGABRT if backend == "gloo" else signal.SIGKILL)
        t0 = time.monotonic()
        # the engine's last lines; Horovod may have warned before (a response evicted from its cache, seen once)
        report = r"its last output:\n(    .*\n)*?    Fatal Python error: Aborted\n    (Current t|T)hread 0x.*"
        said = report if backend == "gloo" else ""
        with pytest.raises(kc.RankDiedError, match=rf"(?s)rank 1 died .*{said}cluster.restart\(\)"):
            c.wait(ar)
        assert time.monotonic() - t0 < timeout
        importable(c.restart())
        assert c.view.apply_sync(_hvd_torch) == [(0, 2, 3.0), (1, 2, 3.0)]
    finally:
        c.stop()


@pytest.mark.timeout(600)   # starts engines: minutes on a busy 2-core machine
@pytest.mark.engines
def test_kernel_exit_without_stop_leaves_nothing_running(tmp_path):
    script = textwrap.dedent("""
        import kit.cluster
        c = kit.cluster.start(2, "gloo", quiet=True)
        print(c._profile, flush=True)
        # no c.stop(): the interpreter exits, as a kernel does on shutdown
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    profile = out.stdout.strip().splitlines()[-1]
    assert profile.startswith(("/tmp", os.environ.get("TMPDIR", "/tmp")))
    deadline = time.time() + 15
    while time.time() < deadline:
        left = [p for p in psutil.process_iter(["cmdline", "environ"]) if _mentions(p, profile)]
        if not left:
            break
        time.sleep(0.5)
    assert not left, [p.info["cmdline"] for p in left]


def _mentions(p, text):
    try:
        return text in " ".join(p.info["cmdline"] or []) or text in str((p.info["environ"] or {}).values())
    except psutil.Error:
        return False


def test_engines_on_one_machine_split_its_cores_whatever_hosts_they_name():
    from kit.cluster.devices import threads_per_engine
    lab = {e: {"host": f"h{e + 1}", "cores": 2, "machine": "box"} for e in range(3)}    # 3 lab hosts, one 2-core box
    assert threads_per_engine(lab) == 1
    real = {e: {"host": f"node{e // 2}", "cores": 16, "machine": f"m{e // 2}"} for e in range(4)}  # 2 per machine
    assert threads_per_engine(real) == 8
    mixed = {**real, 9: {"host": "small", "cores": 4, "machine": "s"}}
    assert threads_per_engine(mixed) == 4                       # the smallest share: one setting for the job
    many = {e: {"host": "a", "cores": 2, "machine": "box"} for e in range(8)}
    assert threads_per_engine(many) == 1                        # never 0
    from kit.cluster.engines import engine_identity
    me = engine_identity()
    assert me["cores"] == kit.env.cpu_cores() and me["machine"] == kit.env.machine_id() != ""



def _fault(current: int) -> str:
    """An engine's output after a crash: an ipyparallel log line, C++'s words, the fault handler's report with
    three threads (zmq's, a waiting one, the main thread, listed last as Python lists it); `current`: which of the
    three (0, 1, 2) took the signal."""
    stacks = ['  File "/venv/zmq/sugar/attrsettr.py", line 60 in _get_attr_opt',
              '  File "/venv/threading.py", line 320 in wait',
              '  File "<task>", line 3 in scatter_reduce\n  File "<task>", line 9 in _ring']
    threads = [f"{'Current thread' if i == current else 'Thread'} 0x7f0{i} (most recent call first):\n{stack}\n"
               for i, stack in enumerate(stacks)]
    return ("2026-12-06 22:00:00.123 [IPEngine.0] a log line\n"
            "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
            "Fatal Python error: Segmentation fault\n\n" + "\n".join(threads))


def test_a_crash_quotes_the_crashing_thread_and_the_main_thread_when_another_thread_took_the_signal(tmp_path):
    from kit.cluster import engines
    path = tmp_path / "engine.out"
    path.write_text(_fault(current=2))      # the main thread took the signal (Gloo's abort): its stack alone
    said = engines.last_output(str(path))
    assert "gloo::EnforceNotMet" in said and "Segmentation fault" in said and "IPEngine" not in said, said
    assert "scatter_reduce" in said and "_get_attr_opt" not in said and "in wait" not in said, said
    path.write_text(_fault(current=0))      # zmq's thread took it (a heap Gloo overran): that thread, then main's
    said = engines.last_output(str(path))
    assert said.index("_get_attr_opt") < said.index("scatter_reduce") and "in wait" not in said, said
