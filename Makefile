# Floodgate — `make help` lists the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help
GO ?= go
# Go 1.27.3, taken from the Go module proxy on first use (about 10 s): the standard library of
# the machine's 1.26.8 has reachable vulnerabilities (docs/security.md, S11). Every `go` command
# run by make, its scripts and the tests they start inherits it.
export GOTOOLCHAIN := go1.27.3
STACK := deploy/local/stack.sh
BIN := .local/bin
# The local stack's DynamoDB; services treat an unset endpoint as AWS.
export FLOODGATE_DYNAMODB_ENDPOINT ?= http://127.0.0.1:8000

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: install-stack
install-stack: ## install Redis, DynamoDB Local, InfluxDB 1.8.10, the Kafka-protocol broker and the tests' HTTP/2 tools (nghttp2-client) (idempotent)
	@$(STACK) install

.PHONY: up
up: ## start the local stack (installs what is missing; fast when already running)
	@$(STACK) up

.PHONY: down
down: ## stop the local stack (data is kept; `deploy/local/stack.sh purge` deletes it)
	@$(STACK) down

.PHONY: status
status: ## show each local component, its port and health
	@$(STACK) status

.PHONY: migrate
migrate: ## apply the versioned migrations (topics, tables, InfluxDB database) to the local stack
	@$(GO) run ./migrations/cmd/migrate

.PHONY: build
build: ## build every service and tool into .local/bin
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./services/... ./migrations/cmd/migrate ./loadtest/cmd/...

.PHONY: demo
demo: build ## run the whole pipeline and the console on the local stack: people, services and two abusers, the verdict, then the console stays browsable (Ctrl-C stops all it started)
	@deploy/local/stack.sh install telegraf >/dev/null
	@FLOODGATE_WITH_CLUSTER=0 deploy/local/with-stack.sh bash -c '$(BIN)/migrate >/dev/null && $(BIN)/demo $(DEMO_ARGS)'

.PHONY: test
test: ## install and start what is needed, run unit and integration tests on the real stack, stop what was started
	@deploy/local/browser.sh >/dev/null
	@deploy/local/stack.sh install telegraf >/dev/null
	@deploy/local/with-stack.sh bash -c '$(GO) run ./migrations/cmd/migrate >/dev/null && $(GO) test -count=1 -timeout 20m ./...'

.PHONY: test-unit
test-unit: ## unit tests only (no stack): pure logic, codecs, fuzz seeds
	$(GO) test -count=1 -short ./...

.PHONY: bench
bench: ## run the benchmark suite on the local stack; writes docs/benchmarks.md and its plots in docs/bench/ (BENCH_ARGS="-quick -only limiter,pipeline,detector,ledger")
	@FLOODGATE_WITH_CLUSTER=0 deploy/local/with-stack.sh bash -c '$(GO) run ./migrations/cmd/migrate >/dev/null && $(GO) run ./loadtest/cmd/benchreport $(BENCH_ARGS)'

.PHONY: bench-peer
bench-peer: ## the limiter beside envoy ratelimit and the do-nothing floors, pinned (service under test alone on cpu 1; generator, a private Redis and broker on cpu 0), each saturating a 0.3-core quota; PEER_ARGS="-duration 10s -rounds 4 -profile DIR"
	$(GO) run ./loadtest/cmd/peerbench -duration 10s -rounds 2 -rate 0 -quota 0.3 -callers 256 $(PEER_ARGS)

FUZZ_TARGETS := \
	./pkg/events/:FuzzDecodeDecision ./pkg/events/:FuzzDecodeAbuse ./pkg/events/:FuzzDecodeAdjustment ./pkg/events/:FuzzDecodeDeferred \
	./pkg/events/:FuzzParseIP ./pkg/events/:FuzzParseTime ./pkg/events/:FuzzValidRoute ./pkg/events/:FuzzParsePrincipalKey \
	./pkg/redisx/:FuzzEscape ./pkg/journal/:FuzzJournalRecord ./pkg/journal/:FuzzJournalSegmentScan \
	./services/adjuster/internal/signals/:FuzzQuote ./services/adjuster/internal/simulate/:FuzzReadCSV \
	./services/dlq-auditor/internal/auditor/:FuzzParseID ./services/dlq-auditor/internal/auditor/:FuzzScrubBytes

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME each (default 30s)
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn ($$pkg)"; $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $${FUZZTIME:-30s} $$pkg || exit 1; done

