# Two entry points: `make run` (the main job) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
NPROC  ?= $(shell nproc)

.PHONY: install install-test run test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(VENV)/bin/pyxccl run -n 4 -- $(PY) -m pyxccl.demo

test: install-test
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
