#!/usr/bin/env bash
# testenv/deps.sh [demo|test]: install the Debian packages `make demo` or
# `make test` needs, with one apt-get for the missing ones; nothing when all
# are present. Go modules are fetched by go itself. Run as root.
set -euo pipefail
what=${1:-test}
# What the demo uses; the tests use more. The demo installs nothing it does
# not run (the prometheus package's server would start now and at every
# boot).
pkgs=(
  iproute2 nftables wireguard-tools iputils-ping          # observing the kernel
  kmod                                                    # modprobe
  containernetworking-plugins                             # the macvlan CNI plugin that attaches pods (demo, tests)
)
if [ "$what" = test ]; then
  pkgs+=(
    tcpdump                                   # watching for leaks
    zbar-tools                                # zbarimg decodes the QR code nodeagentctl peer add draws (cmd/nodeagentctl)
    dbus-daemon                               # a private bus for the NetworkManager stand-in (netcfg/nmbus)
    prometheus                                # promtool and the server (monitoring tests)
    qemu-system-x86 busybox-static xz-utils   # the VM tier (testenv/vm)
    mmdebstrap lintian                        # the package tier
    etcd-server                               # the Kubernetes tier
    qbittorrent-nox transmission-daemon curl  # the forwarded port delivered to real clients (agent/qbittorrent_netns_test.go)
    git ca-certificates
  )
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
if [ "$(id -u)" != 0 ]; then
  echo "make $what needs these Debian packages, and root to install them: ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The prometheus and transmission-daemon packages would start their own
# servers (:9090; :9091 and a peer port); the tests run their own, so the
# packages' are kept from starting.
if printf '%s\n' "${missing[@]}" | grep -qx -e prometheus -e transmission-daemon && [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}"
