#!/usr/bin/env bash
# The main job on loopback: a registry seeded with stand-ins for the
# Kubernetes component images (images/demo.yaml), registry.k8s.io mirrored to
# it, manifests/demo.yaml baked into out/rootfs, then what the store holds.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.deps/root/usr/bin:$PWD/target/release:$PATH"
rm -rf out/rootfs out/node-image.tar
mkdir -p out
kiln-testkit registry --demo -- bash -euo pipefail -c '
  echo "+ kiln build --manifest manifests/demo.yaml --rootfs out/rootfs --mirror registry.k8s.io=http://$KILN_REGISTRY"
  kiln build --manifest manifests/demo.yaml --rootfs out/rootfs --mirror "registry.k8s.io=http://$KILN_REGISTRY"
  echo "+ kiln build ... (again: nothing to fetch)"
  kiln build --manifest manifests/demo.yaml --rootfs out/rootfs --mirror "registry.k8s.io=http://$KILN_REGISTRY"
  echo "+ kiln build --manifest manifests/demo.yaml --base $KILN_REGISTRY/kiln/base:demo ... --output oci-archive:out/node-image.tar"
  SOURCE_DATE_EPOCH=1700000000 kiln build --manifest manifests/demo.yaml --base "$KILN_REGISTRY/kiln/base:demo" \
    --mirror "registry.k8s.io=http://$KILN_REGISTRY" --output oci-archive:out/node-image.tar --tag kindest/node:v1.31.2
'
echo "+ kiln inspect --rootfs out/rootfs"
kiln inspect --rootfs out/rootfs
echo "+ grep sandbox out/rootfs/etc/containerd/config.toml"
grep sandbox out/rootfs/etc/containerd/config.toml
echo "+ the node image: out/node-image.tar (OCI layout; load with: skopeo copy oci-archive:out/node-image.tar ..., or ctr images import)"
ls -l out/node-image.tar
if [ "$(id -u)" = 0 ] && [ -x /usr/sbin/runc ]; then
  echo "+ kiln verify --image oci-archive:out/node-image.tar --start"
  kiln verify --image oci-archive:out/node-image.tar --start
else
  echo "(not root, or no /usr/sbin/runc: verifying without --start, which runs containers and needs both)"
  echo "+ kiln verify --image oci-archive:out/node-image.tar"
  kiln verify --image oci-archive:out/node-image.tar
fi
