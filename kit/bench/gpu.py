"""The GPU numbers (docs/benchmarks/gpu.md): `python -m kit.bench gpu` on a GPU host (scripts/gpu_check.sh runs it).

Three measurements, each the GPU side of a lesson:
- host -> GPU copies from pageable and from pinned memory (why `pin_memory=True`; notebook 01);
- notebook 01's loader sweep on the GPU, with and without `pin_memory`, and the GPU's utilisation as NVML
  reports it (the article's 0% <-> 90%: the GPU waits for the CPU's loading);
- a 64 MB allreduce between 2 engines: over NCCL (one GPU per engine where there are two; on a one-GPU host NCCL
  refuses two ranks on one GPU, NVIDIA/nccl#418, and the refusal is recorded) and over Gloo on CUDA tensors with
  the engines sharing the GPU (what the kit's `share_gpus=True` gives a one-GPU laptop).
"""
from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path

from kit import cluster
from kit import data
from kit import sysinfo
from kit.data import lesson
from kit.env import cpu_cores


def copy_rates(mib: int = 64, reps: int = 10, rounds: int = 5) -> dict:
    """Return host -> GPU copy GB/s from pageable and pinned memory (median of `rounds` x `reps` copies)."""
    import torch
    n = mib * 2**20
    src = {"pageable": torch.empty(n, dtype=torch.uint8), "pinned": torch.empty(n, dtype=torch.uint8).pin_memory()}
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")

    def once(t):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        return reps * n / (time.perf_counter() - t0) / 1e9

    for t in src.values():
        once(t)                                             # warm-up (allocations, driver)
    return {k: statistics.median(once(t) for _ in range(rounds)) for k, t in src.items()}


def loader_sweep(workers=None, steps: int = 30, rounds: int = 2) -> dict:
    """Notebook 01's sweep on the GPU, pin_memory off and on: {"width": the model's, "t_load_ms", "t_step_ms",
    "steps", pin: {W: stats incl. NVML gpu_util}}. The model is sized as notebook 01 sizes it on a GPU
    (`kit.data.lesson.size_step`: its step most of a batch's loading); workers up to the core count; each setting
    runs long enough for NVML's averaged readings (`kit.data.lesson.steps_for_nvml`)."""
    _, dataset, _ = data.setup(steps)
    width, t_step, t_load = lesson.size_model(dataset, data.DEFAULT["batch_size"], sync=data.sync_fn())
    if (longer := lesson.steps_for_nvml(t_step, steps)) > steps:   # the data set holds `steps` batches: a bigger one
        steps = longer
        _, dataset, _ = data.setup(steps)
    step = data.make_step(data.make_model(width))           # the step trains on cuda where it is available
    out = {"width": width, "t_load_ms": 1e3 * t_load, "t_step_ms": 1e3 * t_step, "steps": steps}
    for pin in (False, True):
        mons = data.sweep(dataset, step, workers or lesson.worker_counts(cpu_cores()), steps, rounds=rounds,
                          pin_memory=pin)
        out[pin] = {w: m.stats() for w, m in mons.items()}
    return out


def _allreduce_cuda(mb: int, reps: int) -> dict:
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(0)
    t = torch.ones(mb * 2**20 // 4, device="cuda")
    dist.all_reduce(t)                                      # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "backend": dist.get_backend()}


def allreduce(backend: str, mb: int = 64, reps: int = 10, n: int = 2) -> dict:
    """2 engines allreduce `mb` MB of CUDA floats over `backend`; bus bandwidth as nccl-tests reports it."""
    share = backend == "gloo" or len(sysinfo.gpus()) < n
    if importlib.util.find_spec("horovod") is None:       # kit.cluster's Gloo rendezvous is Horovod's
        return {"backend": backend, "shared_gpu": share, "error": "not run: Horovod is not installed here "
                "(kit.cluster starts its engines with Horovod's rendezvous; scripts/gpu_check.sh builds it)"}
    try:
        with cluster.start(n=n, backend="gloo", devices="gpu", share_gpus=share, timeout=60, quiet=True) as c:
            c.init_process_group(backend)
            r = c.wait(c.view.apply_async(_allreduce_cuda, mb, reps))[0]
    except Exception as e:                                  # NCCL's refusal of two ranks on one GPU, recorded
        lines = [ln for ln in str(e).splitlines() if "Duplicate GPU" in ln or "Error" in ln] or [repr(e)]
        return {"backend": backend, "shared_gpu": share, "error": lines[0].strip()[:300]}
    size = mb * 2**20
    return {"backend": backend, "shared_gpu": share, "mb": mb, "seconds": r["seconds"],
            "algbw_gbps": size / r["seconds"] / 1e9, "busbw_gbps": 2 * (n - 1) / n * size / r["seconds"] / 1e9}


def bench(out_dir: Path, quick: bool) -> tuple[dict, str]:
    """Measure copies, the loader sweep and the allreduces; return (result, summary)."""
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("kit.bench gpu: no CUDA GPU visible to this PyTorch: run it on a GPU host "
                         "(scripts/gpu_check.sh runs it there with KIT_GPU_CHECK_BENCH=DIR)")
    gpu = torch.cuda.get_device_name(0)
    copies = copy_rates()
    sized = loader_sweep(workers=(0, 2, 4) if quick else None, steps=20 if quick else 30)
    sweep = {pin: sized[pin] for pin in (False, True)}
    ars = [allreduce("nccl"), allreduce("gloo")]
    best = {pin: max(s, key=lambda w: s[w]["samples_per_s"]) for pin, s in sweep.items()}
    util = {pin: (s[0].get("gpu_util"), best[pin], s[best[pin]].get("gpu_util")) for pin, s in sweep.items()}
    up = sweep[True][best[True]]["samples_per_s"] / sweep[True][0]["samples_per_s"]
    bw = "; ".join(f"{a['backend']}: " + (f"{a['busbw_gbps']:.1f} GB/s busbw" if "error" not in a
                                                  else "not run (no Horovod)" if a["error"].startswith("not run")
                                                  else "refused")
                   for a in ars)
    pct = lambda u: "n/a (no NVML)" if u is None else f"{u:.0f}%"         # noqa: E731
    summary = (f"{gpu}: copy pageable {copies['pageable']:.1f} vs pinned {copies['pinned']:.1f} GB/s; "
               f"CNN width x{sized['width']} (step {sized['t_step_ms']:.1f} ms, a batch's loading "
               f"{sized['t_load_ms']:.1f} ms): NVML util W=0 {pct(util[True][0])} -> W={util[True][1]} "
               f"{pct(util[True][2])}, {up:.1f}x samples/s (pinned); "
               f"64 MB allreduce, 2 engines: {bw}")
    return {"gpu": gpu, "copy_gbps": copies, "sweep": {str(k): v for k, v in sweep.items()}, "steps": sized["steps"],
            "best_workers": {str(k): v for k, v in best.items()}, "allreduce": ars,
            "sizing": {k: sized[k] for k in ("width", "t_load_ms", "t_step_ms")}, "speedup_pinned": up}, summary
