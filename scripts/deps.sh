#!/usr/bin/env bash
# Installs what kiln's build, tests and demo need, without touching the system's
# apt sources: containerd/runc/docker-registry come from Debian trixie through a
# private apt state and are unpacked (dpkg -x) under .deps/, git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS="$PWD/.deps"
ROOT="$DEPS/root"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

need_host_pkgs=()
command -v protoc >/dev/null || need_host_pkgs+=(protobuf-compiler)
[ -x /usr/bin/time ] || need_host_pkgs+=(time)
if [ ${#need_host_pkgs[@]} -gt 0 ]; then
  echo "deps: installing ${need_host_pkgs[*]} from the system's archive"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_host_pkgs[@]}" >/dev/null
fi

if [ -x "$ROOT/usr/bin/containerd" ] && [ -x "$ROOT/usr/bin/docker-registry" ] && [ -x "$ROOT/usr/sbin/runc" -o -x "$ROOT/usr/bin/runc" ]; then
  exit 0
fi

# The system's own archive URI, with Suites: trixie, in a private apt tree.
uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -m1 '/debian$' || true)
[ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -m1 '/debian/\?$' || true)
[ -n "$uri" ] || uri="http://deb.debian.org/debian"
APT="$DEPS/apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/sources.list.d" "$ROOT" "$DEPS/debs"
cat > "$APT/sources.list.d/trixie.sources" <<SRC
Types: deb
URIs: $uri
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
: > "$APT/sources.list"
opts=(-o "Dir::Etc::SourceList=$APT/sources.list" -o "Dir::Etc::SourceParts=$APT/sources.list.d"
      -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o "Dir::State::status=/dev/null"
      -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
echo "deps: fetching containerd, runc, docker-registry from trixie ($uri)"
apt-get "${opts[@]}" update -qq
(cd "$DEPS/debs" && apt-get "${opts[@]}" download containerd runc docker-registry)
for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$ROOT"; done
"$ROOT/usr/bin/containerd" --version
