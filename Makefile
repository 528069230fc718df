# llmx: `make install` builds .venv from nothing; `make test` is what CI runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SMOKE_RUNS ?= .smoke-runs

.PHONY: install test test-fast lint smoke bench demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

test: install
	OMP_NUM_THREADS=1 $(BIN)/pytest -q
	$(MAKE) --no-print-directory smoke

test-fast: install
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check llmx tests benchmarks

smoke: install
	@rm -rf $(SMOKE_RUNS)
	@set -e; for f in configs/smoke/*.yaml; do \
		echo "smoke: $$f"; \
		OMP_NUM_THREADS=1 $(BIN)/llmx -q run $$f --output-dir $(SMOKE_RUNS); \
	done
	$(BIN)/llmx report $(SMOKE_RUNS) --format md
	@rm -rf $(SMOKE_RUNS)

bench: install
	@set -e; for f in benchmarks/bench_*.py; do echo "bench: $$f"; $(BIN)/python $$f; done

demo: install
	$(BIN)/llmx run configs/quickstart.yaml

clean:
	rm -rf $(VENV) $(SMOKE_RUNS) runs .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
