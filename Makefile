# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-full test-fast audit-artifact bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so the dev extra does not pull CUDA wheels.
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[tf,dev]"
	# The library corpora (tests/convert/test_corpus_{tfp,sonnet,tfrs,tf_agents}.py), beside TF without
	# replacing it: --no-deps, since tf-agents pins typing-extensions==4.5 and old gym; then the few
	# pure-Python modules they import (none of them depends on anything).
	$(PY) -m pip install -q --no-deps "tensorflow-probability==0.25.0" "dm-sonnet==2.0.2" \
	  "tensorflow-recommenders==0.7.7" "tf-agents==0.19.0" "gym==0.23.0" "gym-notices==0.1.0" \
	  "decorator>=5" "tabulate>=0.9" "gin-config>=0.5" "cloudpickle>=2"
	# TF Model Garden (tests/convert/test_corpus_model_garden.py), also --no-deps: its requirements would
	# replace TF; official.vision imports tfds, pycocotools and cv2 at import time, so those come too.
	$(PY) -m pip install -q --no-deps "tf-models-official==2.20.0" "tensorflow-datasets==4.9.10" \
	  "tensorflow-metadata==1.21.0" "promise==2.3" "toml==0.10.2" "immutabledict==4.3.1" \
	  "pycocotools==2.0.11" "opencv-python-headless==5.0.0.93" "gin-config>=0.5" "pyyaml>=6" "sentencepiece>=0.2" \
	  || echo "tf-models-official not installed: tests/convert/test_corpus_model_garden.py will skip"
	# Hugging Face transformers 4.x TF models (tests/convert/test_corpus_transformers.py), also --no-deps: its
	# requirements would replace TF. At import it checks tokenizers<0.21 and huggingface-hub<1.0, so those
	# replace the newer ones keras-hub brought (keras-hub runs with them); its other imports are there already.
	$(PY) -m pip install -q --no-deps "transformers==4.46.3" "tokenizers==0.20.3" "huggingface-hub==0.36.2" \
	  || echo "transformers not installed: tests/convert/test_corpus_transformers.py will skip"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/jaxport demo

# Full suite, slow model-zoo tests included (this is what CI runs).
test: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -n 2 -m "(slow or not slow) and not full_corpus" --durations=15

# Everything, each corpus whole (CI runs a sample of each).
test-full: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -n 2 -m "slow or not slow or full_corpus" --durations=15

test-fast: $(STAMP)
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -n 2

# Every op test and the library corpora through an exported and loaded artifact (tests/oracle.py).
audit-artifact: $(STAMP)
	JAXPORT_ORACLE_VIA_ARTIFACT=1 TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m pytest -n 2 tests/convert/test_ops_*.py \
	  tests/convert/test_corpus_tfp.py tests/convert/test_corpus_sonnet.py tests/convert/test_corpus_tfrs.py \
	  tests/convert/test_corpus_tf_agents.py tests/convert/test_corpus_model_garden.py -m "slow or not slow" -rs

bench: $(STAMP)
	$(PY) benchmarks/convert_bench.py
	$(PY) benchmarks/data_bench.py
	$(PY) benchmarks/interop_bench.py
	$(PY) benchmarks/artifact_bench.py

clean:
	rm -rf $(VENV) build src/*.egg-info
