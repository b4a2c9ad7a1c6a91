# The README's two commands are `make demo` and `make test`; everything they need is set up here.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SO_STAMP := prism_megatron/.built
CSRC := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')

.PHONY: venv build demo test test-fast lint format bench cuda-venv cuda-check clean venv-compat _venv-compat \
	build-compat test-compat wheels-gpu patches-readme cuda-check-default cuda-venv-gpu-pair cuda-check-gpu-pair \
	prebuilt-gpu

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

# The table of every patch, generated from the catalog (a test fails when the two differ).
patches-readme: $(STAMP)
	$(PY) -m prism_megatron.patches.catalog

bench: build
	$(PY) -m benchmarks.run

# The CUDA build with a CUDA torch in a separate venv, on a machine without a GPU: it must compile,
# import, and run the prism backend (activation and collectives on CPU tensors, one and two
# processes), since a build that imports can still crash when torch first constructs a backend.
# The venv holds third-party packages only (torch 2.14.1 with CUDA from this machine's disk, about
# 5.4 GB installed), so like the compatibility venv below it lives outside the checkout and one copy
# serves every checkout of a machine: a fresh clone (CI) reuses it. It is installed again only when
# the requirement line changes. The build is always forced and from empty folders
# (tools/native_build.py), like every GPU build.
CUDA_REQUIREMENTS := torch==2.14.1 ninja numpy setuptools wheel
CUDA_VENV ?= $(HOME)/.cache/prism-megatron/venv-cuda-torch2.14.1
CUDA_PY := $(CUDA_VENV)/bin/python
CUDA_STAMP := $(CUDA_VENV)/.installed

# flock: two checkouts setting up the shared venv at once take turns.
cuda-venv:
	@mkdir -p $(dir $(CUDA_VENV))
	@flock $(CUDA_VENV).lock sh -c 'if grep -qxF "$(CUDA_REQUIREMENTS)" $(CUDA_STAMP) 2>/dev/null; then \
	  echo "$(CUDA_VENV): $(CUDA_REQUIREMENTS) already installed"; \
	else \
	  set -e; test -x $(CUDA_PY) || $(PYTHON) -m venv $(CUDA_VENV); \
	  $(CUDA_PY) -m pip install -q $(CUDA_REQUIREMENTS); \
	  echo "$(CUDA_REQUIREMENTS)" >$(CUDA_STAMP); \
	fi'

# Both pairs: this machine's newest CUDA torch, and the lent GPU machine's (below).
cuda-check: cuda-check-default cuda-check-gpu-pair

