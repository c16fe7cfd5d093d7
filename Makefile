# The two commands a newcomer needs: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: serve test test-fast check lint typecheck unit install model bench fuzz clean conformance debian-packages

$(STAMP): pyproject.toml $(shell find src -name "*.py" 2>/dev/null)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' --config-settings editable_mode=strict
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/mlx-responses serve --host $(HOST) --port $(PORT)

check: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/ruff format --check src tests bench scripts
	$(VENV)/bin/mypy src

# Debian packages the tests need (scripts/ensure-debian.sh installs the missing ones, as root):
# PostgreSQL 15 for the replica tests (issue 15), chromium for the status page's browser test
# (issue 16). Elsewhere, install them yourself; the tests that need them fail without them.
PG_PROBE := /usr/lib/postgresql/15/bin/postgres
debian-packages:
	bash scripts/ensure-debian.sh postgresql-15:$(PG_PROBE) chromium:/usr/bin/chromium

unit: $(STAMP) debian-packages
	$(PY) -m pytest -q

test: check unit

# The fast loop (docs/testing.md): the pure and unit tests, under a minute; every test that
# starts a real part is marked slow by tests/conftest.py and left to `make test`, and each
# property draws a fifth of its examples (MLX_RESPONSES_FAST_LOOP).
test-fast: $(STAMP)
	MLX_RESPONSES_FAST_LOOP=1 $(PY) -m pytest -q -m "not slow"

model: $(STAMP)
	$(PY) scripts/build_tiny_model.py

# Real clients against a real server (docs/clients.md): llm-comply (pinned in the test extras)
# and Codex CLI (pinned in conformance/package-lock.json).
conformance/node_modules/.installed: conformance/package.json conformance/package-lock.json
	cd conformance && npm ci --no-audit --no-fund
	touch $@

conformance: $(STAMP) conformance/node_modules/.installed
	$(PY) scripts/conformance.py
	$(PY) -m tests.fuzz.http_fuzz --seconds $(CONFORMANCE_FUZZ_SECONDS)

bench: $(STAMP)
	$(PY) bench/throughput.py

# Property-based HTTP fuzzing against the real server (tests/fuzz/http_fuzz.py), time-bounded.
FUZZ_SECONDS ?= 180
CONFORMANCE_FUZZ_SECONDS ?= 120
FUZZ_ARGS ?=
fuzz: $(STAMP)
	$(PY) -m tests.fuzz.http_fuzz --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache conformance/node_modules
