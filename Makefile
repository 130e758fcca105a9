# The README's commands. `make test` is what CI runs (.ci/run).
.PHONY: setup run test lint images bench

PYTHON_VENV := .venv/bin/python
# Extra flags for scripts/setup.sh, e.g. make test SETUP_FLAGS=--no-criu
SETUP_FLAGS ?=
# Images for `make images`, e.g. make images IMAGES=reward-model (empty: python langs)
IMAGES ?=
ARGS ?=

setup:
	bash scripts/setup.sh $(SETUP_FLAGS)

run: setup
	.venv/bin/sandboxd serve $(ARGS)

# pytest exits 5 when it collects no tests: not a failure while the suite is growing.
# The slowest tests are listed at the end, to keep the suite's time in sight (CI allows 90 min; we aim under 15).
test: setup
	.venv/bin/ruff check .
	.venv/bin/mypy
	$(PYTHON_VENV) -m pytest -q --durations=15 $(ARGS) || [ $$? -eq 5 ]

lint:
	.venv/bin/ruff check .
	.venv/bin/mypy

images:
	$(PYTHON_VENV) -m sandboxd.images build $(IMAGES)

bench: setup
	$(PYTHON_VENV) bench/run.py $(ARGS)
