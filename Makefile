# nanoserve: `make demo` and `make test` set everything up in .venv on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned to the CPU wheel on this machine family's disk; override for other machines.
TORCH_SPEC ?= torch==2.13.0
PYTEST_WORKERS ?= 2

.PHONY: install install-test install-dev demo serve test stress export check-export pytest preview readme clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python setup.py settings.ini
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[test]"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-test
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/nanoserve pull
	$(BIN)/nanoserve generate --chat --max-tokens 64 "What is the capital of France?"

# Serve a model (default: SmolLM2-135M-Instruct, pulled on first use) with an OpenAI-compatible API.
MODEL ?= SmolLM2-135M-Instruct
HOST ?= 127.0.0.1
PORT ?= 8000
SERVE_FLAGS ?=
serve: install
	$(BIN)/nanoserve serve --model "$(MODEL)" --host $(HOST) --port $(PORT) $(SERVE_FLAGS)

export: install-test
	$(BIN)/nbdev_export

# The exported package must be exactly what the notebooks say (new, untracked modules included).
check-export: export
	@if [ -n "$$(git status --porcelain -- nanoserve)" ]; then \
	  echo "nbdev_export changed nanoserve/: edit the notebooks, export, and commit both"; \
	  git status --porcelain -- nanoserve; exit 1; fi

# Two workers on two cores: one thread each (two 2-thread OpenMP pools on two cores spin against each other).
pytest: install-test
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --nbval-lax --nbval-current-env -p no:cacheprovider tests nbs

test: check-export pytest

preview: install-test
	$(BIN)/python tools/preview.py nbs _site
	@echo "open _site/index.html"

readme: install-test
	$(BIN)/jupyter nbconvert --to markdown --log-level WARN nbs/index.ipynb --output-dir . --output README

clean:
	rm -rf $(VENV) _site _proc

# The whole suite three times in a row, each under an extra busy core (CI runs under load: a flaky test is a bug).
stress: install-test
	@for i in 1 2 3; do \
	  ( while :; do :; done ) & busy=$$!; \
	  start=$$(date +%s); \
	  OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --nbval-lax --nbval-current-env -p no:cacheprovider tests nbs; rc=$$?; \
	  kill $$busy; echo "stress run $$i: exit $$rc after $$(( $$(date +%s) - start )) s under an extra busy core"; \
	  [ $$rc -eq 0 ] || exit $$rc; \
	done
