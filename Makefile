# gradsync — common tasks. `make help` lists them.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
# go-nvml's C header marks many functions deprecated; keep the build quiet.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
STATICCHECK_VERSION := v0.8.2
BUF := tools/node_modules/.bin/buf

.PHONY: help build local test test-python test-short lint layering proto proto-check fuzz ci clean

help:
	@echo "make local       train: gradsync local --workers 2 --model mlp --dataset mnist --epochs 1"
	@echo "make test        run every test (race detector on, models: its threaded tests; builds bin/grpcurl first)"
	@echo "make test-python the Python package's tests (Debian's python3-torch; skipped without it)"
	@echo "make test-short  the quick tests only"
	@echo "make lint        gofmt, go vet, staticcheck, layering, go.mod tidy, buf lint, generated code fresh"
	@echo "make layering    the import rule of the README layout section (part of lint)"
	@echo "make build       build bin/gradsync"
	@echo "make proto       regenerate proto/gradsync/v1/*.pb.go with buf"
	@echo "make ci          what .ci/run runs: lint + test"

build:
	$(GO) build -o $(BIN)/gradsync ./cmd/gradsync

local:
	$(GO) run ./cmd/gradsync local --workers 2 --model mlp --dataset mnist --epochs 1

$(BIN)/grpcurl: tools/go.mod tools/go.sum
	$(GO) -C tools build -o $(BIN)/grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl

# The longest packages are named first: go test starts the packages'
# runs in the order they are listed (./... adds the rest, sorted, each
# once), so the long pole (models) is not left to start last. A listed
# folder that has gone is left out. docs/experiments/ci-time.md has the
# figures.
TEST_FIRST := $(foreach d,server aggregator/ringrpc federated test,$(if $(wildcard $(d)/*.go),./$(d)/))
MODULE := github.com/gradsync/gradsync

# The race detector runs where there are races to find. Every package's
# tests run under it, except models: its numeric tests (gradient checks,
# parity with PyTorch, bit-identity of checkpointing, allocation counts)
# run on the caller's goroutine alone (a network starts goroutines only
# for SetThreads(n > 1)), so they run without it, every one of them, at
# full speed; the tests whose networks run on several threads run again
# under it (MODELS_RACE, and the two-thread cases of checkpointing on the
# architectures that cover each layer kind at a size the detector runs
# in seconds; the heavy three run two-threaded in TestThreadsMatchOneThread).
# The two runs go side by side with the race suite of the other packages.
# docs/experiments/ci-time.md has the figures.
MODELS_RACE := ^(TestThreads.*|TestPrecisionWithThreadsAndCheckpointing|TestDropoutSliceMasks)$$
MODELS_RACE_CK := ^TestCheckpointingBitIdentical$$/^(cnn|convvit|fedcnn|lenet5|logreg|mlp|resnet8|se-resnet8|vit-tiny)$$/.*/^2$$

# Winograd F(4×4, 3×3) is compiled only with -tags winograd4 (it is off):
# test and vet it with the tag too, so that it does not rot.
test: $(BIN)/grpcurl
	@( $(GO) test -timeout 30m ./models/ && \
	  $(GO) test -race -timeout 30m -run '$(MODELS_RACE)' ./models/ && \
	  $(GO) test -race -timeout 30m -run '$(MODELS_RACE_CK)' ./models/ ) & models=$$!; \
	echo "go test -race (every package but models; models beside it: all tests, then its threaded ones under -race)"; \
	GRPCURL=$(BIN)/grpcurl $(GO) test -race -timeout 30m $(TEST_FIRST) $$($(GO) list ./... | grep -vx '$(MODULE)/models'); rest=$$?; \
	wait $$models; m=$$?; \
	if [ $$m -ne 0 ] || [ $$rest -ne 0 ]; then echo "make test: FAIL (models: exit $$m, the other packages: exit $$rest)"; exit 1; fi
	$(GO) test -race -tags winograd4 -run 'Winograd' ./internal/kernels/ ./models/
	$(MAKE) test-python

# The Python package's tests run `gradsync local` with PyTorch scripts as
# entrypoints, under Debian's python (python3-torch, python3-grpcio,
# python3-protobuf); without them they are skipped, saying so.
PYTHON ?= /usr/bin/python3
test-python: build
	@if [ ! -x $(PYTHON) ]; then echo "test-python: $(PYTHON) not found: Python tests skipped"; exit 0; fi; \
	GRADSYNC_BIN=$(BIN)/gradsync $(PYTHON) -B -m unittest discover -v -s python/tests -p 'test_*.py'

test-short:
	$(GO) test -short ./...

$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(BUF): tools/package.json tools/package-lock.json
	cd tools && npm ci --no-audit --no-fund --loglevel=error

lint: $(BIN)/staticcheck $(BUF)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags winograd4 ./internal/kernels/ ./models/
	$(BIN)/staticcheck ./...
	$(MAKE) layering
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy (the diff above): run 'go mod tidy' and commit"; exit 1; }
	$(BUF) lint
	$(MAKE) proto-check

# The Python stubs of the agent service need Debian's protoc and
# grpc_python_plugin (apt-get install protobuf-compiler protobuf-compiler-grpc).
PY_PROTO := proto/gradsync/v1/agent.proto

proto: $(BUF)
	$(BUF) generate
	$(BUF) generate --template buf.gen.python.yaml --path $(PY_PROTO)

# The import rule of the README's layout section (test/layering).
layering:
	$(GO) test -count=1 ./test/layering/

# The committed generated code must be what buf generates now.
proto-check: $(BUF)
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(BUF) generate -o $$tmp && \
	for f in proto/gradsync/v1/*.pb.go; do \
	  cmp -s $$f $$tmp/$$f || { echo "$$f is stale: run 'make proto' and commit"; exit 1; }; \
	done; \
	n=$$(ls $$tmp/proto/gradsync/v1/*.pb.go | wc -l); m=$$(ls proto/gradsync/v1/*.pb.go | wc -l); \
	[ $$n -eq $$m ] || { echo "generated file set differs ($$n vs $$m): run 'make proto'"; exit 1; }; \
	if command -v protoc >/dev/null && command -v grpc_python_plugin >/dev/null; then \
	  $(BUF) generate --template buf.gen.python.yaml --path $(PY_PROTO) -o $$tmp && \
	  for f in python/gradsync/v1/agent_pb2.py python/gradsync/v1/agent_pb2_grpc.py; do \
	    cmp -s $$f $$tmp/$$f || { echo "$$f is stale: run 'make proto' and commit"; exit 1; }; \
	  done; \
	else echo "protoc or grpc_python_plugin missing: the Python stubs are not checked"; fi; \
	echo "generated code is fresh"

# A short fuzz run of every fuzz target (FUZZTIME=5m for the long one).
FUZZTIME ?= 30s
fuzz:
	@for t in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs grep -ho '^func Fuzz[A-Za-z0-9_]*' | sed 's/func //' | sort -u); do \
	  pkg=$$(dirname $$(grep -rl --include='*_test.go' "^func $$t(" . | head -1)); \
	  echo "== $$t in $$pkg"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

ci: lint test

clean:
	rm -rf $(BIN)
