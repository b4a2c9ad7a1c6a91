# The README's two commands are `make demo` and `make test`; everything they need is set up here.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SO_STAMP := prism_megatron/.built
CSRC := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')

.PHONY: venv build demo test test-fast lint format bench cuda-check clean venv-compat build-compat \
	test-compat wheels-gpu

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# torch first and pinned: pip takes the 2.13.0 CPU build from this machine's disk.
	$(PY) -m pip install -q torch==2.13.0 ninja
	# Dependencies and the entry point only; `make build` compiles the extension in place.
	PRISM_NO_EXTENSION=1 $(PY) -m pip install -q --no-build-isolation -e '.[dev]'
	touch $@

# The C++ extension, built in place; flock serialises concurrent builds in one checkout.
build: $(STAMP) $(SO_STAMP)

$(SO_STAMP): $(CSRC) setup.py
	flock .build.lock $(PY) setup.py -q build_ext --inplace
	touch $@

demo: build
	$(PY) -m prism_megatron.cli demo

test: build
	$(PY) -m pytest -q tests

test-fast: build
	$(PY) -m pytest -q -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: build
	$(PY) -m benchmarks.run

# The CUDA build with a CUDA torch in a separate venv, on a machine without a GPU: it must compile,
# import, and run the prism backend (activation and collectives on CPU tensors, one and two
# processes), since a build that imports can still crash when torch first constructs a backend.
cuda-check:
	test -x .venv-cuda/bin/python || $(PYTHON) -m venv .venv-cuda
	.venv-cuda/bin/python -m pip install -q torch==2.14.1 ninja numpy setuptools wheel
	rm -rf build/cuda-check && mkdir -p build/cuda-check
	CUDA_HOME=/usr/local/cuda .venv-cuda/bin/python setup.py -q build_ext --build-lib build/cuda-check --build-temp build/cuda-check/tmp
	# torch first: the extension links libc10, which importing torch loads. No kernel is launched.
	cd build/cuda-check && ../../.venv-cuda/bin/python -c "import torch, prism_megatron._C as C; assert C.with_cuda; assert hasattr(C.clock, 'cuda_wait_until'); print('CUDA build imports:', sorted(n for n in dir(C) if not n.startswith('_')))"
	PYTHONPATH=$(CURDIR) .venv-cuda/bin/python -X faulthandler benchmarks/backend/build_smoke.py --native-dir build/cuda-check/prism_megatron

clean:
	rm -rf build $(SO_STAMP) $(SO_STAMP_COMPAT) prism_megatron/_C*.so

# --- The compatibility pair: Python 3.12 with the newest megatron-core ------------------------------
# README "Versions". torch is the newest release the index serves for Python 3.12, a CUDA build
# (about 5 GB installed with its libraries; it runs on CPU). pip's cache is kept, so only the first
# install downloads; the venv is reinstalled only when one of its pins or pyproject.toml changes.
# PYTHON_COMPAT names the interpreter: anything on PATH, or a pyenv version of that name, which is
# selected for this command alone when the shim refuses it.
PYTHON_COMPAT ?= python3.12
TORCH_COMPAT ?= 2.15.0
MCORE_COMPAT ?= 0.19.2
VENV_COMPAT := .venv-compat
PY_COMPAT := $(VENV_COMPAT)/bin/python
STAMP_COMPAT := $(VENV_COMPAT)/.installed-torch$(TORCH_COMPAT)-mcore$(MCORE_COMPAT)
SO_STAMP_COMPAT := prism_megatron/.built-compat
# A cap some machines put on torch (a pip config constraint) would refuse the pinned release, and a
# later install would "fix" torch back down; the pins below are the constraints of this venv.
PIP_COMPAT := PIP_CONSTRAINT=/dev/null $(PY_COMPAT) -m pip

compat_interpreter = $(shell $(PYTHON_COMPAT) -c 'import sys; print(sys.executable)' 2>/dev/null || \
	PYENV_VERSION=$$(pyenv latest $(patsubst python%,%,$(notdir $(PYTHON_COMPAT))) 2>/dev/null) \
	$(PYTHON_COMPAT) -c 'import sys; print(sys.executable)' 2>/dev/null)

venv-compat: $(STAMP_COMPAT)

$(STAMP_COMPAT): pyproject.toml
	@test -n "$(compat_interpreter)" || { echo "make venv-compat: no interpreter '$(PYTHON_COMPAT)' (set PYTHON_COMPAT=<a Python 3.12>)" >&2; exit 2; }
	test -x $(PY_COMPAT) || $(compat_interpreter) -m venv $(VENV_COMPAT)
	rm -f $(VENV_COMPAT)/.installed-*
	$(PIP_COMPAT) install -q --upgrade pip setuptools wheel
	$(PIP_COMPAT) install -q torch==$(TORCH_COMPAT) megatron-core==$(MCORE_COMPAT) ninja
	PRISM_NO_EXTENSION=1 $(PIP_COMPAT) install -q --no-build-isolation -e '.[test]' \
		torch==$(TORCH_COMPAT) megatron-core==$(MCORE_COMPAT)
	touch $@

# The extension for Python 3.12 lies beside the default one (the file name carries the Python tag).
# A CPU build even though torch has CUDA: this pair is tested on CPU machines.
build-compat: $(STAMP_COMPAT) $(SO_STAMP_COMPAT)

$(SO_STAMP_COMPAT): $(CSRC) setup.py
	PRISM_FORCE_CPU=1 flock .build.lock $(PY_COMPAT) setup.py -q build_ext --inplace
	touch $@
