#!/usr/bin/env bash
# Installs what kiln's build, tests and demo need, without touching the system's
# apt sources: containerd 1.7/runc/docker-registry come from Debian trixie and
# containerd 2.x from Debian forky, each through a private apt state, unpacked
# (dpkg -x) under .deps/ (git-ignored): .deps/root (trixie) and .deps/forky.
# For verifying another platform's node on this one: QEMU's user-mode
# emulators (.deps/qemu) and that platform's containerd and libc
# (.deps/foreign/ARCH), the stand-in base the tests build.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS="$PWD/.deps"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

need_host_pkgs=()
command -v protoc >/dev/null || need_host_pkgs+=(protobuf-compiler)
[ -x /usr/bin/time ] || need_host_pkgs+=(time)
# kiln verify --start runs containers with the system's (Debian 12) runc; the
# tests build static stand-in daemons with gcc -static.
[ -x /usr/sbin/runc ] || need_host_pkgs+=(runc)
command -v gcc >/dev/null || need_host_pkgs+=(gcc)
# the non-root tests create a user and drop to it.
command -v useradd >/dev/null || need_host_pkgs+=(passwd)
command -v setpriv >/dev/null || need_host_pkgs+=(util-linux)
[ -f "$(gcc -print-file-name=libc.a 2>/dev/null)" ] || need_host_pkgs+=(libc6-dev)
# a virtualenv for the SBOM validator (below).
python3 -c 'import venv, ensurepip' 2>/dev/null || need_host_pkgs+=(python3-venv)
# make test runs the suites with cargo-nextest (on this kind of machine
# already; else from crates.io, the version pinned).
command -v cargo-nextest >/dev/null || cargo install --locked --quiet cargo-nextest@0.9.143
# make audit's checker (advisories, licences, bans, sources), the version pinned.
cargo-deny --version 2>/dev/null | grep -qx 'cargo-deny 0.18.9' \
  || { echo "deps: installing cargo-deny 0.18.9 from crates.io (a few minutes, once)"; cargo install --locked --quiet cargo-deny@0.18.9; }
if [ ${#need_host_pkgs[@]} -gt 0 ]; then
  echo "deps: installing ${need_host_pkgs[*]} from the system's archive"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_host_pkgs[@]}" >/dev/null
fi

# The system's own archive URI, in a private apt tree per suite.
uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -m1 '/debian$' || true)
[ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -m1 '/debian/\?$' || true)
[ -n "$uri" ] || uri="http://deb.debian.org/debian"

