# The neighbours' topology, shared by the steps after it (sourced by
# deb-acceptance.sh; no step of its own).
#
#   wan ns: wan0 192.0.2.1/24 2001:db8:1::1/64 -- up0 (the uplink, owned
#           by networkd or NetworkManager, 192.0.2.2/24 2001:db8:1::2/64)
#   lan ns: lan0 -- $TRUNK (the trunk, a veth); lan0.50, the VLAN host,
#           10.10.50.10/24 fd50::10/64 -- $VLAN, nodeagent's VLAN, .1/::1
#
# nodeagent runs the seeds' gateway shape: VLAN 50's sources go to table
# 150 (default dev wg0, kill switch) by rules 1000 (v4) and 1001 (v6),
# and the nft kill switch lets them out of wg0 only. wg0's one peer has no
# endpoint, so what goes into the tunnel is dropped there: anything from
# the VLAN seen in the wan namespace is a leak.
TRUNK=enp7s0 VLAN=enp7s0.50

topo_up() {
	ip netns add wan && ip netns add lan || return 1
	ip link add up0 type veth peer name wan0 netns wan
	ip link add "$TRUNK" type veth peer name lan0 netns lan
	ip link set "$TRUNK" up
	ip -n wan link set lo up
	ip -n wan link set wan0 up
	ip -n wan addr add 192.0.2.1/24 dev wan0
	ip -n wan addr add 2001:db8:1::1/64 dev wan0 nodad
	ip -n lan link set lo up
	ip -n lan link set lan0 up
	ip -n lan link add link lan0 name lan0.50 type vlan id 50
	ip -n lan link set lan0.50 up
	ip -n lan addr add 10.10.50.10/24 dev lan0.50
	ip -n lan addr add fd50::10/64 dev lan0.50 nodad
	ip -n lan route add default via 10.10.50.1
	ip -n lan -6 route add default via fd50::1
	# What reaches the WAN from the VLAN, counted before anything else.
	ip netns exec wan nft -f - <<'NFT'
table inet leak {
	chain pre {
		type filter hook prerouting priority -300; policy accept;
		ip saddr 10.10.50.0/24 counter name v4
		ip6 saddr fd50::/64 counter name v6
	}
	counter v4 {}
	counter v6 {}
}
NFT
}

# leaks prints "v4 N v6 M": the VLAN's packets seen at the WAN so far.
leaks() {
	local v4 v6
	v4=$(ip netns exec wan nft list counter inet leak v4 | awk '/packets/{print $2}')
	v6=$(ip netns exec wan nft list counter inet leak v6 | awk '/packets/{print $2}')
	echo "v4 ${v4:-?} v6 ${v6:-?}"
}

# traffic_start: the VLAN host pings the WAN 20 times a second, v4 and v6;
# traffic_stop ends it. Nothing answers through the tunnel; the pings are
# there to leak if anything lets them.
traffic_start() {
	ip netns exec lan ping -q -i 0.05 192.0.2.1 >/dev/null 2>&1 &
	ping4_pid=$!
	ip netns exec lan ping -q -6 -i 0.05 2001:db8:1::1 >/dev/null 2>&1 &
	ping6_pid=$!
}
traffic_stop() {
	kill "$ping4_pid" "$ping6_pid" 2>/dev/null
	wait "$ping4_pid" "$ping6_pid" 2>/dev/null
}

