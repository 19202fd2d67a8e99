# --- nm: NetworkManager owns the uplink -------------------------------------
# NetworkManager 1.42 takes every link it finds configured as "connected
# (externally)", and `nmcli device reapply` on one replaces nodeagent's
# address with its own (noprefixroute, a prefix route of metric 400).
# nodeagent asks it over D-Bus to leave its links unmanaged. Here
# NetworkManager owns the uplink up0 (a keyfile profile) and nodeagent runs
# the gateway config with a macvlan shim; for about a minute, with the VLAN
# host sending, the uplink is brought up again, NetworkManager restarted
# and each of nodeagent's links reapplied, twice: nothing leaks, every
# object is nodeagent's, and NetworkManager holds none of nodeagent's links
# (or else the Coexistence condition names it). Then an operator hands the
# VLAN back to NetworkManager: the condition names it, with the fix, until
# it is let go again. NetworkManager is stopped at the end.
begin nm
unset GW_DAD
nm_links="$VLAN shim0 wg0"
ip netns list | grep -qw wan || check topology topo_up
gateway_config "macvlans:
  - {name: shim0, parent: $TRUNK, addresses: [10.10.60.3/24]}" | write_config
check validates nodeagent validate
if is active; then
	check reload systemctl reload nodeagent
else
	check start systemctl start nodeagent
fi
check ready wait_for 30 nodeagentctl status
check converged wait_for 20 owned_present

# nm_addr LINK PREFIX: the address is on the link in nodeagent's form: no
# noprefixroute, no metric.
nm_addr() {
	local line
	line=$(ip addr show dev "$1" | grep -F " $2 ") || { echo "$2 is not on $1"; return 1; }
	case $line in
	*noprefixroute* | *metric*) echo "$1: $line"; return 1 ;;
	esac
}
# nm_ours: every address of nodeagent's in its form, and no prefix route of
# NetworkManager's (metric 400) on its links.
nm_ours() {
	nm_addr "$VLAN" 10.10.50.1/24 && nm_addr "$VLAN" fd50::1/64 && nm_addr shim0 10.10.60.3/24 && nm_addr wg0 10.90.0.1/24 || return 1
	local l
	for l in $nm_links; do
		if ip route show table all dev "$l" | grep -E 'metric 4[0-9]{2}'; then return 1; fi
		if ip -6 route show table all dev "$l" | grep -E 'metric 4[0-9]{2}'; then return 1; fi
	done
}
# nm_let_go: NetworkManager holds none of nodeagent's links.
nm_let_go() {
	local l devs
	devs=$(nmcli -t -f DEVICE,STATE device) || return 1
	for l in $nm_links; do
		grep -qx "$l:unmanaged" <<< "$devs" || return 1
	done
}
# nm_named: the Coexistence condition names NetworkManager.
nm_named() { nodeagentctl status -o json | grep -q 'NetworkManager: holds'; }
nm_not_named() { ! nm_named; }
nm_held_or_named() { nm_let_go || nm_named; }
nm_running() { busctl --system status org.freedesktop.NetworkManager > /dev/null 2>&1 && nmcli -t general status > /dev/null 2>&1; }
nm_asked() { journalctl -u nodeagent --no-pager -o cat | grep -c "asked NetworkManager to leave nodeagent's link unmanaged"; }
nm_show() {
	nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device | sed 's/^/    nmcli: /'
	local l
	for l in $nm_links; do
		ip addr show dev "$l" | grep -E '^ +inet' | sed "s/^ */    $l: /"
	done
}

mkdir -p /etc/NetworkManager/system-connections
(
	umask 077
	cat > /etc/NetworkManager/system-connections/uplink.nmconnection <<'NM'
[connection]
id=uplink
uuid=6a1c7f56-5e0f-4f43-9a64-6a3a4e0c2b11
type=ethernet
interface-name=up0
autoconnect=true

[ipv4]
method=manual
address1=192.0.2.2/24,192.0.2.1

[ipv6]
method=manual
address1=2001:db8:1::2/64
NM
)
# NetworkManager's 85-nm-unmanaged.rules leave a veth (up0) unmanaged.
udevadm info -q property /sys/class/net/up0 | grep -E '^(ID_NET_DRIVER|NM_UNMANAGED)=' | sed 's/^/    up0 udev: /'
asked0=$(nm_asked)
check nm-start sh -c 'systemctl unmask NetworkManager && systemctl start NetworkManager'
check nm-running wait_for 30 nm_running
nmcli -t -f DEVICE,STATE device | grep -q '^up0:unmanaged$' && check uplink-managed nmcli device set up0 managed yes
check uplink-up nmcli connection up uplink
check uplink-connected wait_for 30 sh -c 'nmcli -t -f DEVICE,STATE device | grep -qx "up0:connected"'
check uplink-address sh -c 'ip addr show dev up0 | grep -q " 192.0.2.2/24 "'
# nodeagent sees NetworkManager start and asks it to leave each link alone.
check let-go wait_for 20 nm_let_go
nm_show
# Asked at most once per link, and about every link NetworkManager took.
# (NetworkManager does not always take wg0: with ifupdown installed beside
# it, it left wg0 unmanaged from the start, and nodeagent had nothing to
# ask; its reason is printed.)
check asked-at-most-once-per-link sh -c "test \$(journalctl -u nodeagent --no-pager -o cat | grep 'asked NetworkManager to leave' | grep -o 'link=[^ ]*' | sort | uniq -d | wc -l) = 0"
check asked-some test "$(($(nm_asked) - asked0))" -ge 1
journalctl -u nodeagent --no-pager -o cat | grep "asked NetworkManager" | sed 's/^/    journal: /'
for l in $nm_links; do
	journalctl -u nodeagent --no-pager -o cat | grep "asked NetworkManager" | grep -q "link=$l " ||
		nmcli -f GENERAL.DEVICE,GENERAL.STATE,GENERAL.NM-MANAGED,GENERAL.REASON device show "$l" 2>&1 | sed "s/^/    not asked about $l: /"
