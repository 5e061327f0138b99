# Reprieve: every target sets up what it needs (venv, Go-built cluster binaries), cached so reruns are fast.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml operator/pyproject.toml | sha256sum | cut -c1-12)
PYTEST := $(PY) -m pytest
PYTEST_ARGS ?=
# pytest-xdist workers for the tiers that wait on clusters and processes (tests/budget.toml has the budget): the
# real-node tests share one worker (one real-node cluster); the others spread over the rest.
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadgroup

.PHONY: all venv tools kueue images real-tier monitoring-tier release-tier lock test test-jax-range test-unit test-integration test-e2e test-realnodes demo cluster bench crds verify lint clean soak

all: test

$(STAMP): pyproject.toml operator/pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: python3.11 not found; install Python 3.11" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	# Two distributions: the operator (operator/pyproject.toml) and the runtime with the tooling extras.
	$(PY) -m pip install -q -e ./operator -e '.[runtime,dev,bench,emulators,orbax,example,keras]'
	@rm -f $(VENV)/.installed-* && touch $@

# moto's S3 server pins python-dateutil<3, which the kubernetes client forbids: it gets a venv of its own.
EMU_STAMP := $(VENV)/emulators/.installed
$(EMU_STAMP): $(STAMP)
	@test -x $(VENV)/emulators/bin/python || $(PYTHON) -m venv $(VENV)/emulators
	$(VENV)/emulators/bin/python -m pip install -q 'moto[server]>=5'
	@touch $@

venv: $(STAMP) $(EMU_STAMP)

## tools: build (once, cached under ~/.cache/reprieve) the local control plane, kubelet, etcd, kubectl and helm
tools:
	@bash hack/build-tools.sh >/dev/null

## kueue: build (once, cached by version under ~/.cache/reprieve/kueue) Kueue's manager from sigs.k8s.io/kueue,
## with the CRDs and webhook manifests of the same module (before the tests: a build inside a test's timeout
## would fail it)
kueue:
	@bash hack/build-kueue.sh >/dev/null

## images: the real-node tier's Debian packages (apt-get, when missing) and images (Debian base by mmdebstrap,
## pause, operator, example), built once and cached by content hash under ~/.cache/reprieve/images
images:
	@bash hack/build-images.sh >/dev/null

# The same, but a machine that cannot have the real-node tier still runs every other tier: the tests of that
# tier then report NOT RUN with the reason (REPRIEVE_REQUIRE_REAL_NODES=1 turns that into a failure).
real-tier:
	@if [ "$$REPRIEVE_REAL_NODES" = 0 ]; then echo "make: real-node tier turned off (REPRIEVE_REAL_NODES=0)" >&2; \
	else bash hack/build-images.sh >/dev/null || echo "make: the real-node tier cannot be set up on this machine (reason above); its tests will report NOT RUN" >&2; fi

## monitoring-tier: Prometheus for the dashboard test (Debian's package, apt-get when missing; never started as a
## service); without it every other test still runs and the dashboard test reports NOT RUN with the reason
## (REPRIEVE_REQUIRE_PROMETHEUS=1 turns that into a failure)
monitoring-tier:
	@bash hack/install-prometheus.sh >/dev/null || echo "make: Prometheus cannot be installed on this machine (reason above); the dashboard test will report NOT RUN" >&2

## release-tier: the local registry and package index the release tests publish to (Debian's docker-registry with
## apt-get when missing; pypiserver and twine in a venv of their own, and a wheelhouse of the locks' distributions
## that the index serves, under ~/.cache/reprieve); without them those
## tests are skipped with the reason
release-tier:
	@bash hack/install-release-tools.sh --wheelhouse >/dev/null || echo "make: the release tools cannot be installed on this machine (reason above); the release tests will be skipped" >&2

## test-unit: the quick inner loop (pure logic; no processes, no cluster)
test-unit: venv
	$(PYTEST) -m unit -q $(PYTEST_ARGS)

test-integration: venv tools kueue release-tier
	$(PYTEST) -m integration $(XDIST) $(PYTEST_ARGS)

test-e2e: venv tools kueue real-tier monitoring-tier release-tier
	$(PYTEST) -m e2e $(XDIST) $(PYTEST_ARGS)

## test-jax-range: the runtime's tests on the oldest supported JAX (its own venv) and on the newest (the one
## `make venv` resolves); the range is stated in docs/runtime.md
JAX_OLDEST ?= 0.9.0
JAX_VENV := $(VENV)/jax-$(JAX_OLDEST)
JAX_RANGE_TESTS := tests/runtime --ignore=tests/runtime/test_example_lm.py --ignore=tests/runtime/test_orbax_checkpointer.py \
	--ignore=tests/runtime/test_storage_emulators.py --ignore=tests/runtime/test_state_coverage.py \
	--ignore=tests/runtime/test_data_position.py
