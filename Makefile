# Two entry points for a fresh machine with Python >= 3.11 and pip (see README):
#   make run   - install into .venv and run the main job on the embedded default
#   make test  - install into .venv with the test extras and run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
OUT := outputs

.PHONY: run test clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.run-installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.run-installed

run: $(VENV)/.run-installed
	@if [ -f assets/target/config.json ]; then target="--target assets/target"; \
	else echo "assets/target not built yet: decoding with a random tiny target"; target="--random-target"; fi; \
	$(VENV)/bin/specblock-decode $$target --prompts assets/prompts/humaneval.jsonl \
	  --out $(OUT)/humaneval_greedy.jsonl --max-new-tokens 128 --batch-size 8

# pytest exits 5 when it collects no test; make treats any non-zero exit as failure.
test: $(VENV)/.test-installed
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
