"""What the kit teaches, on a real GPU (make test-gpu; scripts/gpu_check.sh on an offline GPU machine).

Written against the kit's device policy (kit.cluster devices="gpu", share_gpus) and checked here only as far as a
CPU machine allows (the folder refuses without a GPU). Nothing here imports TensorFlow.
"""
import os
import time

import numpy as np
import pytest

import kit

pytestmark = pytest.mark.timeout(600)


# --- engines and GPUs ------------------------------------------------------------------------------------------
def _engine_gpu():
    import os
    import torch
    torch.cuda.set_device(0)                  # inside an engine the one visible GPU is device 0
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count(),
            "name": torch.cuda.get_device_name(0)}


def test_one_engine_per_gpu(n_gpus, no_leaks):
    n = min(n_gpus, 4)
    with kit.cluster.start(n=n, backend="gloo", devices="gpu", quiet=True) as c:
        seen = c.view.apply_sync(_engine_gpu)
    assert [s["count"] for s in seen] == [1] * n, seen              # each engine sees exactly one GPU
    assert len({s["visible"] for s in seen}) == n, seen            # and a different one


def test_engines_share_one_gpu_when_asked(n_gpus, no_leaks):
    n = n_gpus + 1                                                   # more engines than GPUs
    with pytest.raises(kit.cluster.ClusterError, match="share_gpus"):
        kit.cluster.start(n=n, backend="gloo", devices="gpu", quiet=True)
    with kit.cluster.start(n=n, backend="gloo", devices="gpu", share_gpus=True, quiet=True) as c:
        seen = c.view.apply_sync(_engine_gpu)
    assert all(s["count"] == 1 for s in seen), seen
    assert len({s["visible"] for s in seen}) == min(n, n_gpus), seen


# --- collectives on CUDA tensors -------------------------------------------------------------------------------
def _hvd_allreduce_cuda(numel):
    import horovod.torch as hvd
    import torch
    hvd.init()
    torch.cuda.set_device(0)
    t = torch.full((numel,), float(hvd.rank() + 1), device="cuda")
    out = hvd.allreduce(t, op=hvd.Sum, name="gpu_test")
    torch.cuda.synchronize()
    return {"device": out.device.type, "first": float(out[0]), "last": float(out[-1]),
            "nccl": bool(hvd.nccl_built())}


def test_horovod_allreduce_on_cuda_tensors(n_gpus, no_leaks):
    """NCCL where Horovod was built with it (one GPU per rank: NCCL refuses two ranks on one GPU), else Horovod's
    CPU path through host memory, said as a notice."""
    n = 2 if n_gpus >= 2 else 1
    with kit.cluster.start(n=n, backend="gloo", devices="gpu", quiet=True) as c:
        out = c.view.apply_sync(_hvd_allreduce_cuda, 1_000_003)
    want = n * (n + 1) / 2
    assert all(o["device"] == "cuda" and o["first"] == o["last"] == want for o in out), out
    if not out[0]["nccl"]:
        print("notice: this Horovod has no NCCL: CUDA tensors were reduced through host memory")


def _dist_ring_cuda(numel, seed):
    import numpy as np
    import torch
    import torch.distributed as dist
    import kit
    torch.cuda.set_device(0)
    rank = dist.get_rank()
    x = np.random.default_rng(seed + rank).standard_normal(numel).astype(np.float32)
    t = torch.from_numpy(x).cuda()
    kit.ring.allreduce(t)
    return t.cpu().numpy(), x


def test_torch_distributed_ring_on_cuda_tensors(n_gpus, no_leaks):
    """Notebook 03's ring over NCCL (one GPU per rank) on CUDA tensors == numpy's sum."""
    if n_gpus < 2:
        pytest.fail("needs 2 GPUs: NCCL refuses two ranks on one GPU (run on a 2-GPU host)")
    with kit.cluster.start(n=2, backend="gloo", devices="gpu", quiet=True) as c:
        c.init_process_group(backend="nccl")
        res = c.view.apply_sync(_dist_ring_cuda, 262_147, 7)
    total = sum(x for _, x in res)
    for got, _ in res:
        np.testing.assert_allclose(got, total, rtol=1e-5, atol=1e-5)


# --- NVML while training, and the loader sweep with pin_memory -------------------------------------------------
def test_nvml_monitor_sees_utilisation_and_memory_move():
    import torch
    from kit.monitor import Monitor
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(512, 4096, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    with Monitor(warmup=1, sample_s=0.02, sync=torch.cuda.synchronize) as mon:
        time.sleep(0.5)                                           # idle first: utilisation near 0
        big = []
        for i in range(200):
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            torch.cuda.synchronize()
            mon.record(0.0, time.perf_counter() - t0, samples=len(x))
            if i % 50 == 0:
                big.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))   # +256 MiB
    assert mon.has_nvml, "NVML did not open on a GPU host"
    util = [u for _, u, _ in mon.samples]
    mem = [m for _, _, m in mon.samples]
    assert max(util) - min(util) >= 30, util                      # idle → busy
    assert max(mem) - min(mem) >= 0.5, mem                        # ≥ 0.5 GiB more while training


def test_pinned_copies_are_faster_and_the_loader_sweep_runs_on_the_gpu():
    import torch
    from kit import data
    n = 64 * 2**20
    pageable, pinned = torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8).pin_memory()

    def copy_gbps(src):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            src.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        return 10 * n / (time.perf_counter() - t0) / 1e9

    copy_gbps(pinned)
    rates = {"pageable": copy_gbps(pageable), "pinned": copy_gbps(pinned)}
    print("host->GPU copy GB/s:", {k: round(v, 1) for k, v in rates.items()})
    assert rates["pinned"] > rates["pageable"], rates
    dataset, _ = data.setup(steps=20)
    step = data.make_step(data.make_model().cuda(), device="cuda")
    for pin in (False, True):
        mons = data.sweep(dataset, step, workers=(0, 2), steps=20, pin_memory=pin)
        busy = {w: m.stats()["busy"] for w, m in mons.items()}
        print(f"pin_memory={pin}: busy by workers {busy}")
        assert all(0 < b <= 1 for b in busy.values()), busy
