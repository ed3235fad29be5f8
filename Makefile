# kiln: `make demo` runs the main job against a loopback registry;
# `make test` runs every test. `make deps` installs what both need.
SHELL := /bin/bash
DEPS_BIN := $(CURDIR)/.deps/root/usr/bin
export PATH := $(DEPS_BIN):$(PATH)
CARGO ?= cargo

.PHONY: all deps build test demo demo-registry bench lint fmt clean

all: build

deps:
	./scripts/deps.sh

build: deps
	$(CARGO) build --release --workspace

test: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace

demo: build
	./scripts/demo.sh

# The demo's registry kept up in a shell, for the README's examples.
demo-registry: build
	./scripts/demo-registry.sh

# kiln against ctr and the kind way on a generated ~1 GiB image set; writes out/bench.md.
bench: build
	./target/release/kiln-bench

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	rm -rf out target
