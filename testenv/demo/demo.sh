#!/usr/bin/env bash
# make demo: builds a small lab in network namespaces (a node with a trunk
# NIC, a LAN neighbour on the other end of the wire) and runs the real
# nodeagent binary inside it: plan, apply, a no-op re-apply, a ping from the
# neighbour, a neighbour that squats on an address (DAD), and teardown.
# The host's own networking is never touched.
set -euo pipefail
bin=${1:-bin/nodeagent}
[ "$(id -u)" = 0 ] || { echo "make demo needs root: it creates network namespaces" >&2; exit 1; }
node=na-demo-node lan=na-demo-lan
dir=$(mktemp -d)
cleanup() { ip netns del $node 2>/dev/null || true; ip netns del $lan 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
cleanup; dir=$(mktemp -d)

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
in_node() { ip netns exec $node "$@"; }

ip netns add $node; ip netns add $lan
ip -n $node link add enp1s0 type veth peer name eth0 netns $lan
ip -n $node link set lo up; ip -n $node link set enp1s0 up
ip -n $lan link set lo up; ip -n $lan link set eth0 up

if modprobe 8021q 2>/dev/null && [ -d /sys/module/8021q ]; then
  parent=enp1s0.50
  ip -n $lan link add link eth0 name eth0.50 type vlan id 50; ip -n $lan link set eth0.50 up
  ip -n $lan addr add 10.10.50.20/24 dev eth0.50
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
YAML

step "config"; cat "$dir/nodeagent.yaml"
step "nodeagent validate"; in_node "$bin" validate -c "$dir/nodeagent.yaml"
step "nodeagent plan (dry run)"; in_node "$bin" plan -c "$dir/nodeagent.yaml"
step "nodeagent apply --once"; in_node "$bin" apply --once -c "$dir/nodeagent.yaml"
step "ip -d link / addr on the node"; in_node ip -br -d link show type macvlan; in_node ip -br addr
step "the LAN neighbour pings the shim"; ip netns exec $lan ping -c 2 -W 1 10.10.50.3
step "apply again: nothing to do"; in_node "$bin" apply --once -c "$dir/nodeagent.yaml"
step "a neighbour already owns 10.10.50.30: DAD refuses to claim it"
dev=eth0; [ "$parent" = enp1s0.50 ] && dev=eth0.50
ip -n $lan addr add 10.10.50.30/24 dev $dev
sed -i 's#10.10.50.3/24\]#10.10.50.3/24, 10.10.50.30/24]#' "$dir/nodeagent.yaml"
in_node "$bin" apply --once -c "$dir/nodeagent.yaml" || echo "(exit $? — as expected)"
step "nodeagent teardown"; in_node "$bin" teardown
step "what is left on the node (only what nodeagent did not create)"; in_node ip -br link
