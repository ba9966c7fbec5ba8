# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both run the one idempotent setup first (scripts/setup.sh): on a ready machine it takes seconds.
SHELL := /bin/bash
VENV ?= $(or $(AMLEMU_VENV),$(CURDIR)/.venv)
CACHE ?= $(or $(AMLEMU_CACHE),$(HOME)/.cache/amlemu)
PY := $(VENV)/bin/python
export AMLEMU_VENV := $(VENV)
export AMLEMU_CACHE := $(CACHE)

.PHONY: setup demo test test-full gpu-check constraints

setup:
	bash scripts/setup.sh

# The seed's job on the emulated cluster: compute gpucluster (trainer/compute.yml: STANDARD_NC6,
# low priority, max 2 nodes) gets 2 nodes, the platform builds mpirun, Horovod MNIST trains on
# the real data, read from workspaceblobstore (Azurite) through each node's blobfuse-style cache.
# Ends with the run's status, test accuracy, and where its outputs and logs are.
AMLEMU := $(VENV)/bin/amlemu
demo: setup
	@$(AMLEMU) compute show -n gpucluster -o none 2>/dev/null || $(AMLEMU) compute create -f trainer/compute.yml
	$(AMLEMU) job create -f trainer/job.yml --stream

# In parallel: 4 workers on 2 cores keep both cores busy (a worker waiting on a node, a job or a
# server leaves its core to another; TEST_WORKERS=0 runs it in one process). The tests that train
# share one worker, in turn (loadgroup; tests/conftest.py says why); the slowest tests are listed.
# `make test` (CI) leaves out the runs marked `full`: the full MNIST's 95% on the seed's docker
# nodes, 100 jobs under random faults (it runs them on 2,000 images and 20 jobs), the examples' MNIST to 90%
# (it runs the other examples), and three trainings
# it already does on another path; `make test-full` runs everything.
TEST_WORKERS ?= 4
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25
# amlemu's bytecode, written first: where PYTHONDONTWRITEBYTECODE is set (as on the sandboxes that run
# it), each of the suite's processes (CLI calls, jobs' supervisors, services) compiled it from source.
PRECOMPILE := $(PY) -m compileall -q emulator fixtures
test: setup
	$(PRECOMPILE)
	$(PYTEST) -m "not full"

test-full: setup
	$(PRECOMPILE)
	$(PYTEST)

# On a machine with NVIDIA GPUs: installs the CUDA stack (setup, Horovod with NCCL) and checks the
# GPU path (scripts/gpu_check.sh); one report line per check. Without a GPU it stops at once (exit 2).
gpu-check:
	bash scripts/gpu_check.sh

# After changing pyproject.toml's dependencies: the venv's versions (less amlemu itself and the
# horovod built here) become the set scripts/setup.sh installs; then run the suite on them.
constraints:
	{ grep '^#' scripts/constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^horovod ' | sort -f; } \
		>scripts/constraints.txt.new && mv scripts/constraints.txt.new scripts/constraints.txt
