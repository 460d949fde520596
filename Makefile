# The two commands: `make tutorial` runs every notebook, `make test` runs ruff and pytest.
# Both create .venv from requirements.lock (the one list of exact pins) when needed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV := $(BIN)/uv pip install --python $(BIN)/python
KERNEL := distrl
UNIT_TESTS := $(BIN)/python -m pytest -ra -m "not slow"

.PHONY: install tutorial test test-fast test-versions lab bench lock clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv installs the lock's wheels in parallel: 43 s against pip's 109 s into a new venv on 2
	# cores, the same packages. No cache: it would keep the lock's 3 GB of wheels in ~/.cache.
	# --compile-bytecode (20 s of it) stays: where PYTHONDONTWRITEBYTECODE is set, as on this
	# CI machine, nothing compiles at import time, and the test suite took 20 min, not 12.
	$(BIN)/python -m pip install --quiet $$(grep '^uv==' requirements.lock)
	$(UV) --quiet --no-cache --compile-bytecode -r requirements.lock pip==25.3
	$(UV) --quiet --no-cache --no-deps -e .
	# ipykernel writes the spec in a mkdtemp folder it does not remove: keep that folder in .venv.
	mkdir -p $(VENV)/tmp && TMPDIR=$(VENV)/tmp $(BIN)/python -m ipykernel install --sys-prefix \
		--name $(KERNEL) --display-name "Python (distrl)" >/dev/null && rm -rf $(VENV)/tmp
	touch $(STAMP)

tutorial: install
	$(BIN)/python -m distrl.tutorial --kernel $(KERNEL)

# Two lanes side by side that end together: each takes the next test of a common pool that no
# lane has taken, longest first (tests/lanes.py, from tests/durations.json); tests that share an
# expensive fixture are split before the run and stay in one lane. The second lane runs under a
# TMPDIR of its own, so its Ray sessions, records and temp folders are apart from the first's;
# its report follows the first lane's. Refresh the durations after tests change much:
# make test PYTEST_ARGS=--record-durations=tests/durations.json (pytest-xdist would balance too,
# but its workers share one TMPDIR and its --dist loadgroup silently stops grouping with pytest
# 9.2: pytest-dev/pytest-xdist#1386.)
test: install
	$(BIN)/ruff check .
	@lane_log=$$(mktemp); lane_tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/w-XXXXXX"); claims=$$(mktemp -d); \
	{ TMPDIR=$$lane_tmp $(BIN)/python -m pytest -ra -p no:cacheprovider --durations=15 \
	    --lane 2/2 --lane-claims=$$claims $(PYTEST_ARGS); } >$$lane_log 2>&1 & lane=$$!; \
	$(BIN)/python -m pytest -ra -p no:cacheprovider --durations=15 --lane 1/2 \
	    --lane-claims=$$claims $(PYTEST_ARGS); \
	first_rc=$$?; wait $$lane; lane_rc=$$?; \
	echo "== beside it: the second lane (--lane 2/2) =="; \
	cat $$lane_log; rm -rf $$lane_log $$lane_tmp $$claims; \
	test $$first_rc -eq 0 && test $$lane_rc -eq 0

# The unit layer while you work: no Ray trainings, notebooks, soak or fresh-venv runs.
test-fast: install
	$(BIN)/ruff check .
	$(UNIT_TESTS)

lab: install
	$(BIN)/jupyter lab notebooks/

# Every benchmark, each output kept in benchmarks/results/ with its command (tools/bench.py has
# the list, and the scripts it leaves out with the reason). About an hour on 2 cores.
bench: install
	$(BIN)/python tools/bench.py

# Re-pin after changing pyproject.toml's dependencies (needs the network): one lock for every
# Python the package supports (requires-python), markers where a pin applies to some only.
LOCK_PYTHON := 3.11.5
# uv keeps the pins of its output file where they still resolve: seeded with the lock's own
# (without the GPU pins), a new dependency moves no other pin it need not move.
lock: install
	sed '/^# TensorFlow.s CUDA wheels/,$$d' requirements.lock > /tmp/distrl-lock.txt
	$(BIN)/uv pip compile --quiet --no-cache pyproject.toml --extra dev --universal \
		--python-version $(LOCK_PYTHON) --no-emit-package distrl --no-annotate --no-header \
		-o /tmp/distrl-lock.txt
	{ echo "# Exact pins for Python $(LOCK_PYTHON) to 3.13 on every platform (uv's universal resolution: a line with a"; \
	  echo "# marker applies where it holds). Regenerate with \`make lock\`; never edit by hand."; \
	  cat /tmp/distrl-lock.txt; } > requirements.lock
	echo "# TensorFlow's CUDA wheels for the GPU image (Dockerfile); not installed by make install." >> requirements.lock
	$(BIN)/python tools/gpu_pins.py requirements.lock > /tmp/distrl-gpu-pins
	cat /tmp/distrl-gpu-pins >> requirements.lock

# The unit layer on each Python the package supports, each in a venv of its own (.venv-3.12,
# ...; make install into it, then make test-fast). CI runs `make test` on 3.11 only: the two
# others would take it past its 15 minutes (this target took 5.5 min here, installs included).
# tests/test_packaging.py checks that this list is requires-python's.
OTHER_PYTHONS := 3.12 3.13
test-versions:
	@for v in $(OTHER_PYTHONS); do \
	  echo "== Python $$v =="; \
	  $(MAKE) --no-print-directory test-fast PYTHON=python$$v VENV=.venv-$$v || exit 1; \
	done

clean:
	rm -rf $(VENV) $(OTHER_PYTHONS:%=.venv-%) runs .pytest_cache
