# Two commands on a fresh Debian/Ubuntu machine with Python 3.11 and Node 20:
#   make demo   installs, then runs the pipeline on the embedded synthetic data through a local Slurm cluster
#   make screen the same for a synthetic screen: fields of view and label masks, cut into cells by `ingest`
#   make test   installs, then runs the linter and the whole test suite (infra, training, Slurm integration)
#   make test-quick   the unit tests only (no Slurm, no end-to-end runs, no synthesis): a few minutes
# Installs are idempotent: stamps are rebuilt only when a requirements file changes.

PYTHON ?= python3
VENV := .venv
PCLUSTER_VENV := .venv-pcluster
CHECKOV_VENV := .venv-checkov
PYTEST_ARGS ?=
# make test's pytest-xdist workers: the Slurm tests in one, the rest beside them, a file at a time (tests/conftest.py
# says why); 0 runs them all in one process, one after another, as before.
TEST_WORKERS ?= 2

export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: install system-deps demo screen test test-quick synth lint clean

install: system-deps $(VENV)/.installed $(PCLUSTER_VENV)/.installed $(CHECKOV_VENV)/.installed node_modules/.installed

system-deps:
	scripts/install-system-deps.sh

$(VENV)/.installed: requirements.txt requirements-infra.txt requirements-dali.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q -r requirements-dev.txt
	$(VENV)/bin/pip install --disable-pip-version-check -q --no-deps -e .
	touch $@

$(PCLUSTER_VENV)/.installed: requirements-pcluster.txt
	$(PYTHON) -m venv $(PCLUSTER_VENV)
	$(PCLUSTER_VENV)/bin/pip install --disable-pip-version-check -q -r requirements-pcluster.txt
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --disable-pip-version-check -q -r requirements-checkov.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: install
	scripts/demo.sh

screen: install
	scripts/screen.sh

test: install lint
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

test-quick: install
	$(VENV)/bin/python -m pytest -m "not slow and not slurm" $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check training stacks tests scripts app.py examples

synth: install
	npx cdk synth --quiet

# The runs the targets write under runs/, each with its generated data inside it: make demo's
# (configs/demo.yaml), make screen's (configs/screen.yaml) and the new plates that docs/training.md
# profiles with make screen's model (configs/screen_new_plates.yaml). Other runs there are the user's.
MADE_RUNS := runs/demo runs/screen runs/screen_new_plates

clean:
	rm -rf cdk.out $(MADE_RUNS) .pytest_cache
