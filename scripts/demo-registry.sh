#!/usr/bin/env bash
# `make demo-registry`: the demo's loopback registry, kept up in a shell so
# the README's examples run as written; it stops when the shell exits.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.deps/root/usr/bin:$PWD/target/release:$PATH"
mkdir -p out
exec kiln-testkit registry --demo -- bash -c '
  echo "kiln demo registry at $KILN_REGISTRY (in \$KILN_REGISTRY); registry.k8s.io images are mirrored by:"
  echo "  --mirror registry.k8s.io=http://$KILN_REGISTRY"
  echo "base image: $KILN_REGISTRY/kiln/base:demo. Exit this shell to stop the registry."
  exec "${SHELL:-bash}" -i
'
