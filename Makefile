# Two commands: `make lab` (set up, then JupyterLab on 127.0.0.1) and `make test` (set up, then every test).
PYTHON_BOOT ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LAB_PORT ?= 8888
# Which PyTorch build: auto (CUDA when an NVIDIA GPU is present, else CPU), cpu or cuda. `make TORCH=cpu setup`.
TORCH ?= auto
PYTEST_ARGS ?=
# `make test` runs on this many pytest-xdist workers (each file, notebook, and the lab tests together, on one
# worker; docs/testing.md). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
# Horovod's Keras integration needs tf-keras (Keras 2): chosen before TensorFlow is imported (docs/install.md).
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: setup lab test test-fast lint test-gpu gpu-present bench docs book clean

setup:
	@PYTHON_BOOT=$(PYTHON_BOOT) VENV=$(VENV) TORCH=$(TORCH) bash scripts/setup_env.sh

lab: setup
	@VENV=$(VENV) LAB_PORT=$(LAB_PORT) bash scripts/lab.sh

# Every tier this machine can run (docs/testing.md): unit tests, the linter, engines, the lab (as root), the browser
# test, every notebook (nbval). The slowest 25 tests are listed at the end.
test: setup
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=25 \
		--nbval-lax --nbval-current-env --nbval-cell-timeout=900 $(PYTEST_ARGS) tests notebooks

# For editing and before every commit: the linter, then every test without a tier marker (docs/testing.md), each
# under the guard that fails it if it starts a process, engines, a lab or a browser.
test-fast: setup
	$(PY) -m ruff check kit tests scripts
	$(PY) -m pytest -p no:cacheprovider -q --durations=10 -m "not (engines or lab or browser or notebook or gpu)" \
		$(PYTEST_ARGS) tests

lint: setup
	$(PY) -m ruff check kit tests scripts

# The GPU tests (tests/gpu): one engine per GPU, engines sharing a GPU, Horovod and torch.distributed on CUDA
# tensors, NVML during training, the loader sweep with pin_memory. Refuses at once where there is no GPU.
test-gpu: gpu-present setup
	KIT_TEST_GPU=1 $(PY) -m pytest -p no:cacheprovider -q -rs tests/gpu

gpu-present:
	@nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "make test-gpu: no NVIDIA GPU on this machine (nvidia-smi lists none); run it on a GPU host" >&2; exit 1; }

bench: setup
	$(PY) -m kit.bench all

# docs/benchmarks/*.md and the README's benchmark lists and results lines, rendered from results/*.json
# (`python -m kit.bench render`; tests/test_packaging.py checks that the committed files are what it writes).
docs: setup
	$(PY) -m kit.bench render

# The book: every notebook (their committed outputs; nothing is executed), the README and docs/ as a static site
# in book/_build/html, offline (Sphinx + MyST-NB, book/conf.py). Open book/_build/html/index.html.
book: setup
	$(PY) book/build.py

# What the build makes: the venv (Horovod built inside it), the package's metadata, caches, benchmark scratch.
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
	find kit tests scripts -name __pycache__ -type d -prune -exec rm -rf {} +
