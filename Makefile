# The two commands of the README:
#   make demo   set up, build fk, train a tiny Llama with and without fk (GPU if present, else CPU)
#   make test   set up, build fk, run the whole test suite
# Other targets: setup, wheel, install, bench, clean.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Compiled kernels are cached by content hash here, so rebuilds compile only what changed.
export FK_AOT_CACHE ?= $(HOME)/.cache/fk/aot

.PHONY: demo test setup wheel install bench clean

demo: install
	$(PY) examples/train_tiny.py

test: install
	$(PY) -m pytest tests -q -p no:cacheprovider

setup: $(VENV)/.stamp

$(VENV)/.stamp: requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

wheel: setup
	rm -rf dist.tmp
	$(PY) -m pip wheel . --no-build-isolation --no-deps -w dist.tmp
	mkdir -p dist && rm -f dist/fk-*.whl && mv dist.tmp/fk-*.whl dist/ && rm -rf dist.tmp

install: wheel
	$(PY) -m pip install -q --no-deps --force-reinstall dist/fk-*.whl

bench: install
	for b in benchmarks/benchmark_*.py; do \
	  $(PY) $$b --model llama_3_8b --sweep-mode token_length || exit 1; done

clean:
	rm -rf build dist dist.tmp
