# Two entry points for a fresh machine with Python >= 3.11 and pip (see README):
#   make run   - install into .venv and run the main job on the embedded default
#   make test  - install into .venv with the test extras and run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
OUT := outputs
METHODS := ar,prompt_lookup,assets/drafters/eagle3,assets/drafters/specblock,assets/drafters/dflash,assets/drafters/blockpilot

.PHONY: run test test-slow clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.run-installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.run-installed

# The main job: the first $(LIMIT) bundled HumanEval prompts decoded by every method side by side on
# the embedded target (greedy; methods interleaved over the bench's default 3 rounds of 16 prompts,
# their order rotating each round), with the table printed, then where the outputs went
# ($(OUT)/humaneval), the fastest method and the command for your own checkpoint. All 164 prompts:
# make run LIMIT=0.
LIMIT ?= 48
run: $(VENV)/.run-installed
	$(VENV)/bin/specblock-bench --target assets/target --prompts assets/prompts/humaneval.jsonl \
	  --methods $(METHODS) --temperatures 0 --max-new-tokens 128 --batch-size 1 --limit $(LIMIT) \
	  --out-dir $(OUT)/humaneval

# The tests, in one worker per CPU core (pytest-xdist): most of their time is single-threaded XLA
# compilation. `make test` runs all but the ones marked slow (each over ~30 s here); `make test-slow`
# runs those; CI runs both (`make test test-slow`), which share JAX's compilation cache (.cache/jax).
test: $(VENV)/.test-installed
	$(PY) -m pytest -q -n auto -m "not slow"

test-slow: $(VENV)/.test-installed
	$(PY) -m pytest -q -n auto -m slow

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
