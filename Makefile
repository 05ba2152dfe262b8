# Two entry points: `make run` (the main job) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
NPROC  ?= $(shell nproc)

.PHONY: install install-test bytecode run test test-fast asan peers clean

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

# The C helpers built with AddressSanitizer (in build/asan, beside a copy of the package: the installed
# ones are left alone), then the tests that run them, ranks included (they inherit PYTHONPATH and the
# preload; libstdc++ too, for the C++ exceptions of other extensions). A memory error aborts its process,
# so its test fails, and ASan's report is printed from build/asan/report.* (about 8 minutes). Segfaults
# are left to the tests (handle_segv=0): some kill a rank with SIGSEGV on purpose.
ASAN_TESTS ?= tests/test_executors.py tests/test_prepared.py tests/test_persistent.py tests/test_call_forms.py \
	tests/test_floor.py tests/test_collectives.py tests/test_buffers.py tests/test_compress.py tests/test_sim_core.py \
	tests/test_tuner_cache.py tests/test_tuner_fold.py tests/test_tuner_symmetry.py tests/test_tuner_bound.py
asan: install-test
	rm -rf build/asan build/asan-tmp && mkdir -p build/asan
	cp -r src/pyxccl build/asan/ && find build/asan \( -name '*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +
	CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g" LDFLAGS="-fsanitize=address" \
		$(PY) setup.py -q build_ext --build-lib build/asan --build-temp build/asan-tmp
	export LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
		ASAN_OPTIONS=detect_leaks=0:handle_segv=0:log_path=$(CURDIR)/build/asan/report PYTHONPATH=$(CURDIR)/build/asan; \
	$(PY) -c 'import pyxccl._native as a, pyxccl._kernels as b, pyxccl.tuning._simcore as c; \
		assert all("/build/asan/" in m.__file__ for m in (a, b, c)), "not the ASan build"' && \
	$(PY) -m pytest -q -p no:cacheprovider $(ASAN_TESTS); rc=$$?; \
		if ls build/asan/report.* >/dev/null 2>&1; then cat build/asan/report.*; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) build src/*.egg-info src/pyxccl/*.so src/pyxccl/sim/*.so src/pyxccl/tuning/*.so
	find src -name __pycache__ -prune -exec rm -rf {} +