# fetch SUITE ROOT PACKAGE...: downloads PACKAGEs from SUITE and unpacks them
# into ROOT. With FETCH_ARCH set, that architecture's index is read too (name
# its packages PKG:ARCH).
fetch() {
  local suite=$1 root=$2; shift 2
  local name="$suite${FETCH_ARCH:+-$FETCH_ARCH}"
  local apt="$DEPS/apt-$name" debs="$DEPS/debs-$name"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" "$root" "$debs"
  {
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n' "$uri" "$suite"
    [ -z "${FETCH_ARCH:-}" ] || printf 'Architectures: %s %s\n' "$(dpkg --print-architecture)" "$FETCH_ARCH"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  } > "$apt/sources.list.d/$suite.sources"
  : > "$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/sources.list.d"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "Dir::State::status=/dev/null"
        -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
  [ -z "${FETCH_ARCH:-}" ] || opts+=(-o "APT::Architectures::=$FETCH_ARCH")
  echo "deps: fetching $* from $suite ($uri)"
  apt-get "${opts[@]}" update -qq
  rm -f "$debs"/*.deb
  (cd "$debs" && apt-get "${opts[@]}" download "$@")
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$root"; done
}

ROOT="$DEPS/root"
if ! { [ -x "$ROOT/usr/bin/containerd" ] && [ -x "$ROOT/usr/bin/docker-registry" ] && [ -x "$ROOT/usr/sbin/runc" ]; }; then
  fetch trixie "$ROOT" containerd runc docker-registry
  "$ROOT/usr/bin/containerd" --version
fi
FORKY="$DEPS/forky"
if ! [ -x "$FORKY/usr/bin/containerd" ]; then
  fetch forky "$FORKY" containerd
  "$FORKY/usr/bin/containerd" --version
fi
# Another platform than this machine's, for the emulated-verify tests: arm64
# on amd64 hosts, amd64 elsewhere.
QEMU="$DEPS/qemu"
if ! [ -d "$QEMU/usr/bin" ]; then
  fetch trixie "$QEMU" qemu-user
fi
other=arm64; [ "$(dpkg --print-architecture)" = arm64 ] && other=amd64
FOREIGN="$DEPS/foreign/$other"
if ! [ -x "$FOREIGN/usr/bin/containerd" ]; then
  FETCH_ARCH=$other fetch trixie "$FOREIGN" "containerd:$other" "libc6:$other"
fi
# skopeo, to read kiln's archives and bundles the way users do: bookworm's,
# which runs on this Debian 12 host (trixie's needs a newer glibc), with its
# two libraries beside it (run with LD_LIBRARY_PATH; testkit's tools::skopeo).
SKOPEO="$DEPS/skopeo"
if ! [ -x "$SKOPEO/usr/bin/skopeo" ]; then
  fetch bookworm "$SKOPEO" skopeo libgpgme11 libassuan0
  LD_LIBRARY_PATH="$SKOPEO/usr/lib/$(gcc -print-multiarch)" "$SKOPEO/usr/bin/skopeo" --version
fi
# podman, for the tests that run kind's nodes as kind's podman provider
# does and load into them (testkit's podman::Podman): Debian 12's 4.3.1,
# with conmon and containers-common, the one that runs on this host, its
# libraries beside it (run with LD_LIBRARY_PATH); Debian 12's runc is its
# runtime (shared/notes/podman-facts.md).
PODMAN="$DEPS/podman"
if ! [ -x "$PODMAN/usr/bin/podman" ]; then
  fetch bookworm "$PODMAN" podman conmon golang-github-containers-common \
    libgpgme11 libassuan0 libsubid4 libdevmapper1.02.1 libaio1
  LD_LIBRARY_PATH="$PODMAN/usr/lib/$(gcc -print-multiarch):$PODMAN/lib/$(gcc -print-multiarch)" \
    "$PODMAN/usr/bin/podman" --version
fi
# cosign, Sigstore's own signer and verifier: the tests sign fixture images
# with it (keys and certificates the tests make) and check that kiln's
# verdict on each signature is cosign's (testkit's tools::cosign).
COSIGN="$DEPS/cosign"
if ! [ -x "$COSIGN/usr/bin/cosign" ]; then
  fetch trixie "$COSIGN" cosign
  "$COSIGN/usr/bin/cosign" version >/dev/null
fi
# oras, the OCI registry client: the tests read the SBOM and provenance
# kiln attaches to a pushed node image as oras discovers referrers (the
# referrers API, else the OCI 1.1 tag schema) (testkit's tools::oras).
ORAS="$DEPS/oras"
if ! [ -x "$ORAS/usr/bin/oras" ]; then
  fetch trixie "$ORAS" oras
  "$ORAS/usr/bin/oras" version >/dev/null
fi
# Docker 28 (Debian forky's docker.io and docker-cli), for the tests that
# pull kiln's node images as kind's users do and run them as kind does,
# with both image stores (testkit's docker::Dockerd). Its dockerd runs the
# containerd it manages from .deps/forky and Debian 12's runc: forky's
# runc needs a newer glibc than this host's.
DOCKER="$DEPS/docker"
if ! [ -x "$DOCKER/usr/sbin/dockerd" ]; then
  fetch forky "$DOCKER" docker.io docker-cli
  "$DOCKER/usr/sbin/dockerd" --version
fi
# iptables for the cluster test's dockerd (testkit's docker::Dockerd with
# networking): kind's nodes find each other by name through Docker's
# embedded DNS, whose rules dockerd writes with iptables. Debian 12's,
# which runs on this host, its libraries beside it (LD_LIBRARY_PATH).
IPTABLES="$DEPS/iptables"
if ! [ -x "$IPTABLES/usr/sbin/xtables-legacy-multi" ]; then
  fetch bookworm "$IPTABLES" iptables libip4tc2 libip6tc2 libxtables12 libnftnl11 libnetfilter-conntrack3 libnfnetlink0 libmnl0
fi
# The SPDX project's own validator (spdx-tools, from PyPI) in a private
# virtualenv, to check kiln's SBOMs with an implementation that is not
# kiln's (testkit's tools::pyspdxtools). Versions pinned.
SPDX="$DEPS/spdx"
if ! [ -x "$SPDX/bin/pyspdxtools" ]; then
  rm -rf "$SPDX"
  python3 -m venv "$SPDX"
  "$SPDX/bin/pip" install -q --disable-pip-version-check \
    spdx-tools==0.8.5 beartype==0.23.1 click==8.5.1 license-expression==30.4.4 \
    boolean.py==5.0 ply==3.11 pyparsing==3.3.3 PyYAML==6.0.4 rdflib==7.6.0 \
    semantic-version==2.10.0 uritools==7.0.1 xmltodict==1.0.4
  "$SPDX/bin/pyspdxtools" --help >/dev/null
fi
# pigz: containerd decompresses gzip layers with unpigz when it is on PATH
# (kind's base installs it), so the layer oracle runs it beside Go's
# compress/gzip. Debian 12's, which runs on this host.
PIGZ="$DEPS/pigz"
if ! [ -x "$PIGZ/usr/bin/unpigz" ]; then
  fetch bookworm "$PIGZ" pigz
  "$PIGZ/usr/bin/unpigz" --version >/dev/null 2>&1 || "$PIGZ/usr/bin/pigz" --version
fi
# Go programs the tests run, from the repository's own Go modules (each
# go.mod/go.sum committed; -mod=readonly: nothing is resolved here that
# the sums do not pin). Go's module cache and build cache are Go's own
# (`go env GOMODCACHE GOCACHE`: ~/go/pkg/mod and ~/.cache/go-build), so a
# fresh clone on a machine that built them once pays only the link. Each
# binary is rebuilt only when its module's files change (a stamp of their
# hashes beside it).
command -v go >/dev/null || { echo "deps: Go (1.24 or newer) is needed to build the tests' Go programs (testkit/go); install it from your distribution or go.dev" >&2; exit 1; }
GOBIN_DIR="$DEPS/go/bin"
mkdir -p "$GOBIN_DIR"
go_build() { # MODULE_DIR PATTERN LDFLAGS BINARY...: builds PATTERN's main packages into .deps/go/bin
  local dir=$1 pattern=$2 ldflags=$3; shift 3
  local stamp="$DEPS/go/$(basename "$dir").stamp"
  local want; want=$( (cd "$dir" && sha256sum go.mod go.sum $(find . -name '*.go' | sort); echo "$ldflags") | sha256sum | cut -d' ' -f1)
  local have=""; [ -f "$stamp" ] && have=$(cat "$stamp")
  local missing=0
  for b in "$@"; do [ -x "$GOBIN_DIR/$b" ] || missing=1; done
  if [ "$want" != "$have" ] || [ $missing = 1 ]; then
    echo "deps: building $* from $dir with $(go version | cut -d' ' -f3)"
    local t0=$SECONDS
    (cd "$dir" && GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$GOBIN_DIR/" $pattern)
    echo "deps: built $* in $((SECONDS - t0)) s"
    echo "$want" > "$stamp"
  fi
}
# The layer oracle: Go's readers of a layer, as containerd and Docker read.
go_build testkit/go/layeroracle ./... "" layeroracle
# Real peers (testkit/go/peers, its go.mod's `tool` lines): kind and crictl.
# Cold on 2 cores, modules fetched: about 2 minutes; warm, a link.
go_build testkit/go/peers tool "-X sigs.k8s.io/cri-tools/pkg/version.Version=v1.37.0" kind crictl
# One Kubernetes release (testkit/go/kubernetes: k8s.io/kubernetes v1.35.4,
# its staging modules set to the published v0.35.4), in one `go build`:
# the kubelet, kubeadm and kubectl, and the four programs a release ships
# as images (the cluster test makes them a release tarball). Stripped
# (-s -w), as release builds are. Cold on 2 cores, modules fetched: about
# 8 minutes; warm, a link.
go_build testkit/go/kubernetes "k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy" "-s -w -X k8s.io/component-base/version.gitVersion=v1.35.4 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35" kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy
# The cluster's add-ons (testkit/go/cluster): etcd, CoreDNS, kind's storage
# provisioner, and the stand-in for kindnetd (its module is not served).
go_build testkit/go/cluster "go.etcd.io/etcd/server/v3 github.com/rancher/local-path-provisioner ./coredns ./kindnetd" "-s -w" server local-path-provisioner coredns kindnetd
# The cluster test's node base, from Debian's packages (mmdebstrap,
# Debian 12's, run from here), cached by its inputs.
MMDEB="$DEPS/mmdebstrap"
if ! [ -x "$MMDEB/usr/bin/mmdebstrap" ]; then
  fetch bookworm "$MMDEB" mmdebstrap
fi
if [ "$(id -u)" = 0 ]; then
  "$(dirname "$0")/kind-base.sh" "$DEPS" "$uri"
else
  echo "deps: not root: the cluster test's node base is not built (mmdebstrap's root mode; the test runs as root only)"
fi
