# Shortcuts for the commands in README.md and docs/. `make help` lists them.
PYTHON ?= .venv/bin/python

.PHONY: help install train test test-fast test-core lint check-invariance preflight-tpu train-two-workers

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

install:  ## Create .venv with the CPU and test requirements.
	python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt

train:  ## Train the default (offline digits) experiment.
	$(PYTHON) train.py

test:  ## The whole test suite (what CI runs), in two worker processes (pytest-xdist).
	$(PYTHON) -m pytest -n 2

lint:  ## Ruff, as CI runs it.
	$(dir $(PYTHON))ruff check .

test-fast:  ## Everything but the tests marked slow.
	$(PYTHON) -m pytest -m "not slow" -n 2

test-core:  ## The core's fast tests: a forker's check after an edit (minutes).
	$(PYTHON) -m pytest -m core -n 2

check-invariance:  ## Replica-invariance check of the default config at 1, 2, 4 and 8 replicas.
	$(PYTHON) -m training.replica_invariance --gin_file=configs/default.gin

preflight-tpu:  ## Check every TPU config on this CPU (set BUCKET=gs://... for their DATA_DIR and model_dir).
	@for config in $(filter-out configs/tpu/tpu_base.gin,$(wildcard configs/tpu/*.gin)); do echo "== $$config"; $(PYTHON) train.py --gin_file=$$config --preflight \
	  --gin_param="DATA_DIR='$(BUCKET)/tensorflow_datasets'" --model_dir=$(BUCKET)/runs/preflight || exit $$?; done

train-two-workers:  ## The digits MLP on two local worker processes (MultiWorkerMirroredStrategy).
	$(PYTHON) scripts/launch_local.py --workers 2 -- --gin_file=configs/experiments/digits_mlp.gin --model_dir=runs/two_workers
