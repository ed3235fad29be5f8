#!/bin/bash
# The cluster test's node base (tests/kind_cluster.rs): a kindest/base-like
# root filesystem built from Debian's packages by mmdebstrap (private apt
# state, nothing of the system's changed), with containerd 2.x (.deps/forky),
# crictl (.deps/go/bin) and kiln's own entrypoint, units and containerd
# config (testkit/kind-base/files; the facts behind them: docs/kind-cluster.md).
# Written to .deps/kind-base/<key>.tar, the key a hash of every input, so
# a second `make deps` reuses it. Beside it, $key.nft.tar: what
# kube-proxy's image needs from Debian (nft and its libraries). Debian 12's userspace, as this host's:
# its systemd (252) boots on cgroup v1 hosts like these.
# Usage: kind-base.sh DEPS MIRROR-URI
set -euo pipefail
DEPS=$1 uri=$2
here=$(cd "$(dirname "$0")/.." && pwd)
files="$here/testkit/kind-base/files"
packages=systemd,systemd-sysv,dbus,iproute2,iptables,nftables,conntrack,socat,ethtool,kmod,mount,util-linux,procps,ca-certificates,runc,containernetworking-plugins,libseccomp2,pigz,bash,ebtables,busybox-static
key=$({ cat "$0"; echo "$packages"; (cd "$files" && find . -type f | sort | xargs sha256sum);
        sha256sum "$DEPS/forky/usr/bin/containerd" "$DEPS/forky/usr/bin/containerd-shim-runc-v2" "$DEPS/forky/usr/bin/ctr" "$DEPS/go/bin/crictl" | cut -d' ' -f1; } \
      | sha256sum | cut -c1-16)
out="$DEPS/kind-base/$key.tar"
nft="$DEPS/kind-base/$key.nft.tar"
[ -f "$out" ] && [ -f "$nft" ] && exit 0
mkdir -p "$DEPS/kind-base"
rm -rf "$DEPS"/kind-base/*.tar "$DEPS"/kind-base/*.tmp
echo "deps: building the cluster test's node base with mmdebstrap (bookworm; about a minute, once)"
MMDEB="$DEPS/mmdebstrap"
PATH="$MMDEB/usr/bin:$PATH" mmdebstrap --quiet --format=tar --mode=root --variant=minbase --include="$packages" \
  --customize-hook="cp -a '$files/.' \"\$1/\"" \
  --customize-hook="install -m 0755 '$DEPS/forky/usr/bin/containerd' '$DEPS/forky/usr/bin/containerd-shim-runc-v2' '$DEPS/forky/usr/bin/ctr' '$DEPS/go/bin/crictl' \"\$1/usr/local/bin/\"" \
  --customize-hook='mkdir -p "$1/kind" "$1/etc/kubernetes/manifests" "$1/etc/cni/net.d"' \
  --customize-hook='echo ReadKMsg=no >>"$1/etc/systemd/journald.conf"' \
  --customize-hook='rm -f "$1"/etc/systemd/system/*.wants/* "$1"/lib/systemd/system/multi-user.target.wants/* "$1"/lib/systemd/system/local-fs.target.wants/*' \
  --customize-hook='chroot "$1" systemctl enable kubelet.service containerd.service' \
  --customize-hook='chroot "$1" systemctl mask systemd-binfmt.service' \
  bookworm "$out.tmp" "$uri"
# kube-proxy's image runs nft (kube-proxy's nftables mode): Debian's
# nftables and its libraries, unpacked (no maintainer scripts, no shell).
PATH="$MMDEB/usr/bin:$PATH" mmdebstrap --quiet --format=tar --mode=root --variant=extract --include=nftables \
  bookworm "$nft.tmp" "$uri"
mv "$nft.tmp" "$nft"
mv "$out.tmp" "$out"
