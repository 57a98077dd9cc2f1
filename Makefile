# make demo : export the embedded MiniLM and a tiny Llama with every backend, check parity, write reports/demo.json
# make test : the fast test tier, the C++ tests and the smoke sweep (what CI runs)
# make canary: the canary tier, real model families exported without each workaround (run before a dependency bump)
# make cpp  : build the C++ runner (cpp/ -> build/cpp: hfx-run, libhfx, its tests, the _hfx bindings)
# Both create .venv on first use and install the pinned dependency set (requirements.lock) into it.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

CPP_BUILD := build/cpp

.PHONY: demo test canary smoke sweep-full test-slow bench clean cpp cpp-deps cpp-asan

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e '.[all]'
	$(PY) -m pip check
	touch $(STAMP)

demo: $(STAMP) cpp
	$(PY) -m hf_exporters.demo

# pytest in PYTEST_JOBS processes (pytest-xdist, worksteal: each worker starts on one contiguous half of the
# tests, file after file, and takes tests from the other's queue when its own runs out, so a module-scoped fixture,
# an export several tests share, is mostly built once while the load stays balanced; xdist 3.8's loadgroup does
# not group under pytest 9, whose node ids it can no longer suffix). Two halve the wall time on an idle 2-core
# machine; on a machine other jobs keep busy they only add each worker's start-up: run `make test PYTEST_JOBS=0`
# there (one process).
PYTEST_JOBS ?= 2
PYTEST := $(PY) -m pytest -q -n $(PYTEST_JOBS) --dist worksteal

# the fast tier: every unit, the smallest test of each workaround, the CLI, the C++ runner (tests/test_cpp.py)
test: $(STAMP) cpp cpp-asan
	$(PYTEST) -m "not slow and not canary" tests
	$(MAKE) smoke

# the canary tier: each real model family exported without its workaround must still be refused (an upstream fix
# shows up here as a workaround no longer needed), and the heavier duplicates of fast-tier exports
canary: $(STAMP)
	$(PYTEST) -m canary tests

# The C++ runner's build dependencies from Debian (a JSON library and GoogleTest); cmake and g++ are on the machine.
cpp-deps:
	@dpkg -s nlohmann-json3-dev libgtest-dev >/dev/null 2>&1 || { \
		echo "installing nlohmann-json3-dev and libgtest-dev (Debian packages) for the C++ runner"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nlohmann-json3-dev libgtest-dev; }

cpp: $(STAMP) cpp-deps
	mkdir -p $(CPP_BUILD)
	cmake -S cpp -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(abspath $(PY)) \
		-Dpybind11_DIR=$$($(PY) -c 'import pybind11; print(pybind11.get_cmake_dir())') > $(CPP_BUILD)/configure.log \
		|| { cat $(CPP_BUILD)/configure.log; exit 1; }
	cmake --build $(CPP_BUILD) -j2

# hfx-run and its unit tests under AddressSanitizer + UBSan (tests/test_cpp.py runs the malformed-folder cases with it)
cpp-asan: $(STAMP) cpp-deps
	mkdir -p build/cpp-asan
	cmake -S cpp -B build/cpp-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHFX_SANITIZE=ON -DPython_EXECUTABLE=$(abspath $(PY)) \
		-Dpybind11_DIR=$$($(PY) -c 'import pybind11; print(pybind11.get_cmake_dir())') > build/cpp-asan/configure.log \
		|| { cat build/cpp-asan/configure.log; exit 1; }
	cmake --build build/cpp-asan -j2 --target hfx-run hfx_tests

# The CI smoke sweep: ~20 classes across families through every backend, fresh each time; fails when a
# job the baseline (src/hf_exporters/sweep/smoke_baseline.json) expects to pass does not.
smoke: $(STAMP)
	rm -rf out/smoke-sweep
	$(VENV)/bin/hf-exporters sweep --smoke --backend dynamo,onnx,executorch --shapes static --jobs 2 --timeout 180 --no-resume --no-progress --output out/smoke-sweep

# The published report's runs, in order, into SWEEP_OUT, at the revision checked out (each step resumes where its
# records stop, so the target can be stopped with SIGTERM and started again, across sessions; run it from a worktree
# at one commit so every record has one code revision): base classes static, then dynamic, on dynamo and ONNX; base
# classes on ExecuTorch; generation on dynamo and ONNX, the generative sample on ExecuTorch; ExecuTorch dynamic; the
# non-base sample; the cache-off companions on dynamo and ONNX; then every model class, static, ours, on dynamo and
# ONNX; last the
# report over the base selection (a --classes all run writes one whose denominators are every class).
SWEEP_OUT ?= out/sweep-full
SWEEP := $(VENV)/bin/hf-exporters sweep --no-progress --output $(SWEEP_OUT)
sweep-full: $(STAMP)
	$(SWEEP) --backend dynamo,onnx --shapes static --engine both --cache default --jobs 1 --timeout 150
	$(SWEEP) --backend dynamo,onnx --shapes dynamic --engine both --cache default --jobs 1 --timeout 150
	$(SWEEP) --backend executorch --shapes static --engine both --cache default --jobs 1 --timeout 300
	$(SWEEP) --backend dynamo,onnx --shapes generation --jobs 1 --timeout 300
	$(SWEEP) --backend executorch --shapes generation --classes sample --jobs 1 --timeout 600
	$(SWEEP) --backend executorch --shapes dynamic --engine both --cache default --jobs 1 --timeout 300
	$(SWEEP) --classes sample --backend dynamo,onnx --shapes static --engine both --cache default --jobs 1 --timeout 150
	$(SWEEP) --classes sample --backend executorch --shapes static --engine both --cache default --jobs 1 --timeout 300
	$(SWEEP) --backend dynamo,onnx --shapes static,dynamic --engine both --cache off --jobs 1 --timeout 150
	$(SWEEP) --classes all --backend dynamo,onnx --shapes static --engine ours --cache default --jobs 1 --timeout 150
	$(SWEEP) --report-only

# every test, the two tiers in separate runs (an unpatched trace of Encodec in the canary tier leaves a length
# guard in the next program torch traces in that process)
test-slow: $(STAMP) cpp cpp-asan
	$(PYTEST) -m "not canary" tests
	$(PYTEST) -m canary tests

bench: $(STAMP)
	$(PY) benchmarks/export_time.py
	$(PY) benchmarks/executorch_latency.py
	$(PY) benchmarks/onnx_latency.py
	$(PY) benchmarks/workaround_speed.py

clean:
	rm -rf $(VENV) build src/*.egg-info
