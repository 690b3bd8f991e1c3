# Every target bootstraps .venv on first use (Python >= 3.10; `python3` by default).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Tests are I/O-bound on real etcd servers: run them in parallel workers.
PYTEST_WORKERS ?= 3

.PHONY: demo test check lint typecheck docs sync gen-sync api-docs api-docs-check bench clean test-etcd34

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	@touch $(STAMP)

## The main job: a live demo on an embedded etcd (nothing to install).
demo: $(STAMP)
	$(BIN)/python -m demo

## The whole test suite against real etcd servers the tests start themselves.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -q -p no:cacheprovider $(PYTEST_ARGS)

## The compatibility leg: every family's tests against another etcd (default: Debian's
## etcd-server package, etcd 3.4.23: `apt-get install -y etcd-server etcd-client`).
ETCD34_BINARY ?= /usr/bin/etcd
ETCDCTL34_BINARY ?= /usr/bin/etcdctl
COMPAT_TESTS ?= tests/client tests/locks tests/election tests/barriers tests/queues \
	tests/caches tests/discovery tests/test_counter.py tests/test_keyvalue.py \
	tests/testing/test_grpc_proxy_families.py tests/stm tests/shared
COMPAT_TESTS += tests/groups
test-etcd34: $(STAMP)
	ETCD_BINARY=$(ETCD34_BINARY) ETCDCTL_BINARY=$(ETCDCTL34_BINARY) \
		$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -q -p no:cacheprovider \
		$(COMPAT_TESTS)

## Lint, types, the generated sync facade's freshness, and the docs build.
check: lint typecheck gen-sync-check api-docs-check docs

lint: $(STAMP)
	$(BIN)/ruff check etcd_recipes tests tools benchmarks demo
	$(BIN)/ruff format --check etcd_recipes tools demo tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

gen-sync: $(STAMP)
	$(BIN)/python -m tools.gen_sync

gen-sync-check: $(STAMP)
	$(BIN)/python -m tools.gen_sync --check

## docs/api/ is generated from the export list (one page per family).
api-docs: $(STAMP)
	$(BIN)/python -m tools.api_docs

api-docs-check: $(STAMP)
	$(BIN)/python -m tools.api_docs --check

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site

bench: $(STAMP)
	$(BIN)/python benchmarks/raw_ops.py

clean:
	rm -rf $(VENV) build site .mypy_cache .ruff_cache .pytest_cache
