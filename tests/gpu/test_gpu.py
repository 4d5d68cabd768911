"""What the kit teaches, on a real GPU (make test-gpu; scripts/gpu_check.sh on an offline GPU machine).

Written against the kit's device policy (kit.cluster devices="gpu", share_gpus) and checked here only as far as a
CPU machine allows (the folder refuses without a GPU). Nothing here imports TensorFlow.
"""
import os
import time

import numpy as np
import pytest

import kit

pytestmark = [pytest.mark.gpu, pytest.mark.engines, pytest.mark.timeout(600)]     # engines on the GPUs
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(**kwargs):
    """kit.cluster.start, and let the engines import this module (gpu.test_gpu: ipyparallel sends a function by
    reference to its module, so the engines need tests/ on their path; without it: "No module named 'gpu'")."""
    c = kit.cluster.start(backend="gloo", quiet=True, **kwargs)
    try:
        c.view.execute(f"import sys; sys.path.insert(0, {TESTS!r})", block=True)
    except BaseException:
        c.stop()
        raise
    return c


# --- engines and GPUs ------------------------------------------------------------------------------------------
def _engine_gpu():
    import os
    import torch
    torch.cuda.set_device(0)                  # inside an engine the one visible GPU is device 0
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count(),
            "name": torch.cuda.get_device_name(0)}


def test_one_engine_per_gpu(n_gpus, no_leaks):
    n = min(n_gpus, 4)
    with start(n=n, devices="gpu") as c:
        seen = c.view.apply_sync(_engine_gpu)
    assert [s["count"] for s in seen] == [1] * n, seen              # each engine sees exactly one GPU
    assert len({s["visible"] for s in seen}) == n, seen            # and a different one


def test_engines_share_one_gpu_when_asked(n_gpus, no_leaks):
    n = n_gpus + 1                                                   # more engines than GPUs
    with pytest.raises(kit.cluster.ClusterError, match="share_gpus"):
        kit.cluster.start(n=n, backend="gloo", devices="gpu", quiet=True)
    with start(n=n, devices="gpu", share_gpus=True) as c:
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
    with start(n=n, devices="gpu") as c:
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
    kit.comm.ring.allreduce(t)
    return t.cpu().numpy(), x


def test_torch_distributed_ring_on_cuda_tensors(n_gpus, no_leaks):
    """Notebook 03's ring over NCCL (one GPU per rank) on CUDA tensors == numpy's sum."""
    if n_gpus < 2:   # a hardware limit, not a missing package: NCCL >= 2.5 refuses it (NVIDIA/nccl#418)
        pytest.skip("needs 2 GPUs: NCCL refuses two ranks on one GPU; kit.bench gpu records the refusal")
    with start(n=2, devices="gpu") as c:
        c.init_process_group("nccl")
        res = c.view.apply_sync(_dist_ring_cuda, 262_147, 7)
    total = sum(x for _, x in res)
    for got, _ in res:
        np.testing.assert_allclose(got, total, rtol=1e-5, atol=1e-5)


# --- NVML while training, and the loader sweep with pin_memory -------------------------------------------------
def test_nvml_monitor_sees_utilisation_and_memory_move():
    import torch
    from kit.data.monitor import Monitor
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(512, 4096, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    with Monitor(warmup=1, sample_s=0.02, sync=torch.cuda.synchronize) as mon:
        time.sleep(1.0)                                           # idle first: utilisation near 0
        big = []
        for _ in range(4):                                        # NVML averages over ~1/6-1 s: train for seconds
            big.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))   # +256 MiB
            t_end = time.perf_counter() + 0.75
            while time.perf_counter() < t_end:
                t0 = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                torch.cuda.synchronize()
                mon.record(0.0, time.perf_counter() - t0, samples=len(x))
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
    _, dataset, _ = data.setup(steps=20)
    step = data.make_step(data.make_model(), device="cuda")
    for pin in (False, True):
        mons = data.sweep(dataset, step, workers=(0, 2), steps=20, pin_memory=pin)
        busy = {w: m.stats()["busy"] for w, m in mons.items()}
        print(f"pin_memory={pin}: busy by workers {busy}")
        assert all(0 < b <= 1 for b in busy.values()), busy


def test_notebook_01_sized_for_the_gpu_starves_with_no_workers_and_is_fed_with_them():
    """Issue #22's GPU point, on notebook 01's workload as sized for this GPU (`kit.data.lesson.size_step`): NVML
    utilization at most 50% with loading in the loop, at least 80% at the best num_workers, 1.5x the samples/s."""
    from kit.bench.gpu import loader_sweep
    s = loader_sweep(steps=30, rounds=1)
    pinned = s[True]
    best = max(pinned, key=lambda w: pinned[w]["samples_per_s"])
    print(f"width x{s['width']}, step {s['t_step_ms']:.1f} ms, a batch's loading {s['t_load_ms']:.1f} ms; "
          + ", ".join(f"W={w}: {r['samples_per_s']:.0f}/s NVML {r.get('gpu_util')}%" for w, r in pinned.items()))
    assert pinned[0]["gpu_util"] <= 50 and pinned[best]["gpu_util"] >= 80, pinned
    assert pinned[best]["samples_per_s"] >= 1.5 * pinned[0]["samples_per_s"], pinned


# --- the PyTorch half of notebook 04 (appendix 04a) on the GPU -------------------------------------------------
def _torch_mnist_epoch(n_samples, seed):
    import hashlib
    import horovod.torch as hvd
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    from kit import mnist
    hvd.init()                                                               # Horovod (1)
    torch.cuda.set_device(0)                                                 # Horovod (2): my GPU is device 0 here
    g = torch.Generator().manual_seed(seed)                                  # MNIST-shaped data, same on every rank
    train_set = TensorDataset(torch.rand(n_samples, 1, 28, 28, generator=g),
                              torch.randint(0, 10, (n_samples,), generator=g))
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())   # Horovod: shard
    loader = DataLoader(train_set, batch_size=mnist.BATCH, sampler=sampler, pin_memory=True)
    torch.manual_seed(hvd.rank())                                            # different init: broadcast fixes it
    net = mnist.torch_model().cuda()
    optimizer = torch.optim.Adadelta(net.parameters(), lr=1.0 * hvd.size())  # Horovod (3): the article's Adadelta
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)                  # Horovod (5)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=net.named_parameters())
    net.eval()                                                               # no dropout: replicas must match
    losses = []
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xb.cuda(non_blocking=True)), yb.cuda(non_blocking=True))
        loss.backward()                                                      # allreduce of CUDA gradients
        optimizer.step()
        losses.append(loss.item())
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in net.parameters())).hexdigest()
    return {"device": next(net.parameters()).device.type, "losses": losses, "digest": digest,
            "nccl": bool(hvd.nccl_built())}


def test_notebook_04_pytorch_half_on_gpu(n_gpus, no_leaks):
    """Appendix 04a's Horovod PyTorch loop on CUDA tensors: it trains and every replica ends identical.
    One engine per GPU (up to 2): Horovod's NCCL, like NCCL itself, refuses two ranks on one GPU."""
    n = 2 if n_gpus >= 2 else 1
    with start(n=n, devices="gpu") as c:
        out = c.wait(c.view.apply_async(_torch_mnist_epoch, 2048, 0))
    assert all(o["device"] == "cuda" for o in out), out
    assert len({o["digest"] for o in out}) == 1, "replicas differ after training"
    losses = out[0]["losses"]
    assert len(losses) == 2048 // (128 * n) and all(np.isfinite(losses)), losses
