# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: venv demo test test-heavy test-compositions test-jit-differential test-legacy test-matrix test-jax bench docs clean

# One venv; each extra installed into it once, with its own stamp
# (.venv/.installed-demo, .venv/.installed-test, ...), so that `make demo`
# installs only what the demo needs and a later `make test` adds the rest.
venv: $(VENV)/.installed-test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The native extension is compiled by the install (CMakeLists.txt); a
# change to its C++ sources installs again. Here it is compiled against the
# venv's own jaxlib, without pip's isolated build environment (which would
# install a second jaxlib, and SciPy, only to read its headers: about 15 s):
# the build requirements go into the venv first. `pip install .` elsewhere
# builds in isolation, against the oldest jaxlib (pyproject.toml).
NATIVE := CMakeLists.txt $(wildcard src/hostcall/*.cc src/hostcall/*/*.cc src/hostcall/*/*/*.cc \
  src/hostcall/*.h src/hostcall/*/*.h src/hostcall/*/*/*.h)
# (CMake and Ninja from the package index only where the system has none,
# as pip's isolated build would.)
BUILD_REQUIRES := scikit-build-core>=0.11 $(if $(shell command -v cmake),,cmake>=3.18) $(if $(shell command -v ninja),,ninja)
PIP := -m pip install --quiet --disable-pip-version-check
# jaxlib as pyproject.toml's dependencies give it ("jaxlib>=0.8.0,<0.13").
JAXLIB = $(shell $(PYTHON) -c 'import tomllib; print(next(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith("jaxlib")))')

# An editable install maps each module to its file when installed: adding,
# removing or moving a Python file installs again too. The list of them is
# kept in .venv/.python-files, rewritten (when make reads this file) only
# when it changes, so that its date says when the list last changed.
PY_FILES := $(sort $(shell find src/hostcall -name '*.py' -not -path '*/__pycache__/*' 2>/dev/null))
$(shell mkdir -p $(VENV) && (echo '$(PY_FILES)' | cmp -s - $(VENV)/.python-files || echo '$(PY_FILES)' > $(VENV)/.python-files))

$(VENV)/.installed-%: pyproject.toml $(NATIVE) $(VENV)/.python-files | $(BIN)/python
	$(BIN)/python $(PIP) $(foreach r,$(BUILD_REQUIRES),'$(r)') '$(JAXLIB)'
	$(BIN)/python $(PIP) --no-build-isolation -e '.[$*]'
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/python -m hostcall demo

# The suite prints a dot a test; say first how long it takes.
TEST_MINUTES := 15
test: $(VENV)/.installed-test
	@echo "make test: about $(TEST_MINUTES) minutes on 2 CPU cores (fewer with more); one dot per test, F for a failure"
	$(BIN)/python -m pytest -q -m "not heavy"

test-heavy: venv
	$(BIN)/python -m pytest -q -m heavy

# The composition matrix's heavier cells and its longer random programs
# (tests/test_composition_matrix.py), and the drop-in harness's
# (tests/test_drop_in.py, with its HOSTCALL_NATIVE=0 run); `make test`
# runs the rest: CI runs it.
test-compositions: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider -m heavy tests/test_composition_matrix.py tests/test_drop_in.py

# Every tap test program again under hostcall.jit, both its routes
# (tests/test_jit_differential.py, about 4 minutes): CI runs it.
test-jit-differential: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider -m heavy tests/test_jit_differential.py

# Re-runs tests/legacy's programs against jax 0.4.34's host_callback (built in
# .venv-legacy on first use) and checks tests/legacy/expected_legacy.json.
test-legacy: venv
	HOSTCALL_TEST_LEGACY=1 $(BIN)/python -m pytest -q -m legacy tests/legacy

# The oldest and newest JAX releases pyproject.toml admits, each in its own
# venv (.venv-jax-<version>), the whole suite on each. JAX 0.11 and later
# need Python 3.12: the newest runs where python3.12 is found.
JAX_OLDEST := 0.8.0
JAX_NEWEST := 0.12.0.1
# A python3.12 that runs (a pyenv shim may name a version not activated).
PYTHON312  ?= $(shell for p in python3.12 $$(ls -d $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12 2>/dev/null); do "$$p" -c "" 2>/dev/null && echo "$$p" && break; done)

test-matrix:
	$(MAKE) test-jax JAX_VERSION=$(JAX_OLDEST) JAX_PYTHON=$(PYTHON)
	@if [ -n "$(PYTHON312)" ]; then \
	  $(MAKE) test-jax JAX_VERSION=$(JAX_NEWEST) JAX_PYTHON=$(PYTHON312); \
	else echo "test-matrix: no python3.12, so JAX $(JAX_NEWEST) is not tested"; fi

test-jax:
	@test -n "$(JAX_VERSION)" || (echo "usage: make test-jax JAX_VERSION=0.8.0"; exit 2)
	test -f .venv-jax-$(JAX_VERSION)/.installed || ( \
	  $(JAX_PYTHON) -m venv .venv-jax-$(JAX_VERSION) && \
	  .venv-jax-$(JAX_VERSION)/bin/python -m pip install --quiet --upgrade pip && \
	  .venv-jax-$(JAX_VERSION)/bin/python $(PIP) $(foreach r,$(BUILD_REQUIRES),'$(r)') \
	    jaxlib==$(JAX_VERSION) && \
	  .venv-jax-$(JAX_VERSION)/bin/python $(PIP) --no-build-isolation \
	    -e '.[test]' jax==$(JAX_VERSION) jaxlib==$(JAX_VERSION) && \
	  touch .venv-jax-$(JAX_VERSION)/.installed )
	.venv-jax-$(JAX_VERSION)/bin/python -m pytest -q -m "not heavy" -p no:cacheprovider

bench: $(VENV)/.installed-test $(VENV)/.installed-bench
	$(BIN)/python benchmarks/run.py

# The documentation site (mkdocs.yml), in strict mode: a broken link or API
# reference fails. Also built by tests/test_docs_site.py.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) .venv-jax-* build src/*.egg-info .pytest_cache
