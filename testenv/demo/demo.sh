#!/usr/bin/env bash
# make demo: builds a small lab in network namespaces (a node with a trunk
# NIC, a LAN neighbour on the other end of the wire, a VPN tunnel standing in
# for PIA and a WAN) and runs the real nodeagent binary inside it: plan,
# apply, a no-op re-apply, the VLAN's traffic leaving by the tunnel and
# failing closed when the tunnel goes, a neighbour that squats on an address
# (DAD), and teardown. The host's own networking is never touched.
set -euo pipefail
bin=${1:-bin/nodeagent}
ctl=${2:-$(dirname "$bin")/nodeagentctl}
[ "$(id -u)" = 0 ] || { echo "make demo needs root: it creates network namespaces" >&2; exit 1; }
node=na-demo-node lan=na-demo-lan tun=na-demo-tun wan=na-demo-wan
dir=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  for n in $node $lan $tun $wan; do ip netns del $n 2>/dev/null || true; done; rm -rf "$dir"
}
trap cleanup EXIT
cleanup; dir=$(mktemp -d)

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
in_node() { ip netns exec $node "$@"; }
# The lab's namespaces are its own, the file system is the host's: keep the
# routing tables' names out of /etc.
export NODEAGENT_RT_TABLES="$dir/rt_tables.conf"

for n in $node $lan $tun $wan; do ip netns add $n; ip -n $n link set lo up; done
ip -n $node link add enp1s0 type veth peer name eth0 netns $lan
ip -n $node link add tun0 type veth peer name eth0 netns $tun      # stands in for wg-pia
ip -n $node link add uplink type veth peer name eth0 netns $wan
for l in enp1s0 tun0 uplink; do ip -n $node link set $l up; done
for n in $lan $tun $wan; do ip -n $n link set eth0 up; done
ip -n $node addr add 10.99.0.1/30 dev tun0; ip -n $tun addr add 10.99.0.2/30 dev eth0
ip -n $node addr add 192.0.2.1/24 dev uplink; ip -n $wan addr add 192.0.2.2/24 dev eth0
ip -n $node route add default via 192.0.2.2
# "the internet" answers on both far sides; only tun routes the VLAN back
for n in $tun $wan; do ip -n $n addr add 198.51.100.10/32 dev lo; done
ip -n $tun route add 10.10.50.0/24 via 10.99.0.1

if modprobe 8021q 2>/dev/null && [ -d /sys/module/8021q ]; then
  parent=enp1s0.50
  ip -n $lan link add link eth0 name eth0.50 type vlan id 50; ip -n $lan link set eth0.50 up
  ip -n $lan addr add 10.10.50.20/24 dev eth0.50
  ip -n $lan route add default via 10.10.50.1
  vlans="vlans:
  - name: enp1s0.50        # VLAN 50 on the trunk, as in the homelab
    parent: enp1s0
    id: 50
    mtu: 1500
    addresses: [10.10.50.1/24]"
else
  echo "(this kernel has no 8021q: the demo puts the shim straight on the trunk)"
  parent=enp1s0
  ip -n $lan addr add 10.10.50.20/24 dev eth0
  ip -n $lan route add default via 10.10.50.1
  ip -n $node addr add 10.10.50.1/24 dev enp1s0
  vlans=""
fi
cat > "$dir/nodeagent.yaml" <<YAML
dad: {probes: 2, interval: 100ms, wait: 300ms}
$vlans
macvlans:
  - name: vlan50-shim      # host shim so the node reaches its own macvlan pods
    parent: $parent
    mode: bridge
    addresses: [10.10.50.3/24]
sysctls:
  net.ipv4.ip_forward: "1"
routing:                   # the PIA gateway: VLAN 50 leaves by the tunnel, never by the WAN
  tables:
    - id: 150
      name: vlan50-egress
      killSwitch: true     # unreachable default underneath: no tunnel, no egress
      routes:
        - {to: default, via: 10.99.0.2, dev: tun0}
        - {to: 10.10.50.0/24, dev: $parent}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
YAML

step "config"; cat "$dir/nodeagent.yaml"
step "nodeagent validate"; in_node "$bin" validate -c "$dir/nodeagent.yaml"
step "nodeagent plan (dry run)"; in_node "$bin" plan -c "$dir/nodeagent.yaml"
step "nodeagent apply --once"; in_node "$bin" apply --once -c "$dir/nodeagent.yaml"
step "ip -d link / addr on the node"; in_node ip -br -d link show type macvlan; in_node ip -br addr
step "the LAN neighbour pings the shim"; ip netns exec $lan ping -c 2 -W 1 10.10.50.3
step "the LAN client reaches the internet through the tunnel (the node itself still uses the WAN)"
ip netns exec $lan ping -c 2 -W 1 198.51.100.10
in_node ip route get 198.51.100.10 from 10.10.50.20 iif $parent
in_node ip route get 198.51.100.10
step "apply again: nothing to do"; in_node "$bin" apply --once -c "$dir/nodeagent.yaml"
step "the tunnel goes away: the VLAN fails closed instead of leaking to the WAN"
in_node ip link del tun0
in_node ip route get 198.51.100.10 from 10.10.50.20 iif $parent || true
ip netns exec $lan ping -c 2 -W 1 198.51.100.10 || echo "(no answer — as it should be)"
step "a sync while the tunnel is gone: the tunnel route waits, nothing fails"
in_node "$bin" apply --once -c "$dir/nodeagent.yaml"
step "a neighbour already owns 10.10.50.30: DAD refuses to claim it"
dev=eth0; [ "$parent" = enp1s0.50 ] && dev=eth0.50
ip -n $lan addr add 10.10.50.30/24 dev $dev
sed -i 's#10.10.50.3/24\]#10.10.50.3/24, 10.10.50.30/24]#' "$dir/nodeagent.yaml"
in_node "$bin" apply --once -c "$dir/nodeagent.yaml" || echo "(exit $? — as expected)"
sed -i 's#10.10.50.3/24, 10.10.50.30/24\]#10.10.50.3/24]#' "$dir/nodeagent.yaml"
step "the daemon: nodeagent run, and nodeagentctl over its socket"
sock="$dir/nodeagent.sock"
in_node "$bin" run -c "$dir/nodeagent.yaml" --socket "$sock" 2>"$dir/daemon.log" & daemon=$!
"$ctl" --socket "$sock" wait --for=ready --timeout=30s
"$ctl" --socket "$sock" status || true
step "someone deletes the VLAN's rule by hand: the daemon puts it back (kernel event, not a timer)"
in_node ip rule del priority 1000; sleep 0.5; in_node ip rule show priority 1000
step "a broken config edit is rejected whole; status says where"
cp "$dir/nodeagent.yaml" "$dir/good.yaml"; sed -i 's#10.10.50.0/24, table: 150#10.10.50.0/33, table: 150#' "$dir/nodeagent.yaml"
"$ctl" --socket "$sock" reload || echo "(exit $? — as expected)"
cp "$dir/good.yaml" "$dir/nodeagent.yaml"; "$ctl" --socket "$sock" reload
kill "$daemon"; wait "$daemon" || true; daemon=""
step "the daemon's log (changes at info)"; grep -E 'change|drift|rejected' "$dir/daemon.log" | head -20 || true
step "nodeagent teardown"; in_node "$bin" teardown
step "what is left on the node (only what nodeagent did not create)"; in_node ip -br link
