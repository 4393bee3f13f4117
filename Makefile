# specdec: `make install`, `make test`, `make lint`, `make bench`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LLAMA_CPP_PYTHON ?= llama-cpp-python==0.3.36
STAMP := $(VENV)/.specdec-installed

.PHONY: install test test-fast lint bench rebuild-llama clean

install: $(STAMP)

# llama-cpp-python compiles llama.cpp from source; build_flags.py picks CMake flags that are
# safe for this CPU (never AMX) unless SPECDEC_CMAKE_ARGS or CMAKE_ARGS says otherwise.
$(STAMP): pyproject.toml specdec_cli/build_flags.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	CMAKE_ARGS="$$($(PY) specdec_cli/build_flags.py)" FORCE_CMAKE=1 \
		$(PY) -m pip install "$(LLAMA_CPP_PYTHON)"
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'ready')"
	touch $(STAMP)

# Rebuild llama.cpp after changing flags (e.g. SPECDEC_CMAKE_ARGS="-DGGML_CUDA=on").
rebuild-llama: install
	CMAKE_ARGS="$$($(PY) specdec_cli/build_flags.py)" FORCE_CMAKE=1 \
		$(PY) -m pip install --force-reinstall --no-deps --no-cache-dir "$(LLAMA_CPP_PYTHON)"

test: install
	$(PY) -m pytest -ra

test-fast: install
	$(PY) -m pytest -ra -m "not slow"

lint: install
	$(VENV)/bin/ruff check specdec_cli tests
	$(VENV)/bin/mypy

bench: install
	$(VENV)/bin/specdec bench --draft small --target large --per-category 1 --repeats 1 \
		--max-tokens 64 --json bench.json --markdown bench.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