# gateway_config [EXTRA]: the config; EXTRA is YAML put at the top level,
# GW_DAD the dad: setting (off by default).
gateway_config() {
	[[ -s /etc/nodeagent/keys/wg0.key ]] || (umask 077; mkdir -p /etc/nodeagent/keys; wg genkey > /etc/nodeagent/keys/wg0.key)
	[[ -n ${exit_peer:-} ]] || exit_peer=$(wg genkey | wg pubkey)
	local dad='{disabled: true}'
	[[ -n ${GW_DAD:-} ]] && dad=$GW_DAD
	cat <<YAML
dad: $dad
sysctls:
  net.ipv4.ip_forward: "1"
  net.ipv6.conf.all.forwarding: "1"
vlans:
  - {name: $VLAN, parent: $TRUNK, id: 50, addresses: [10.10.50.1/24, "fd50::1/64"]}
wireguard:
  - name: wg0
    implementation: kernel
    privateKeyFile: /etc/nodeagent/keys/wg0.key
    listenPort: 51820
    addresses: [10.90.0.1/24]
    peers:
      - {name: exit, publicKey: $exit_peer, allowedIPs: [0.0.0.0/0, "::/0"]}
routing:
  tables:
    - {id: 150, name: vlan50-egress, killSwitch: true, routes: [{to: default, dev: wg0}, {to: "::/0", dev: wg0}]}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
    - {priority: 1001, from: "fd50::/64", table: 150}
firewall:
  killSwitch:
    - {from: 10.10.50.0/24, allowOut: [wg0]}
    - {from: "fd50::/64", allowOut: [wg0]}
checks: {gatewayARP: false}
${1:-}
YAML
}

# owned_present: every routing object of the gateway config is there, and
# nodeagent's (the rules, table 150's routes and kill switch, v4 and v6).
owned_present() {
	ip rule show | grep -q '^1000:.*lookup vlan50-egress' &&
		ip -6 rule show | grep -q '^1001:.*lookup vlan50-egress' &&
		ip route show table 150 | grep -q '^default dev wg0 proto nodeagent' &&
		ip route show table 150 | grep -q '^unreachable default' &&
		ip -6 route show table 150 | grep -q '^default dev wg0 proto nodeagent' &&
		ip -6 route show table 150 | grep -q '^unreachable default'
}

# --- the netplan steps (46-netplan.sh, reboot/55-netplan.sh) ------------
# np_links: the README walkthrough's links, which its
# 00-nodeagent.network names.
np_links="enp1s0.50 vlan50-shim wg-pia wg0"
# add_item KEY ITEM: ITEM first in the top-level list KEY, indented as the
# list's first item is; fails if there is no such list.
add_item() {
	awk -v k="$1:" -v item="$2" '
		$0 == k && !done { print; if ((getline nxt) <= 0 || !match(nxt, /^ *- /)) exit 2
			print substr(nxt, 1, RLENGTH - 2) "- " item; print nxt; done = 1; next }
		{ print }
		END { if (!done) exit 2 }'
}
# np_config FILE: FILE with the README's links added; macvlans: is made if
# the config has none.
np_config() {
	local macvlan='{name: vlan50-shim, parent: enp1s0.50}'
	{
		if grep -q '^macvlans:$' "$1"; then
			add_item macvlans "$macvlan" < "$1"
		else
			cat "$1"; printf 'macvlans:\n  - %s\n' "$macvlan"
		fi
	} | add_item vlans '{name: enp1s0.50, parent: enp1s0, id: 50}' |
		add_item wireguard '{name: wg-pia, implementation: kernel, privateKeyFile: /etc/nodeagent/keys/wg-pia.key, listenPort: 51829}'
}
# np_verdicts: each link's SETUP in networkctl list, once networkd has
# settled on them (none pending or configuring), as "link:setup ...".
np_verdicts() {
	local list deadline=$((SECONDS + 20))
	while :; do
		list=$(networkctl list --no-legend --no-pager 2>/dev/null)
		awk -v links=" $np_links " 'index(links, " " $2 " ") && $5 ~ /^(pending|initialized|configuring)$/ {bad = 1} END {exit bad}' <<< "$list" && break
		((SECONDS >= deadline)) && break
		sleep 0.5
	done
	awk -v links=" $np_links " 'index(links, " " $2 " ") {printf "%s:%s ", $2, $5}' <<< "$list"
}
np_all_unmanaged() {
	local v l
	v=" $(np_verdicts)"
	echo "networkctl list: $v"
	for l in $np_links; do [[ $v == *" $l:unmanaged "* ]] || return 1; done
}
# np_file_is_readmes: the file on the node is the README's block.
np_file_is_readmes() { diff -u <(readme_block file:/etc/systemd/network/00-nodeagent.network) /etc/systemd/network/00-nodeagent.network; }
