# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint test-vllm vllm-setup bench-relay bench-routing bench-admission engine-sweep report clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gateway serve

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

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

bench-relay: $(STAMP)
	$(BIN)/python benchmarks/relay_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