done
check no-hazard-when-let-go nm_not_named

traffic_start
sleep 1
before=$(leaks)
vlan_idx=$(ifindex "$VLAN")
for round in 1 2; do
	check "uplink-up-again-$round" nmcli connection up uplink
	sleep 5
	asked=$(nm_asked)
	echo "    NetworkManager's state of $VLAN (/run/NetworkManager/devices/$vlan_idx) before the restart:"
	sed 's/^/      /' "/run/NetworkManager/devices/$vlan_idx" 2>/dev/null
	check "nm-restart-$round" systemctl restart NetworkManager
	check "nm-running-after-restart-$round" wait_for 30 nm_running
	sleep 10
	nm_show
	if nm_let_go && test "$(nm_asked)" = "$asked"; then
		echo "    restart $round: NetworkManager kept nodeagent's links unmanaged; nodeagent did not have to ask again"
	else
		echo "    restart $round: nodeagent asked again for $(($(nm_asked) - asked)) links"
	fi
	check "let-go-after-restart-$round" wait_for 20 nm_let_go
	for l in $nm_links; do
		out=$(nmcli device reapply "$l" 2>&1)
		rc=$?
		echo "    nmcli device reapply $l: exit $rc: $out"
		if ((rc != 0)); then pass "reapply-refused-$round-$l"; else fail "reapply-refused-$round-$l" "reapply of an unmanaged link succeeded"; fi
	done
	sleep 5
	check "ours-after-reapply-$round" wait_for 20 nm_ours
done
after=$(leaks)
traffic_stop
echo "    at the WAN from the VLAN: before $before, after $after"
check no-leak test "$after" = "v4 0 v6 0"
check traffic-flowed sh -c 'ip netns exec lan ip -s link show lan0.50 | awk "/TX:/{getline; exit !(\$2 > 200)}"'
check all-ours nm_ours
check routing-present owned_present
check plan-no-changes sh -c 'nodeagent plan | tee /dev/stderr | grep -qx "no changes"'
check not-held-or-named nm_held_or_named
nm_show

# An operator hands the VLAN back to NetworkManager: nodeagent does not
# fight over it, and names it, with the fix, until it is let go.
check takeback nmcli device set "$VLAN" managed yes
check takeback-named wait_for 15 nm_named
check takeback-fix sh -c "nodeagentctl status -o json | grep -q 'unmanaged-devices=interface-name:$VLAN'"
nodeagentctl status -o json | grep -o 'NetworkManager: holds[^;]*' | sed 's/^/    condition: /'
sleep 2
nmcli -t -f DEVICE,STATE,CONNECTION device | grep "^$VLAN:" | sed 's/^/    after the takeback: /'
check takeback-not-fought sh -c "nmcli -t -f DEVICE,STATE device | grep '^$VLAN:' | grep -qv unmanaged"
traffic_start
out=$(nmcli device reapply "$VLAN" 2>&1)
echo "    nmcli device reapply $VLAN while NetworkManager holds it: exit $?: $out"
sleep 1
nm_show
check ours-after-takeback-reapply wait_for 20 nm_ours
check takeback-routing-present owned_present
check let-go-again nmcli device set "$VLAN" managed no
check condition-clears wait_for 15 nm_not_named
after=$(leaks)
traffic_stop
check takeback-no-leak test "$after" = "v4 0 v6 0"

# NetworkManager off (and masked again) for the steps after this one.
systemctl stop NetworkManager
systemctl mask NetworkManager > /dev/null 2>&1
check nm-stopped sh -c '! systemctl is-active --quiet NetworkManager'
check no-hazard-after-stop wait_for 15 nm_not_named
