# chtxn: `make test` and `make demo` set everything up on a fresh machine (Python >= 3.10, Java >= 17).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
KEEPER := $(VENV)/keeper/.installed
DEBTOOLS := $(VENV)/debian-tools/.installed

.PHONY: install test test-pure lint demo soak bench check-prereqs clean

SEED     ?= 1
DURATION ?= 600
COMMIT_POINT ?= token

install: $(STAMP) $(KEEPER) $(DEBTOOLS)

check-prereqs:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || \
	  { echo "chtxn needs Python >= 3.10, but '$(PYTHON)' is $$($(PYTHON) --version 2>&1); set PYTHON=/path/to/python3.10+"; exit 1; }
	@command -v java >/dev/null 2>&1 || \
	  { echo "chtxn needs Java 17+ for PySpark, and 'java' is not on PATH: install it (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1); \
	  [ "$${v:-0}" -ge 17 ] || { echo "chtxn needs Java 17+ for PySpark, but 'java' is version $${v:-unknown}: install openjdk-17"; exit 1; }

# constraints.txt pins what the install pulls in to the versions tested (Python 3.11). To refresh it, install
# into a fresh Python 3.11 venv without it (pip install -e '.[embedded,test,lint]'), and below the file's
# header put: pip freeze --exclude-editable | sed 's/$/; python_version == "3.11"/'
$(STAMP): pyproject.toml constraints.txt | check-prereqs
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[embedded,test,lint]'
	@touch $(STAMP)

# ZooKeeper for `chtxn embedded up --keeper`: Debian's packages (apt-get download, no root), unpacked
# under .venv/keeper, nothing installed on the system (embedded/keeper_jars.py says what and why).
$(KEEPER): embedded/keeper_jars.py | $(STAMP)
	$(PY) -m embedded.keeper_jars install $(VENV)/keeper
	@touch $(KEEPER)

# promtool and docker-compose, which check deploy/ and docker-compose.yml in tests/pure: Debian's packages, the
# same way (apt-get download, no root), unpacked under .venv/debian-tools (tools/debian_tools.py says what).
$(DEBTOOLS): tools/debian_tools.py | $(STAMP)
	$(PY) -m tools.debian_tools install $(VENV)/debian-tools
	@touch $(DEBTOOLS)

# --durations: the slowest tests, named at the end, so that a slow suite shows where its time goes.
# -n: pytest-xdist workers, each with embedded servers of its own (tests/conftest.py). 3 on 2 cores: many tests
# wait on leases and timeouts, yet the suite is bound by CPU (about 1,500 CPU-seconds); on 4 the machine stayed
# saturated and tests with timing bounds (a Spark application's start, status windows) failed. --dist loadfile
# keeps a module on one worker (its module-scoped fixtures are made once); --no-loadscope-reorder hands out
# the modules slowest tier first (tests/conftest.py's XDIST_ORDER).
TEST_WORKERS ?= 3
test: install
	$(PY) -m pytest tests --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# ruff (lint, then the formatter in check mode) and mypy; the paths and rules are in pyproject.toml.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: install
	$(VENV)/bin/chtxn demo --events 200000

# A randomized soak: faults drawn from SEED for DURATION seconds, then the exactly-once checks.
# CHANGES=no leaves out the operator's changes (topics re-created, routes, resets, switches).
CHANGES ?= yes
soak: install
	$(PY) -m tests.soak --seed $(SEED) --duration $(DURATION) --commit-point $(COMMIT_POINT) \
		$(if $(filter no,$(CHANGES)),--no-changes,--changes)

# Not part of `make test`: it measures, and takes minutes (benchmarks/README.md).
# make bench [REPS=3] [ARGS="--events 100000 --paced-seconds 15 ..."]
REPS ?= 3
ARGS ?=
bench: install
	PYTHONPATH=$(CURDIR) $(PY) -m benchmarks.bench --reps $(REPS) $(ARGS)

test-pure: install
	$(PY) -m pytest tests/pure

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