test-jax-range: venv
	@test -x $(JAX_VENV)/bin/python || $(PYTHON) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/pip install -q -e . "jax==$(JAX_OLDEST)" "jaxlib==$(JAX_OLDEST)" pytest pytest-timeout \
	  ml_dtypes kubernetes pyyaml prometheus-client
	$(JAX_VENV)/bin/python -c "import jax; print('oldest supported: jax', jax.__version__)"
	$(JAX_VENV)/bin/python -m pytest -m "unit or integration" -q $(JAX_RANGE_TESTS) $(PYTEST_ARGS)
	$(PY) -c "import jax; print('newest supported: jax', jax.__version__)"
	$(PYTEST) -m "unit or integration" -q $(JAX_RANGE_TESTS) $(PYTEST_ARGS)

## test-realnodes: only the real-node tier (real kubelets, containerd, images built here)
test-realnodes: venv tools real-tier
	$(PYTEST) -m realnodes $(PYTEST_ARGS)

## test: every tier, all set-up included; lint and verify run beside the tests (their output follows the tests')
test: venv tools kueue real-tier monitoring-tier release-tier
	@mkdir -p .pytest_cache; rm -f .pytest_cache/checks.rc; echo "make lint verify: running beside the tests"
	@{ $(MAKE) --no-print-directory lint verify > .pytest_cache/checks.log 2>&1; echo $$? > .pytest_cache/checks.rc; } & \
	$(PYTEST) $(XDIST) $(PYTEST_ARGS); tests=$$?; wait; \
	echo "--- make lint verify (beside the tests):"; cat .pytest_cache/checks.log; checks=$$(cat .pytest_cache/checks.rc); \
	echo "tests: exit $$tests; lint and verify: exit $$checks"; [ $$tests -eq 0 ] && [ $$checks -eq 0 ]

## demo: the main job on the local cluster (real nodes; DEMO_ARGS=--process-nodes for process kubelets,
## DEMO_ARGS=--real-pulls for cold spot nodes that pull the example image from the cluster's registry)
demo: venv tools real-tier
	$(PY) hack/demo.py $(DEMO_ARGS)

## cluster: a local cluster with 3 nodes until Ctrl-C (prints the KUBECONFIG to use)
cluster: venv tools
	PYTHONPATH=hack $(PY) -m localcluster up --nodes 3

## lint: ruff; mypy of the runtime and operator packages and the chart tooling; helm lint --strict (default
## and namespaced values)
lint: venv tools
	$(VENV)/bin/ruff check operator runtime hack tests benchmarks examples
	$(VENV)/bin/mypy runtime/reprieve operator/reprieve_operator hack/gen_chart_readme.py hack/check_values_schema.py
	@helm="$$(bash hack/build-tools.sh 2>/dev/null | tail -1)/helm"; set -x; \
	  "$$helm" lint --strict charts/reprieve && \
	  "$$helm" lint --strict charts/reprieve --set rbac.namespaced=true --set 'watchNamespaces={team-a,team-b}'

## verify: what is generated is in step: the CRDs (chart and crds/), the chart README, the values schema, the
## image lock files; one version everywhere a release publishes it; the release workflow passes actionlint
verify: venv tools
	$(PY) -m reprieve_operator.crdgen --check
	$(PY) hack/gen_chart_readme.py --check
	$(PY) hack/check_values_schema.py
	$(PY) hack/check_locks.py
	$(PY) hack/release_version.py
	@bin="$$(bash hack/build-tools.sh 2>/dev/null | tail -1)"; set -x; "$$bin/actionlint" .github/workflows/*.yml

## lock: regenerate requirements/*.lock (exact versions with hashes for the images) from the pyprojects
lock: venv
	$(PY) -m uv pip compile operator/pyproject.toml requirements/build.in --generate-hashes --python-version 3.11 \
	  --python-platform linux --custom-compile-command "make lock" -q -o requirements/operator.lock
	$(PY) -m uv pip compile pyproject.toml requirements/build.in --extra runtime --extra example --generate-hashes \
	  --python-version 3.11 --python-platform linux --custom-compile-command "make lock" -q -o requirements/example.lock


clean:
	rm -rf $(VENV) .pytest_cache

## soak: the chaos soak (benchmarks/soak.py, docs/soak.md): 30 minutes of faults on real nodes by default;
## SOAK_ARGS="--minutes 3 --seed 1" for a short one, --process-nodes where real nodes cannot run
SOAK_ARGS ?=
soak: venv tools real-tier
	$(PY) benchmarks/soak.py $(SOAK_ARGS)
