# The two commands a newcomer runs:  make demo   and   make test
# Everything else is what they call. The virtualenv lives in .venv; the control-plane
# binaries are built once into ~/.cache/shoal/devcluster/<versions> (SHOAL_DEVCLUSTER_CACHE).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv devcluster browser faketime slurm images lint unit integration test demo clean

$(STAMP): pyproject.toml worker/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ./worker -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

devcluster: $(STAMP)
	$(PY) -m devcluster build

# Chromium from Debian's packages for the web view's browser tests (root installs it; without
# it those tests are skipped, saying why).
browser: $(STAMP)
	-$(PY) -m devcluster browser

# libfaketime from Debian's packages for the agent's clock-skew test, which also moves the
# agent's whole clock with it (root installs it; without it that case is skipped, saying why).
faketime: $(STAMP)
	-$(PY) -m devcluster faketime

# Debian's Slurm (slurmctld, slurmd, slurm-client, munge) for tests/integration/slurm/ (root
# installs it, starting no service; no-op when installed; without it those tests are skipped,
# saying why). See slurmcluster/install.py.
slurm: $(STAMP)
	-$(PY) -m slurmcluster install

# The two images, built with podman from Debian's packages (no registry, no Docker), as OCI
# archives: build/shoal-scheduler.oci.tar and build/shoal-agent.oci.tar. Installs podman, runc
# and mmdebstrap as root when missing; needs no virtualenv. See devcluster/images.py.
images:
	$(PYTHON) -m devcluster.images build

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: $(STAMP)
	$(PY) -m pytest tests/unit

integration: devcluster browser faketime slurm
	$(PY) -m pytest tests/integration

# Lint, type-check, layer contracts, then every test (unit and integration) in one run, on
# TEST_WORKERS pytest-xdist workers, each with its own devcluster (most of a test's time is spent
# waiting on the cluster, so more workers than cores pay). A module or folder that shares one
# costly fixture runs on one worker; the tests that took longest in the last run start first
# (tests/conftest.py, from pytest's cache); the ten slowest are printed at the end (pyproject's
# --durations=10). TEST_WORKERS=0 runs them in one process.
# Each run's temporary folders (devclusters, logs) go in a folder of its own, TEST_TMP-<time it
# started>, TEST_TMP naming the checkout; the last three runs of a checkout are kept (newest last
# in `ls`). In pytest's shared /tmp/pytest-of-USER, a session ending deletes all but the last three
# sessions' folders, even one still in use, so a second run on the machine (another checkout's
# make test, a focused pytest) deleted this one's devclusters under it. A new folder per run also
# starts clean whatever an interrupted run left (a mount pytest could not remove). The name is
# short: unix sockets under it (the demo's, about 70 characters below it) must stay within 107
# bytes.
TEST_WORKERS ?= 4
TEST_TMP ?= /tmp/shoal-$(shell printf '%s' '$(CURDIR)' | md5sum | cut -c1-4)
test: lint devcluster browser faketime slurm images
	@ls -1d $(TEST_TMP)-*/ 2>/dev/null | sort | head -n -2 | xargs -r rm -rf || true
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --basetemp=$(TEST_TMP)-$$(date +%s)

demo: devcluster
	$(PY) -m demo

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