cuda-check-default: cuda-venv
	CUDA_HOME=$${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0 $(CUDA_PY) -m tools.native_build \
	  --out build/cuda-check --work build/cuda-check-objects
	# torch first: the extension links libc10, which importing torch loads. No kernel is launched.
	cd build/cuda-check && $(abspath $(CUDA_PY)) -c "import torch, prism_megatron._C as C; assert C.with_cuda; assert hasattr(C.clock, 'cuda_wait_until'); print('CUDA build imports:', sorted(n for n in dir(C) if not n.startswith('_')))"
	$(CUDA_PY) -X faulthandler -m tools.build_smoke --native-dir build/cuda-check/prism_megatron

# The lent GPU machine's pair: Python 3.12 with torch 2.11.0, the package index's build for CUDA 13
# (2.11.0+cu130, what that machine's python3 holds), compiled with this machine's nvcc for Hopper
# (sm_90). The C++ last broke there on an enum torch 2.11 lacks, so every change compiles against it
# here. Then the smoke check and the backend's tests, on CPU tensors (no GPU here), with that module
# (PRISM_NATIVE_DIR puts it before the package's own). The venv (about 5 GB: torch's CUDA libraries)
# lives outside the checkout like the one above, and is set up again only when the line changes.
# The interpreter is PYTHON_COMPAT's (python3.12, or pyenv's newest 3.12).
GPU_PAIR_TORCH := 2.11.0
GPU_PAIR_REQUIREMENTS := torch==$(GPU_PAIR_TORCH) ninja numpy setuptools wheel pytest packaging pyyaml
GPU_PAIR_VENV ?= $(HOME)/.cache/prism-megatron/venv-cuda-py312-torch$(GPU_PAIR_TORCH)
GPU_PAIR_PY := $(GPU_PAIR_VENV)/bin/python
GPU_PAIR_STAMP := $(GPU_PAIR_VENV)/.installed
GPU_PAIR_NATIVE := build/cuda-check-gpu-pair/prism_megatron
# The backend's device path and its safety on the test device, the op families, and real gloo
# sub-communicators: about a minute on two cores.
GPU_PAIR_TESTS := tests/unit/test_device_path_safety.py tests/unit/test_backend_ops.py \
	tests/dist/test_device_path.py tests/dist/test_backend_real.py

cuda-venv-gpu-pair:
	@test -n "$(compat_interpreter)" || { echo "make cuda-venv-gpu-pair: no interpreter '$(PYTHON_COMPAT)' (set PYTHON_COMPAT to a Python 3.12)" >&2; exit 2; }
	@mkdir -p $(dir $(GPU_PAIR_VENV))
	@flock $(GPU_PAIR_VENV).lock sh -c 'if grep -qxF "$(GPU_PAIR_REQUIREMENTS)" $(GPU_PAIR_STAMP) 2>/dev/null; then \
	  echo "$(GPU_PAIR_VENV): $(GPU_PAIR_REQUIREMENTS) already installed"; \
	else \
	  set -e; test -x $(GPU_PAIR_PY) || $(compat_interpreter) -m venv $(GPU_PAIR_VENV); \
	  $(GPU_PAIR_PY) -m pip install -q $(GPU_PAIR_REQUIREMENTS); \
	  echo "$(GPU_PAIR_REQUIREMENTS)" >$(GPU_PAIR_STAMP); \
	fi'

cuda-check-gpu-pair: cuda-venv-gpu-pair
	CUDA_HOME=$${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0 $(GPU_PAIR_PY) -m tools.native_build \
	  --out build/cuda-check-gpu-pair --work build/cuda-check-gpu-pair-objects
	cd build/cuda-check-gpu-pair && $(abspath $(GPU_PAIR_PY)) -c "import torch, prism_megatron._C as C; assert torch.__version__ == '$(GPU_PAIR_TORCH)+cu130', torch.__version__; assert C.with_cuda; assert hasattr(C.clock, 'cuda_wait_until'); print('CUDA build for torch', torch.__version__, 'imports')"
	$(GPU_PAIR_PY) -X faulthandler -m tools.build_smoke --native-dir $(GPU_PAIR_NATIVE)
	PRISM_NATIVE_DIR=$(abspath $(GPU_PAIR_NATIVE)) PYTHONPATH=$(CURDIR) OMP_NUM_THREADS=1 \
	  $(GPU_PAIR_PY) -m pytest -q -p no:cacheprovider $(GPU_PAIR_TESTS)

# The module the lent GPU machine imports instead of building (benchmarks/gpu/run.sh, README "On a
# GPU"): the GPU pair's build above, with the hash of the sources it was built from, in .prebuilt/
# (ignored by git: the run names it in what it carries). run.sh uses it only when the hash matches
# the sources it was sent, and builds there otherwise.
prebuilt-gpu: cuda-check-gpu-pair
	rm -rf .prebuilt && mkdir -p .prebuilt/prism_megatron
	cp $(GPU_PAIR_NATIVE)/_C*.so .prebuilt/prism_megatron/
	$(GPU_PAIR_PY) -m benchmarks.gpu.prebuilt --write .prebuilt

# Build outputs only: the venvs stay (make cuda-check reinstalls nothing while its venv is current).
clean:
	rm -rf build $(SO_STAMP) $(SO_STAMP_COMPAT) prism_megatron/_C*.so

# --- The compatibility pair: Python 3.12 with the newest megatron-core ------------------------------
# README "Versions". torch is the newest release the index serves for Python 3.12, a CUDA build
# (about 5 GB installed with its libraries; it runs on CPU). The environment holds third-party
# packages only (the project runs from the checkout, its extension built in place beside the default
# one: the file name carries the Python tag), so one environment serves every checkout of a machine:
# a fresh clone (CI) reuses it instead of downloading 3 GB again, which pip's cache cannot spare
# where the index sends no caching headers. It is set up again only when a pin or pyproject.toml
# changes, and then pip installs only what changed.
# PYTHON_COMPAT names the interpreter: anything on PATH, or a pyenv version of that name, selected
# for this command alone when the shim refuses it.
PYTHON_COMPAT ?= python3.12
TORCH_COMPAT ?= 2.15.0
MCORE_COMPAT ?= 0.19.2
VENV_COMPAT ?= $(HOME)/.cache/prism-megatron/venv-py312-torch$(TORCH_COMPAT)
PY_COMPAT := $(VENV_COMPAT)/bin/python
STAMP_COMPAT := $(VENV_COMPAT)/.installed-mcore$(MCORE_COMPAT)-$(shell sha1sum pyproject.toml | cut -c1-12)
SO_STAMP_COMPAT := prism_megatron/.built-compat
# A cap some machines put on torch (a pip config constraint) would refuse the pinned release; the
# pins here are this environment's only constraints.
PIP_COMPAT := PIP_CONSTRAINT=/dev/null $(PY_COMPAT) -m pip
# The compatibility tier: the patch registry and drift tests, a W=8192 emulation of the built-in
# entry (capture, simulation, emulation, report), the plan of a shipped configuration, and the
# interleaved schedule's derived stages against megatron-core's own (0.19 waits a send earlier).
TESTS_COMPAT := tests/unit/test_patches.py tests/megatron/test_patch_drift.py \
	tests/megatron/test_launch.py::test_emulate_command_runs_two_adjacent_stages_of_an_8192_job \
	tests/megatron/test_plan_configs.py::test_plan_command_prints_each_category_and_writes_json \
	tests/megatron/test_interleaved_classes.py

compat_interpreter = $(shell $(PYTHON_COMPAT) -c 'import sys; print(sys.executable)' 2>/dev/null || \
	PYENV_VERSION=$$(pyenv latest $(patsubst python%,%,$(notdir $(PYTHON_COMPAT))) 2>/dev/null) \
	$(PYTHON_COMPAT) -c 'import sys; print(sys.executable)' 2>/dev/null)

venv-compat: $(STAMP_COMPAT)

# flock: two checkouts setting up the shared environment at once take turns.
$(STAMP_COMPAT):
	@test -n "$(compat_interpreter)" || { echo "make venv-compat: no interpreter '$(PYTHON_COMPAT)' (set PYTHON_COMPAT to a Python 3.12)" >&2; exit 2; }
	mkdir -p $(dir $(VENV_COMPAT))
	flock $(VENV_COMPAT).lock $(MAKE) --no-print-directory _venv-compat

_venv-compat:
	test -f $(STAMP_COMPAT) || { \
	  set -e; \
	  test -x $(PY_COMPAT) || $(compat_interpreter) -m venv $(VENV_COMPAT); \
	  $(PIP_COMPAT) install -q --upgrade pip setuptools wheel; \
	  $(PY_COMPAT) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	    print('\n'.join(p['dependencies'] + p['optional-dependencies']['test']))" >$(VENV_COMPAT)/requirements.txt; \
	  $(PIP_COMPAT) install -q -r $(VENV_COMPAT)/requirements.txt torch==$(TORCH_COMPAT) \
	    megatron-core==$(MCORE_COMPAT) ninja; \
	  rm -f $(VENV_COMPAT)/.installed-*; touch $(STAMP_COMPAT); }

# A CPU build even though this torch has CUDA: the pair is tested on CPU machines.
build-compat: $(STAMP_COMPAT) $(SO_STAMP_COMPAT)

$(SO_STAMP_COMPAT): $(CSRC) setup.py
	PRISM_FORCE_CPU=1 flock .build.lock $(PY_COMPAT) setup.py -q build_ext --inplace
	touch $@

test-compat: build-compat
	PYTHONPATH=$(CURDIR) $(PY_COMPAT) -m pytest -q -p no:cacheprovider $(TESTS_COMPAT)

# --- Wheels for the lent GPU machine (Python 3.12, its own CUDA torch, no network) ------------------
# megatron-core for its Python and what prism imports that the machine's image lacks: jsonschema
# (every run's report is checked with it) and its dependencies; never torch. The image holds numpy,
# packaging, PyYAML, matplotlib with its dependencies, attrs and protobuf (carrying them took 40 of
# the 64 MiB the travelling tree may have, beside the prebuilt module). benchmarks/gpu/run.sh
# installs the ones that machine lacks from .whl/ (benchmarks/gpu/carried_wheels.py). The tree that
# travels there is capped at 64 MiB, so this refuses a larger set.
WHEELS_GPU := megatron-core==$(MCORE_COMPAT) jsonschema jsonschema-specifications referencing rpds-py
WHEELS_GPU_PLATFORM := --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
	--abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform any

wheels-gpu:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download -q $(WHEELS_GPU_PLATFORM) -d .whl $(WHEELS_GPU)
	@total=$$(cat .whl/*.whl | wc -c); echo "wheels-gpu: $$(ls .whl | wc -l) wheels, $$((total / 1048576)) MiB in .whl/"; \
	  test $$total -le 67108864 || { echo "wheels-gpu: over 64 MiB" >&2; exit 1; }
