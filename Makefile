# hostcore: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= ./data
RUNDIR ?= ./run
JOBS   ?= auto
LOCK   := requirements/dev.lock
PIP    := $(BIN)/python -m pip --disable-pip-version-check
UV     := uv==0.13.9
# pi, the coding agent, as the agent runtime (README: "pi as the agent"). `make run-pi` uses
# your own pi and its settings; `make test-pi` installs PI_VERSION into .cache/pi (~200 MB).
PI_COMMAND ?= pi --mode rpc
PI_VERSION ?= 0.73.1
PI_CACHE   := .cache/pi
PI_STAMP   := $(PI_CACHE)/.installed-$(PI_VERSION)

.PHONY: install lock test lint run run-pi test-pi demo serve stop schema bench chaos clean

install: $(STAMP)

# Pinned versions with their hashes (requirements/dev.lock: the runtime, test and dev
# extras and the build backend), then the project itself, built with the locked backend.
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "hostcore needs Python >= 3.11"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --require-hashes --no-deps -r $(LOCK)
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PIP) check >/dev/null || { $(PIP) check; echo "$(LOCK) lacks what pyproject.toml needs: run make lock"; exit 1; }
	touch $(STAMP)

# Re-resolve every pin to the newest release pyproject.toml allows, on every platform and
# Python >= 3.11 at once (uv's universal resolution), with the hashes of all their files.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(UV)
	$(BIN)/uv pip compile pyproject.toml requirements/build.in --extra test --extra dev \
		--universal --python-version 3.11 --generate-hashes --upgrade \
		--custom-compile-command 'make lock' -q -o $(LOCK)

lint: $(STAMP)
	$(BIN)/ruff check host hostview outbox tests scripts
	$(BIN)/ruff format --check host hostview outbox tests scripts
	$(BIN)/mypy --strict host hostview outbox

# pytest-xdist: one worker per CPU (JOBS=1 for one process, JOBS=4 for four). The project's
# modules are byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (some shells and
# sandboxes set it) each of the hundreds of Python processes the suite starts (hosts,
# mostly) would otherwise compile them again from source (~50 ms of CPU each).
test: lint
	$(BIN)/python -m compileall -q host hostview outbox scripts
	$(BIN)/python -m pytest -q -n $(JOBS)
	@$(MAKE) --no-print-directory ts-test

run: $(STAMP)
	$(BIN)/python -m outbox drive --data-dir $(DATA)
	$(BIN)/python -m host verify --data-dir $(DATA)/host

run-pi: $(STAMP)
	$(BIN)/python -m outbox drive --agent pi --pi-command "$(PI_COMMAND)" --data-dir $(DATA)/pi
	$(BIN)/python -m host verify --data-dir $(DATA)/pi/host

# Opt-in: pi from the npm registry into a git-ignored cache, then tests/live against a
# loopback mock model (scripts/mock_llm.py). `make test` skips tests/live.
$(PI_STAMP):
	mkdir -p $(PI_CACHE)
	npm install --prefix $(PI_CACHE) --no-audit --no-fund --loglevel=error \
		@mariozechner/pi-coding-agent@$(PI_VERSION)
	touch $@

test-pi: $(STAMP) $(PI_STAMP)
	HOSTCORE_PI=$(abspath $(PI_CACHE))/node_modules/.bin/pi $(BIN)/python -m pytest -q -s -rs tests/live

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
	$(PIP) install -q --no-build-isolation -e '.[bench]'
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
