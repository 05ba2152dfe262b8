# Two entry points: `make run` (the main job) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
NPROC  ?= $(shell nproc)

.PHONY: install install-test bytecode run test test-fast peers clean

$(VENV)/.installed: pyproject.toml setup.py src/pyxccl/_native.c src/pyxccl/_kernels.c src/pyxccl/tuning/_simcore.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# An editable install leaves the sources uncompiled (pip compiles a wheel's at install): without
# bytecode every rank compiles pyxccl at import, 0.1-0.2 s of CPU each, which at 64 ranks on two
# cores is seconds of the job's start. Only changed files are compiled again.
bytecode: $(VENV)/.installed
	$(PY) -m compileall -q src/pyxccl

# The main job: the benchmark of every collective on all local cores.
run: install bytecode
	$(VENV)/bin/pyxccl bench -n $(NPROC) all -b 8 -e 64M -f 8

# Every peer of `pyxccl bench --vs` in one step: the pip extra (gloo through torch, MPICH through mpi4py)
# into the project's venv, then what no extra can bring: Intel MPI, DeepSpeed, oneCCL (scripts/setup_peers.sh).
$(VENV)/.installed-peers: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[peers]'
	touch $@

peers: $(VENV)/.installed-peers
	PYTHON=$(PYTHON) bash scripts/setup_peers.sh all

# The whole suite, then the one-host and collective tests again with the pure-Python executor
# (what runs where pyxccl._native could not be built).
test: install-test bytecode
	$(PY) -m pytest -q --durations=15
	PYXCCL_NATIVE=0 $(PY) -m pytest -q --durations=10 tests/test_prepared.py tests/test_collectives.py tests/test_buffers.py \
		tests/test_call_forms.py \
		tests/test_errors.py tests/test_compress.py -k "not sigkill and not close_leaves and not host_faults"

# The loop while working (under two minutes): everything but the tests marked slow (tests/conftest.py).
test-fast: install-test bytecode
	$(PY) -m pytest -q -x -m "not slow"

clean:
	rm -rf $(VENV) build src/*.egg-info src/pyxccl/*.so src/pyxccl/sim/*.so src/pyxccl/tuning/*.so
	find src -name __pycache__ -prune -exec rm -rf {} +
