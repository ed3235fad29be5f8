# kiln: `make demo` runs the main job against a loopback registry;
# `make test` runs every test. `make deps` installs what both need.
SHELL := /bin/bash
DEPS_BIN := $(CURDIR)/.deps/root/usr/bin
export PATH := $(DEPS_BIN):$(PATH)
CARGO ?= cargo

.PHONY: all deps build test audit demo demo-registry bench lint fmt clean install install-files

all: build

deps:
	./scripts/deps.sh

build: deps
	$(CARGO) build --release --workspace

# The suites run under cargo-nextest (.config/nextest.toml: three tests at a
# time, each its own process; most wait on daemons, not the CPU), then the
# doc-tests, which nextest does not run.
# The dependency tree against RustSec's advisories and deny.toml's licence,
# ban and source rules (scripts/audit.sh says where the database comes from).
audit: deps
	./scripts/audit.sh

test: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) nextest run --workspace
	$(CARGO) test --workspace --doc

demo: build
	./scripts/demo.sh

# The demo's registry kept up in a shell, for the README's examples.
demo-registry: build
	./scripts/demo-registry.sh

# kiln against ctr and the kind way on a generated ~1 GiB image set; writes out/bench.md.
bench: build
	./target/release/kiln-bench

# Install as packagers expect: PREFIX (default /usr/local) and DESTDIR.
# The binary, its man pages and shell completions, generated from the CLI.
PREFIX ?= /usr/local
KILN ?= target/release/kiln
SHARE = $(DESTDIR)$(PREFIX)/share

# Installs what `make build` built: `sudo make install` compiles nothing as
# root (that would leave a root-owned target/).
install:
	@test -x target/release/kiln || { echo "make install: target/release/kiln is missing: run make build first (as yourself), then make install" >&2; exit 1; }
	$(MAKE) install-files KILN=target/release/kiln

# What install puts in place, from an already built KILN (the tests use this).
install-files:
	install -D -m 0755 $(KILN) $(DESTDIR)$(PREFIX)/bin/kiln
	$(KILN) man --out-dir $(SHARE)/man/man1
	mkdir -p $(SHARE)/bash-completion/completions $(SHARE)/zsh/site-functions $(SHARE)/fish/vendor_completions.d
	$(KILN) completions bash > $(SHARE)/bash-completion/completions/kiln
	$(KILN) completions zsh > $(SHARE)/zsh/site-functions/_kiln
	$(KILN) completions fish > $(SHARE)/fish/vendor_completions.d/kiln.fish

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	rm -rf out target
