# make demo : export the embedded MiniLM and a tiny Llama with every backend, check parity, write reports/demo.json
# make test : the test suite (what CI runs)
# Both create .venv on first use and install the pinned dependency set (requirements.lock) into it.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test smoke test-slow bench clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock -e '.[all]'
	$(PY) -m pip check
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m hf_exporters.demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests
	$(MAKE) smoke

# The CI smoke sweep: ~20 classes across families through every backend, fresh each time; fails when a
# job the baseline (src/hf_exporters/sweep/smoke_baseline.json) expects to pass does not.
smoke: $(STAMP)
	rm -rf out/smoke-sweep
	$(VENV)/bin/hf-exporters sweep --smoke --backend dynamo,onnx,executorch --shapes static --jobs 2 --timeout 180 --no-resume --no-progress --output out/smoke-sweep

test-slow: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/export_time.py
	$(PY) benchmarks/executorch_latency.py
	$(PY) benchmarks/onnx_latency.py

clean:
	rm -rf $(VENV) build src/*.egg-info
