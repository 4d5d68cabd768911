"""GPU tests: collected only by `make test-gpu` (KIT_TEST_GPU=1), which refuses at once without a GPU.

`make test` (CPU machines, CI) never collects this folder; scripts/gpu_check.sh runs it on an offline GPU
machine with a PyTorch-only Horovod (no TensorFlow there), so nothing here imports TensorFlow.
"""
import os
import subprocess

import pytest

ENABLED = os.environ.get("KIT_TEST_GPU") == "1"


def pytest_ignore_collect(collection_path, config):
    return None if ENABLED else True


def gpu_names() -> list[str]:
    """The GPUs nvidia-smi lists ([] when there is no driver or no GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.splitlines() if line.startswith("GPU")]


def pytest_configure(config):
    if ENABLED and not gpu_names():
        pytest.exit("make test-gpu: no NVIDIA GPU on this machine (nvidia-smi lists none); run it on a GPU host",
                    returncode=3)


@pytest.fixture(scope="session")
def n_gpus() -> int:
    import torch
    assert torch.cuda.is_available(), "nvidia-smi lists a GPU but this PyTorch cannot use it (a CPU build?)"
    return torch.cuda.device_count()
