# --- ifupdown: a stanza for nodeagent's VLAN in /etc/network/interfaces ------
# ifupdown 0.8 makes a VLAN named in a stanza (ifup: ip link add) and
# deletes it at ifdown and at every `systemctl restart networking` (ip link
# del), which takes nodeagent's macvlan shim on it with it. With `auto
# VLAN` written, nodeagent's Coexistence condition names the stanza and its
# fix; then ifdown (after an ifup, which records the VLAN as ifupdown's),
# and `systemctl restart networking`, 5 times each, with the VLAN host
# sending 20/s: every deletion is repaired (when ifup makes the VLAN again
# first, nodeagent takes it back), nothing leaks at the WAN, and the cause
# is logged once. The events are 7 s apart: ten deletions within a minute
# would be a fight (agent/fight's bound), which this is not.
begin ifupdown
check ifupdown-installed test -x /sbin/ifup
check ready wait_for 30 nodeagentctl status
mkdir -p /etc/network/interfaces.d
printf 'auto %s\niface %s inet manual\n' "$VLAN" "$VLAN" > /etc/network/interfaces.d/vlan50
grep -q 'interfaces.d' /etc/network/interfaces || echo 'source /etc/network/interfaces.d/*' >> /etc/network/interfaces
check hazard-named wait_for 10 sh -c "nodeagentctl status -o json | grep -q \"/etc/network/interfaces.d/vlan50:2: a stanza for nodeagent's link $VLAN (auto: \""
check fix-named sh -c "nodeagentctl status -o json | grep -q 'remove the stanza iface $VLAN (/etc/network/interfaces.d/vlan50:2) and $VLAN from its auto line (/etc/network/interfaces.d/vlan50:1)'"
check shim-named sh -c "nodeagentctl status -o json | grep -q 'and the kernel deletes shim0 with it'"
nodeagentctl status -o json | grep -o "/etc/network/interfaces.d/vlan50:2: a stanza for nodeagent's link $VLAN[^;]*" | sed 's/^/    condition: /'
# vlan_back: the VLAN is nodeagent's again, with its addresses and shim.
vlan_back() {
	ip -d link show "$VLAN" | grep -q 'alias nodeagent' &&
		ip addr show dev "$VLAN" | grep -q ' 10.10.50.1/24 ' && ip addr show dev "$VLAN" | grep -q ' fd50::1/64 ' &&
		ip -d link show shim0 2>/dev/null | grep -q "shim0@$VLAN" && ip addr show dev shim0 | grep -q ' 10.10.50.3/24 ' && owned_present
}
check converged wait_for 20 vlan_back
since=$(date '+%Y-%m-%d %H:%M:%S')
ip -o monitor link > /root/ifupdown-monitor.log 2>&1 &
mon=$!
traffic_start
sleep 1
before=$(leaks)
for i in 1 2 3 4 5; do
	ifup "$VLAN" > /dev/null 2>&1
	ifdown "$VLAN" 2>&1 | sed 's/^/    ifdown: /'
	wait_for 20 vlan_back || fail "back-after-ifdown-$i" "$(ip -br addr)"
	sleep 7
done
# ifup records the VLAN as ifupdown's, so that the first restart's ifdown
# -a takes it down too.
ifup "$VLAN" > /dev/null 2>&1
for i in 1 2 3 4 5; do
	systemctl restart networking 2>&1 | sed 's/^/    restart: /'
	wait_for 20 vlan_back || fail "back-after-restart-$i" "$(ip -br addr)"
	sleep 7
done
after=$(leaks)
traffic_stop
kill "$mon"; wait "$mon" 2>/dev/null
echo "    at the WAN from the VLAN: before $before, after $after"
check no-leak test "$after" = "v4 0 v6 0"
# (nodeagent may make the VLAN again with the ifindex it had: the monitor
# counts.)
deleted=$(grep -c "^Deleted [0-9]*: $VLAN@" /root/ifupdown-monitor.log)
echo "    VLAN deleted $deleted times (ip monitor link)"
check deleted-ten-times test "$deleted" -ge 10
check all-back vlan_back
# Who made the VLAN again each time: nodeagent (+ link) or ifup (taken back).
journalctl -u nodeagent --since "$since" --no-pager -o short-monotonic | grep -E "op=\"[+~] link $VLAN" | sed 's/^/    journal: /'
grep -E "^Deleted [0-9]*: $VLAN@|^[0-9]+: $VLAN@" /root/ifupdown-monitor.log | cut -c1-60 | uniq -c | sed 's/^/    monitor: /'
check cause-logged-once test "$(journalctl -u nodeagent --since "$since" --no-pager -o cat | grep 'repairing what a neighbour deleted' | grep -c 'interfaces.d/vlan50:2')" = 1
journalctl -u nodeagent --since "$since" --no-pager -o cat | grep 'repairing what a neighbour deleted' | sed 's/^/    journal: /'
check not-a-fight sh -c '! nodeagentctl status -o json | grep -q "\"type\": \"Conflict\"" || nodeagentctl status -o json | grep -A1 "\"type\": \"Conflict\"" | grep -q True'
rm -f /etc/network/interfaces.d/vlan50 /run/network/ifstate."$VLAN"
sed -i "/^$VLAN=/d" /run/network/ifstate 2>/dev/null
check hazard-gone wait_for 10 sh -c "! nodeagentctl status -o json | grep -q interfaces.d/vlan50"
