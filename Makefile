# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both run the one idempotent setup first (scripts/setup.sh): on a ready machine it takes seconds.
SHELL := /bin/bash
VENV ?= $(or $(AMLEMU_VENV),$(CURDIR)/.venv)
CACHE ?= $(or $(AMLEMU_CACHE),$(HOME)/.cache/amlemu)
PY := $(VENV)/bin/python
export AMLEMU_VENV := $(VENV)
export AMLEMU_CACHE := $(CACHE)

.PHONY: setup demo test

setup:
	bash scripts/setup.sh

# The Horovod MNIST job with 2 ranks under plain mpirun, on the real MNIST, in a fresh folder
# (its ./outputs and MLflow store land there). As root Open MPI needs --allow-run-as-root.
demo: setup
	@run=$(CURDIR)/build/demo/$$(date +%Y%m%d-%H%M%S); mkdir -p $$run; cd $$run; \
	echo "run folder: $$run"; \
	mpirun -np 2 $$( [ "$$(id -u)" = 0 ] && echo --allow-run-as-root ) \
	  --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
	  $(PY) $(CURDIR)/trainer/train.py --data-dir $(CACHE)/data/mnist

test: setup
	$(PY) -m pytest
