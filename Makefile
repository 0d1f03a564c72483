# One entry point for every task; each target installs what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
BUF := node_modules/.bin/buf
# The list of modules the strict editable install links; rewritten only when it changes.
MODULES := build/modules.txt
TYPED := server client bench cluster tests

.PHONY: all install proto lint-proto lint typecheck check test test-all serve compare bench bench-compaction fuzz fuzz-big soak faults clean \
	bench-fairness bench-memory \
	postgres replicas failover replicas-throughput handoff-bench node-deps interop burst

all: check test

# A strict editable install lays the sources out under their installed names as a tree of
# links that type checkers and editors follow; edits are seen at once, but a module added or
# removed needs a new link, so the install depends on the module list.
$(MODULES): FORCE
	@mkdir -p $(@D)
	@find server client bench cluster codec protos \( -name '*.py' -o -name '*.proto' -o -name py.typed \) \
		-not -name '*_pb2*' -not -path 'protos/bidi_responses/v1/__init__.py' | LC_ALL=C sort > $@.new
	@cmp -s $@.new $@ && rm $@.new || mv $@.new $@

$(INSTALLED): pyproject.toml setup.py tools/gen_protos.py $(MODULES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' --config-settings editable_mode=strict
	touch $@

FORCE:

install: $(INSTALLED)

# Generated code is never committed: regenerate whenever the proto changes.
proto: $(INSTALLED)
	$(PY) tools/gen_protos.py

$(BUF): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

lint-proto: $(BUF)
	$(BUF) lint

# The Node SDK test's packages, installed here rather than inside the test (its timeout).
NODE_SDK := tests/node/node_modules/.installed
$(NODE_SDK): tests/node/package.json tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The pinned npm packages: buf, and @grpc/grpc-js + @grpc/proto-loader for the Node client test.
node-deps: $(BUF) $(NODE_SDK)

# mypy --strict over the installed package (through the editable install's link tree) and the tests.
typecheck: proto
	$(VENV)/bin/mypy -p bidi_responses.server -p bidi_responses.client -p bidi_responses.bench \
		-p bidi_responses.cluster -p bidi_responses.codec -p tests

lint: proto lint-proto typecheck
	$(VENV)/bin/ruff check server client bench cluster tests tools examples setup.py codec
	$(VENV)/bin/ruff format --check server client bench cluster tests tools examples setup.py codec

# Lint and types; `make test` runs the suite. CI runs both.
check: lint

test: proto node-deps postgres
	$(PY) -m pytest -q

# Everything, including the slow tests.
test-all: proto
	$(PY) -m pytest -q -m "slow or not slow"

# Timed micro-benchmarks and the post-inference benchmark (not part of `make test`).
bench: proto
	$(PY) -m pytest -q tests/bench/test_micro.py --benchmark-enable
	$(PY) -m bidi_responses.bench.post_inference --turns 25 --repeats 3

# What compaction saves on the headline rollout (docs/results.md, "Compaction").
bench-compaction: proto
	$(PY) -m bidi_responses.bench.compaction --repeats 5

# Heavy fault runs with real processes and signals (not part of `make test`, which runs their
# smoke versions): SIGKILL 20 times under 100 streams, a full disk under load, 2,000 streams of
# 100k tokens under a 256 MB cache budget, 40 clients that never read. Prints the figures.
faults: proto
	$(PY) -m pytest -q -s -m faults tests/faults

serve: proto
	$(VENV)/bin/bidi-responses serve

compare: proto
	$(VENV)/bin/bidi-responses compare --out bench-out

# Hostile input over every transport (hypothesis): FUZZ_INPUTS inputs, a summary table.
FUZZ_INPUTS ?= 10000
fuzz: proto
	$(PY) -m tests.fuzz.run --inputs $(FUZZ_INPUTS)

# Huge (10 MB) inputs over every transport mixed with small streams that keep taking turns:
# 0 hangs, 0 5xx/INTERNAL/UNKNOWN, and the small streams progress meanwhile.
FUZZ_BIG_INPUTS ?= 40
fuzz-big: proto
	$(PY) -m tests.fuzz.big --inputs $(FUZZ_BIG_INPUTS)

# Bounded work per request (docs/results.md, "Bounded work per request"): a small stream's
# turn time while another client sends 10 MB creates; RSS under 16 parallel 64 MiB messages.
bench-fairness: proto
	$(PY) -m bidi_responses.bench.fairness latency
bench-memory: proto
	$(PY) -m bidi_responses.bench.fairness memory

# N agents x T turns per transport on one server; SOAK_ARGS=--full runs 200 x 25.
SOAK_ARGS ?=
soak: proto
	$(PY) -m bidi_responses.bench.soak $(SOAK_ARGS)

# A burst of 3,000 Connect opens: each stream completes or gets a clear status (docs/mesh.md).
burst: proto
	$(PY) -m bidi_responses.bench.mesh_burst --opens 3000 --connections 30

# The chained Connect loop in Go, built from Debian's grpc-go and protobuf packages (offline),
# run against a server this target starts. See interop/go/README.md.
interop: proto
	bash interop/go/run.sh

# PostgreSQL's server (Debian) for the shared-store tests and the replica targets; the tests
# that need it skip, saying why, where it cannot be installed.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update && apt-get install -y --no-install-recommends postgresql) || \
		echo "warning: PostgreSQL could not be installed; its tests will skip"

# N replicas on one PostgreSQL behind one Envoy, until Ctrl-C (docs/replicas.md).
N ?= 3
replicas: proto postgres
	$(PY) -m bidi_responses.cluster.replicas -n $(N)

# 50 agents x 20 turns through Envoy over 3 replicas; one killed, one drained mid-run.
failover: proto postgres
	$(PY) -m bidi_responses.cluster.failover failover --agents 50 --turns 20

# Turns per second through Envoy with 1, 2 and 3 replicas (they share this machine's cores).
replicas-throughput: proto postgres
	$(PY) -m bidi_responses.cluster.failover throughput --replicas 1,2,3 --repeats 3 \
		--agents 50 --turns 20 --sim-ttft-ms 0 --sim-tps 1000000

# A resumed stream restored from the shared tier vs a full re-render, at ~100k tokens.
handoff-bench: proto postgres
	$(PY) -m bidi_responses.bench.handoff --history-tokens 100000 --repeats 5

clean:
	rm -rf $(VENV) node_modules build bench-out .bidi-responses
