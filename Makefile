# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv demo test test-heavy test-legacy bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: venv
	$(BIN)/python -m hostcall demo

test: venv
	$(BIN)/python -m pytest -q -m "not heavy"

test-heavy: venv
	$(BIN)/python -m pytest -q -m heavy

# Re-runs tests/legacy's programs against jax 0.4.34's host_callback (built in
# .venv-legacy on first use) and checks tests/legacy/expected_legacy.json.
test-legacy: venv
	HOSTCALL_TEST_LEGACY=1 $(BIN)/python -m pytest -q -m legacy tests/legacy

bench: venv
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python benchmarks/run.py

# The documentation site (mkdocs.yml), in strict mode: a broken link or API
# reference fails. Also built by tests/test_docs_site.py.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
