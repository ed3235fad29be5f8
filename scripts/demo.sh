#!/usr/bin/env bash
# The main job on loopback: a registry seeded with stand-ins for the
# Kubernetes component images (images/demo.yaml), registry.k8s.io mirrored to
# it, manifests/demo.yaml baked into out/rootfs, then what the store holds.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.deps/root/usr/bin:$PWD/target/release:$PATH"
rm -rf out/rootfs
mkdir -p out
kiln-testkit registry --images images/demo.yaml -- bash -euo pipefail -c '
  echo "+ kiln build --manifest manifests/demo.yaml --rootfs out/rootfs --mirror registry.k8s.io=http://$KILN_REGISTRY"
  kiln build --manifest manifests/demo.yaml --rootfs out/rootfs --mirror "registry.k8s.io=http://$KILN_REGISTRY"
  echo "+ kiln build ... (again: nothing to fetch)"
  kiln build --manifest manifests/demo.yaml --rootfs out/rootfs --mirror "registry.k8s.io=http://$KILN_REGISTRY"
'
echo "+ kiln inspect --rootfs out/rootfs"
kiln inspect --rootfs out/rootfs
echo "+ grep sandbox out/rootfs/etc/containerd/config.toml"
grep sandbox out/rootfs/etc/containerd/config.toml
