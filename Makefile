# nanoserve: `make demo` and `make test` set everything up in .venv on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned to the CPU wheel on this machine family's disk; override for other machines.
TORCH_SPEC ?= torch==2.13.0
PYTEST_WORKERS ?= 2

.PHONY: install install-test install-dev demo serve test stress hosts fault-table export check-export lint pytest browser lb site preview screenshots readme clean

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
	$(BIN)/nanoserve generate --chat --max-tokens 64 "What is the capital of France? Answer in one sentence."

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

# Two workers on two cores: one thread each (two 2-thread OpenMP pools on two cores spin against each other). The tests
# marked `stress` (their outcome depends on the order requests reach a server) run in `make stress` only. The tests marked
# `hosts` (tests/test_hosts.py: network namespaces as hosts, about 2 minutes) run here; without root or iproute2 they skip.
pytest: install-test
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --nbval-lax --nbval-current-env -p no:cacheprovider -m "not stress" tests nbs

# The house style (CONTRIBUTING.md): the ruff profile in pyproject.toml, on the package and the notebooks.
lint: install-test
	$(BIN)/ruff check nanoserve nbs

test: check-export lint browser lb pytest

# $(call apt_install,PACKAGE,TEST): install the Debian package PACKAGE (its command has the same name) when missing, where we are root
# and apt-get exists. Any failure is ignored: without it, TEST skips and says so.
define apt_install
	-@if command -v $(1) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make: installing $(1) with apt-get (for $(2))"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq $(1) >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $(1) >/dev/null 2>&1; } \
	    || echo "make: could not install $(1); $(2) will skip"; \
	else echo "make: no $(1), and no apt-get as root to install it; $(2) will skip"; fi
endef

# tests/test_browser.py opens the site in Debian's chromium.
browser:
	$(call apt_install,chromium,tests/test_browser.py)

# tests/test_replicas.py and tests/test_hosts.py run two replicas behind HAProxy (deploy/haproxy.cfg).
lb:
	$(call apt_install,haproxy,tests/test_replicas.py)

# The build log as a website in _site/. With quarto on PATH: nbdev_docs, quarto's render of the processed notebooks into
# settings.ini's doc_path (_docs), copied to _site/. nbdev_docs rewrites nbs/sidebar.yml (flat, no phases) unless settings.ini
# says custom_sidebar = True, so without that it is not used. Otherwise: tools/preview.py, nbconvert's render of the same
# notebooks with the same sidebar, which needs nothing but the test extras and no network to view.
site: install-test
	@if command -v quarto >/dev/null 2>&1 && grep -qiE '^custom_sidebar *= *true' settings.ini; then \
	  echo "make site: rendering with quarto $$(quarto --version) (nbdev_docs -> _docs -> _site)"; \
	  $(BIN)/nbdev_docs && rm -rf _site && cp -r _docs _site; \
	else \
	  if command -v quarto >/dev/null 2>&1; then echo "make site: quarto found, but settings.ini does not say" \
	    "custom_sidebar = True, so nbdev_docs would overwrite nbs/sidebar.yml's sections"; fi; \
	  echo "make site: rendering locally with tools/preview.py (nbconvert, no quarto)"; \
	  rm -rf _site && $(BIN)/python tools/preview.py nbs _site >/dev/null; \
	fi
	@echo "make site: open _site/index.html"

# The local render alone, whether or not quarto is installed.
preview: install-test
	rm -rf _site && $(BIN)/python tools/preview.py nbs _site >/dev/null
	@echo "open _site/index.html"

# Full-page screenshots of the home page and Day 57 (docs/screenshots/*.png, Chromium at 1280 wide), taken by the browser
# check, which also fails on any console error, failed request, broken link or image of the site.
screenshots: site browser
	$(BIN)/python tools/browser_check.py _site docs/screenshots

readme: install-test
	$(BIN)/jupyter nbconvert --to markdown --log-level WARN nbs/index.ipynb --output-dir . --output README
	@# the landing page's links and pictures are relative to nbs/; the README sits one folder up
	sed -i -E 's#\]\(([0-9][0-9]_[a-z0-9_]+\.ipynb|performance\.ipynb|[a-z0-9_]+\.png)\)#](nbs/\1)#g' README.md

clean:
	rm -rf $(VENV) _site _proc

# The tests that build network namespaces as hosts (tests/test_hosts.py: root and iproute2), alone.
hosts: install-test lb
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m hosts tests/test_hosts.py

# The fault table of nbs/19_hosts.ipynb: the same tests, each fault case writing its row.
fault-table: install-test lb
	NANOSERVE_FAULT_TABLE=bench/results/hosts/faults.csv OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -s \
	  -p no:cacheprovider -m hosts tests/test_hosts.py

# The whole suite three times in a row, each under an extra busy core (CI runs under load: a flaky test is a bug), the tests
# marked `stress` included.
stress: install-test
	@for i in 1 2 3; do \
	  ( while :; do :; done ) & busy=$$!; \
	  start=$$(date +%s); \
	  OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --nbval-lax --nbval-current-env -p no:cacheprovider tests nbs; rc=$$?; \
	  kill $$busy; echo "stress run $$i: exit $$rc after $$(( $$(date +%s) - start )) s under an extra busy core"; \
	  [ $$rc -eq 0 ] || exit $$rc; \
	done
