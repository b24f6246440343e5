# The two commands of the README:
#   make demo   set up, build fk, train a tiny Llama with and without fk (GPU if present, else CPU)
#   make test   set up, build fk, run the whole test suite under torch 2.11 (the oldest torch fk
#               supports), then test the same wheel under the newest torch and a CPU-only torch
# Other targets: setup, wheel, install, bench, clean.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Compiled kernels are cached by content hash here, so rebuilds compile only what changed.
export FK_AOT_CACHE ?= $(HOME)/.cache/fk/aot
# The Triton that compiles the kernels (requirements-triton.txt, not torch's pinned Triton): the
# build installs it here with pip (from the package index, once per version) and runs the AOT
# compiler with it; .venv keeps torch's Triton.
export FK_TRITON_CACHE ?= $(HOME)/.cache/fk/triton
# The wheel's platform: auditwheel checks libfk against this policy (glibc 2.28, the libstdc++
# of GCC 8) and tags the wheel with it. torch's libraries are the user's torch: never bundled.
PLAT := manylinux_2_28_x86_64
# More environments the same wheel is tested in by `make test` (requirements-torch-*.txt).
VENV_NEWEST ?= build/venv-torch-newest
VENV_CPU ?= build/venv-torch-cpu
PYTEST := -m pytest tests -q -p no:cacheprovider
# The tests of the Triton sources (they import triton_src/ and run it under Triton's interpreter,
# which no user of the wheel runs) stay in .venv, under torch 2.11's Triton (3.6, also the pin in
# requirements-triton.txt): Triton 3.9, the build's other option, has an interpreter that rejects
# a load mask combined with a comparison of a scalar argument ("mask has unsupported dtype"),
# though its compiler takes it. A CPU-only torch comes without Triton, and the newest torch
# brings another.
NO_TRITON_SRC := -k "not interpreter and not test_variants_cover_every_dtype" \
  --ignore=tests/test_interpreter.py

.PHONY: demo test setup wheel install bench clean

demo: install
	$(PY) examples/train_tiny.py

# $(call wheel_env,venv,requirements file): (re)installs the wheel in another environment,
# resolving its requirements against that environment's pinned torch.
define wheel_env
$(1)/bin/python -m pip uninstall -q -y fk
$(1)/bin/python -m pip install -q -r $(2) dist/fk-*.whl
$(1)/bin/python -c "import torch, fk; print('torch', torch.__version__, '|', fk.build_info())"
endef

test: install $(VENV_NEWEST)/.stamp $(VENV_CPU)/.stamp
	$(PY) -c "import torch, fk; print('torch', torch.__version__, '|', fk.build_info())"
	$(PY) $(PYTEST)
	$(call wheel_env,$(VENV_NEWEST),requirements-torch-newest.txt)
	PATH=$(abspath $(VENV_NEWEST))/bin:$$PATH $(VENV_NEWEST)/bin/python $(PYTEST) $(NO_TRITON_SRC)
	$(call wheel_env,$(VENV_CPU),requirements-torch-cpu.txt)
	PATH=$(abspath $(VENV_CPU))/bin:$$PATH $(VENV_CPU)/bin/python $(PYTEST) $(NO_TRITON_SRC)

setup: $(VENV)/.stamp

$(VENV)/.stamp: requirements-dev.txt requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

$(VENV_NEWEST)/.stamp: requirements-torch-newest.txt requirements-test.txt
	test -x $(VENV_NEWEST)/bin/python || $(PYTHON) -m venv $(VENV_NEWEST)
	$(VENV_NEWEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_NEWEST)/bin/python -m pip install -q -r requirements-torch-newest.txt
	touch $@

$(VENV_CPU)/.stamp: requirements-torch-cpu.txt requirements-test.txt
	test -x $(VENV_CPU)/bin/python || $(PYTHON) -m venv $(VENV_CPU)
	$(VENV_CPU)/bin/python -m pip install -q --upgrade pip
	$(VENV_CPU)/bin/python -m pip install -q -r requirements-torch-cpu.txt
	touch $@

# dist/fk-<version>-py3-none-manylinux_2_28_x86_64.whl: `auditwheel repair` fails if libfk
# needs a newer glibc / libstdc++ symbol version than the policy allows, bundles nothing
# (libfk's only non-system library is torch's libtorch_cpu.so) and retags the wheel with
# exactly that platform (--only-plat: no second, older manylinux tag).
wheel: setup
	rm -rf dist.tmp
	$(PY) -m pip wheel . --no-build-isolation --no-deps -w dist.tmp
	$(PY) -m auditwheel repair --plat $(PLAT) --only-plat \
	  --exclude 'libtorch*' --exclude 'libc10*' -w dist.tmp/repaired dist.tmp/fk-*.whl
	mkdir -p dist && rm -f dist/fk-*.whl && mv dist.tmp/repaired/fk-*.whl dist/ && rm -rf dist.tmp

install: wheel
	$(PY) -m pip install -q --no-deps --force-reinstall dist/fk-*.whl

bench: install
	for b in benchmarks/benchmark_*.py; do \
	  $(PY) $$b --model llama_3_8b --sweep-mode token_length || exit 1; done

clean:
	rm -rf build dist dist.tmp