.PHONY: chaos
chaos: ## fault scenarios under load (broker kill, Redis restart, consumer SIGKILL, DynamoDB errors, InfluxDB/PagerDuty down); writes docs/chaos.md
	@FLOODGATE_WITH_CLUSTER=0 deploy/local/with-stack.sh bash -c '$(GO) run ./loadtest/cmd/chaos $(CHAOS_ARGS)'

.PHONY: generate
generate: ## regenerate the event codec (pkg/events/*_gen.go) from schemas/*.json
	$(GO) generate ./pkg/events

.PHONY: lint
GOLANGCI_VERSION := v2.15.0
lint: ## gofmt, go vet, golangci-lint (.golangci.yml; installed once into .local/bin), and the generated event codec up to date with schemas/
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	@set -euo pipefail; bin="$(CURDIR)/$(BIN)"; mkdir -p "$$bin"; \
	if ! "$$bin/golangci-lint" version 2>/dev/null | grep -q 'version $(patsubst v%,%,$(GOLANGCI_VERSION))'; then \
		echo "lint: installing golangci-lint $(GOLANGCI_VERSION) into $(BIN) (once, about 2 minutes)"; \
		GOBIN="$$bin" $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION); \
	fi; \
	"$$bin/golangci-lint" run --max-issues-per-linter 0 --max-same-issues 0 ./...
	$(GO) test -count=1 -run '^TestGeneratedCodeIsFresh$$' ./pkg/events/

# ---- security (docs/security.md) --------------------------------------------------------
VULN_VERSION := v1.9.0
VULNDB_VERSION := v0.0.0-20261105234957-e22db6528018
VULNDB_DIR := $(CURDIR)/.local/vulndb

.PHONY: vuln
vuln: ## govulncheck v1.9.0 on every package against GOVULNDB (default: a local copy in .local/vulndb, built once from golang.org/x/vulndb; offline after that)
	@set -euo pipefail; bin="$(CURDIR)/$(BIN)"; mkdir -p "$$bin"; \
	if ! "$$bin/govulncheck" -version 2>/dev/null | grep -q 'govulncheck@$(VULN_VERSION)'; then \
		echo "vuln: installing govulncheck $(VULN_VERSION) into $(BIN)"; \
		GOBIN="$$bin" $(GO) install golang.org/x/vuln/cmd/govulncheck@$(VULN_VERSION); \
	fi; \
	if [ -z "$${GOVULNDB:-}" ] && [ ! -f "$(VULNDB_DIR)/index/db.json" ]; then \
		echo "vuln: building $(VULNDB_DIR) from golang.org/x/vulndb@$(VULNDB_VERSION) (once)"; \
		src=$$(cd "$$(mktemp -d)" && $(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
		test -d "$$src/data/osv" || { echo "vuln: no data/osv in golang.org/x/vulndb@$(VULNDB_VERSION)" >&2; exit 1; }; \
		rm -rf "$(VULNDB_DIR).tmp"; \
		$(GO) run golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION) -vulns "$$src/data/osv" -out "$(VULNDB_DIR).tmp"; \
		rm -rf "$(VULNDB_DIR)"; mv "$(VULNDB_DIR).tmp" "$(VULNDB_DIR)"; \
	fi; \
	db="$${GOVULNDB:-file://$(VULNDB_DIR)}"; \
	echo "vuln: $$("$$bin/govulncheck" -version | grep Scanner), database $$db"; \
	"$$bin/govulncheck" -db "$$db" ./...

.PHONY: security
security: ## the issue-22 attack tests S1–S15 (every TestSecurity…, and pkg/stream's oversize-message and gzip-bomb door tests for S5) on the local stack
	@FLOODGATE_WITH_CLUSTER=0 deploy/local/with-stack.sh bash -c 'set -o pipefail; $(GO) run ./migrations/cmd/migrate >/dev/null && \
		$(GO) test -count=1 -timeout 15m -run "^TestSecurity|^TestDoor(OversizeMessageIsDeadLetteredAsReference|GzipBombIsRefusedUndecompressed)$$" ./... 2>&1 | grep -Ev "\[no test files\]|\[no tests to run\]"'
