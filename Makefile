# sluice — `make run` serves a demo, `make test` runs every test against
# real servers. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
TEST_FLAGS ?= -race -count=1 -timeout 15m
# Fuzz budgets are execution counts, not durations: with a duration, Go's
# fuzz coordinator can report a spurious "context deadline exceeded" when
# the clock runs out while a worker is mid-call on a loaded machine
# (go.dev/issue/75804, fixed in Go 1.27). A count has no clock to race.
FUZZ_BRIEF ?= 30000x
FUZZTIME ?= 1000000x

.PHONY: test-cluster cluster-up cluster-down help run build test test-timing test-faults unit generate generate-check fuzz vet deps-up deps-down clean appview-test compose-check bench load-build

# WITH_DEPS starts the real servers and exports the environment the tests
# read. It fails the recipe when a server cannot be set up (the
# environment goes through a file that is sourced only if the script
# succeeded, so a failure never turns into an empty environment and
# skipped tests), and sets SLUICE_REQUIRE_DEPS=1: a missing server fails
# a test instead of skipping it, as in CI.
WITH_DEPS = set -euo pipefail; mkdir -p .deps; \
	scripts/test-deps.sh up >.deps/test-env.sh; \
	source .deps/test-env.sh; export SLUICE_REQUIRE_DEPS=1;

help: ## list targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

run: ## install and start memcached, build, seed a demo dataset, serve
	scripts/run.sh

build: ## build bin/sluice
	$(GO) build -o bin/sluice ./cmd/sluice

generate: ## rebuild api/ from proto/ with pinned generators
	scripts/generate.sh

generate-check: generate ## make generate, then fail if api/ or test/appview/gen differ from the committed files (CI runs it)
	@git diff --exit-code --stat -- api/ test/appview/gen || { echo "generate-check: generated code differs from proto/; run make generate and commit the result"; exit 1; }
	@new=$$(git ls-files --others --exclude-standard -- api/ test/appview/gen); \
	test -z "$$new" || { echo "generate-check: make generate wrote files that are not committed:"; echo "$$new"; exit 1; }

vet: ## go vet, the structure analyzer (internal/structcheck), gofmt, staticcheck (pinned, installed into .tools/)
	$(GO) vet ./...
	$(GO) build -o .tools/bin/sluice-vet ./cmd/sluice-vet
	$(GO) vet -vettool="$$PWD/.tools/bin/sluice-vet" ./...
	"$$(scripts/tools.sh staticcheck)" ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: vet ## start real servers, run all tests and brief fuzzing
	$(WITH_DEPS) \
	$(GO) test $(TEST_FLAGS) ./...; \
	$(TIMING_CMD); \
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZ_BRIEF); \
	$(MAKE) --no-print-directory compose-check

TIMING_TESTS ?= TestIncidentMix|TestOverloadShedsAndKeepsGoodput
TIMING_CMD = $(GO) test -count=1 -timeout 10m -run '$(TIMING_TESTS)' ./internal/app/
test-timing: ## the latency-ratio tests, without the race detector (make test runs them)
	$(WITH_DEPS) $(TIMING_CMD)

test-faults: ## fault scenarios again with 10x longer phases (a few minutes; CI runs it after test)
	$(WITH_DEPS) \
	SLUICE_FAULTS_SOAK=1 $(GO) test $(TEST_FLAGS) -count=1 -v ./internal/faults/

fuzz: ## run each fuzz target for FUZZTIME executions (default 1000000x, a few minutes)
	scripts/fuzz.sh $(FUZZTIME)

test-cluster: ## three Cassandra nodes at RF 3, three memcached, two replicas: lose one of each under load (CI runs it after test-faults)
	scripts/test-cluster.sh

cluster-up: ## start a three-node Cassandra cluster on 127.0.0.11-13 (CLUSTER_NODES=3) and print its environment
	scripts/cassandra-cluster.sh up $(or $(CLUSTER_NODES),3)

cluster-down: ## stop that cluster
	scripts/cassandra-cluster.sh down

deps-up: ## start the servers tests use and print their environment
	scripts/test-deps.sh up

deps-down: ## stop them
	scripts/test-deps.sh down

clean: ## remove build outputs and local data
	rm -rf bin .data test-artifacts

appview-test: ## the AppView's client stack (Node.js, connect-es) against a seeded sluice
	$(WITH_DEPS) $(GO) test -count=1 -v -run . ./test/appview/

compose-check: ## validate docker-compose.yml with docker-compose config (no engine needed)
	scripts/compose-check.sh

bench: ## measure sluice beside raw memcached, the store, the naive baseline and gocql; write docs/benchmarks.md
	scripts/bench.sh
	scripts/bench-cql.sh

load-build: ## build bin/sluice-load
	$(GO) build -o bin/sluice-load ./cmd/sluice-load
