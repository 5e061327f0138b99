# Reprieve: every target sets up what it needs (venv, Go-built cluster binaries), cached so reruns are fast.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PYTEST := $(PY) -m pytest
PYTEST_ARGS ?=

.PHONY: all venv tools test test-unit test-integration test-e2e demo cluster bench crds verify lint clean

all: test

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: python3.11 not found; install Python 3.11" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[runtime,operator,dev,bench,emulators,orbax,examples]'
	@rm -f $(VENV)/.installed-* && touch $@

# moto's S3 server pins python-dateutil<3, which the kubernetes client forbids: it gets a venv of its own.
EMU_STAMP := $(VENV)/emulators/.installed
$(EMU_STAMP): $(STAMP)
	@test -x $(VENV)/emulators/bin/python || $(PYTHON) -m venv $(VENV)/emulators
	$(VENV)/emulators/bin/python -m pip install -q 'moto[server]>=5'
	@touch $@

venv: $(STAMP) $(EMU_STAMP)

## tools: build (once, cached under ~/.cache/reprieve) the local control plane, etcd, kubectl and helm
tools:
	@bash hack/build-tools.sh >/dev/null

## test-unit: the quick inner loop (pure logic; no processes, no cluster)
test-unit: venv
	$(PYTEST) -m unit -q $(PYTEST_ARGS)

test-integration: venv tools
	$(PYTEST) -m integration $(PYTEST_ARGS)

test-e2e: venv tools
	$(PYTEST) -m e2e $(PYTEST_ARGS)

## test: every tier, all set-up included
test: venv tools
	$(PYTEST) $(PYTEST_ARGS)

## demo: the main job on the local cluster
demo: venv tools
	$(PY) hack/demo.py

## cluster: a local cluster with 3 nodes until Ctrl-C (prints the KUBECONFIG to use)
cluster: venv tools
	$(PY) -m localcluster up --nodes 3

clean:
	rm -rf $(VENV) .pytest_cache
