# hostcore: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= ./data
RUNDIR ?= ./run

.PHONY: install test lint run serve bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "hostcore needs Python >= 3.11"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check host outbox tests scripts
	$(BIN)/ruff format --check host outbox tests scripts
	$(BIN)/mypy --strict host outbox

test: lint
	$(BIN)/python -m pytest -q

run: $(STAMP)
	$(BIN)/python scripts/demo.py --data-dir $(DATA)

serve: $(STAMP)
	mkdir -p -m 0700 $(RUNDIR)
	$(BIN)/python -m host serve --data-dir $(DATA) --socket $(RUNDIR)/host.sock

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
