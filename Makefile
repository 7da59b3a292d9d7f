# hostcore: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= ./data
RUNDIR ?= ./run

.PHONY: install test lint run demo serve stop schema bench chaos clean

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
	@$(MAKE) --no-print-directory ts-test

run: $(STAMP)
	$(BIN)/python -m outbox drive --data-dir $(DATA)
	$(BIN)/python -m host verify --data-dir $(DATA)/host

demo: $(STAMP)
	$(BIN)/python scripts/demo.py --data-dir $(DATA)/demo

# The host as a local background service on $(RUNDIR)/host.sock; `make stop` ends it.
serve: $(STAMP)
	mkdir -p -m 0700 $(RUNDIR)
	nohup $(BIN)/python -m host serve --data-dir $(DATA)/service --socket $(RUNDIR)/host.sock \
		>>$(RUNDIR)/host.log 2>&1 & echo $$! > $(RUNDIR)/host.pid
	for i in $$(seq 100); do test -S $(RUNDIR)/host.sock && break; kill -0 $$(cat $(RUNDIR)/host.pid) 2>/dev/null || break; sleep 0.1; done
	kill -0 $$(cat $(RUNDIR)/host.pid) 2>/dev/null && test -S $(RUNDIR)/host.sock \
		&& echo "host serving on $(RUNDIR)/host.sock (pid $$(cat $(RUNDIR)/host.pid), log $(RUNDIR)/host.log)" \
		|| { echo "host did not start: $$(tail -1 $(RUNDIR)/host.log)"; rm -f $(RUNDIR)/host.pid; exit 1; }

# SIGTERM, then wait for the exit (in-flight calls finish; a slow client is waited for
# up to 30 s), so that a `make serve` right after finds the data dir free.
stop:
	test -f $(RUNDIR)/host.pid || exit 0; pid=$$(cat $(RUNDIR)/host.pid); kill $$pid 2>/dev/null; \
	for i in $$(seq 400); do kill -0 $$pid 2>/dev/null || break; sleep 0.1; done; rm -f $(RUNDIR)/host.pid

schema: $(STAMP)
	$(BIN)/python scripts/gen_schema.py
	$(BIN)/python scripts/gen_protocol_doc.py

# The bench's peer (LangGraph's AsyncSqliteSaver) is an extra: `make test` never needs it.
$(VENV)/.bench-installed: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python scripts/bench.py

chaos: $(STAMP)
	$(BIN)/python scripts/chaos.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache

# The TypeScript part of `make test` (clients/typescript): the schema read by
# json-schema-to-typescript and quicktype and compiled with tsc --strict, and the client's
# tests against the real host. Its tools are pinned in clients/typescript/package-lock.json
# and installed by `npm ci` (npm's cache in .cache/npm). Skipped, saying so, without node >= 20.
TS := clients/typescript
.PHONY: ts-test ts-run

ts-test: $(STAMP)
	@major=$$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0); \
	if [ "$$major" -ge 20 ] && command -v npm >/dev/null; then \
		$(MAKE) --no-print-directory ts-run; \
	else \
		echo "SKIPPED: the TypeScript schema and client tests (clients/typescript) need node >= 20" \
			"and npm on the PATH; found node $$(node --version 2>/dev/null || echo none)."; \
	fi

$(TS)/node_modules/.installed: $(TS)/package-lock.json
	cd $(TS) && npm ci --cache "$(CURDIR)/.cache/npm" --no-audit --no-fund --loglevel=error
	touch $@

ts-run: $(TS)/node_modules/.installed
	cd $(TS) && npm run --silent build
	cd $(TS) && HOSTCORE_PYTHON="$(CURDIR)/$(BIN)/python" npm test --silent
