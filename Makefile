# Two commands: `make lab` (set up, then JupyterLab on 127.0.0.1) and `make test` (set up, then every test).
PYTHON_BOOT ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LAB_PORT ?= 8888
# Which PyTorch build: auto (CUDA when an NVIDIA GPU is present, else CPU), cpu or cuda. `make TORCH=cpu setup`.
TORCH ?= auto
PYTEST_ARGS ?=
# Horovod's Keras integration needs tf-keras (Keras 2): chosen before TensorFlow is imported (README).
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: setup lab test test-gpu gpu-present bench clean

setup:
	@PYTHON_BOOT=$(PYTHON_BOOT) VENV=$(VENV) TORCH=$(TORCH) bash scripts/setup_env.sh

lab: setup
	@VENV=$(VENV) LAB_PORT=$(LAB_PORT) bash scripts/lab.sh

test: setup
	$(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env --nbval-cell-timeout=900 $(PYTEST_ARGS) tests notebooks

# The GPU tests (tests/gpu): one engine per GPU, engines sharing a GPU, Horovod and torch.distributed on CUDA
# tensors, NVML during training, the loader sweep with pin_memory. Refuses at once where there is no GPU.
test-gpu: gpu-present setup
	KIT_TEST_GPU=1 $(PY) -m pytest -p no:cacheprovider -q -rs tests/gpu

gpu-present:
	@nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "make test-gpu: no NVIDIA GPU on this machine (nvidia-smi lists none); run it on a GPU host" >&2; exit 1; }

bench: setup
	$(PY) -m kit.bench all

clean:
	rm -rf $(VENV) .pytest_cache
