# --- fight: a program that re-adds its own form of the VLAN's address --------
# Every second for two minutes, a loop deletes the VLAN's address and adds
# it back as noprefixroute valid_lft 300 (what a DHCP client with a lease
# does). nodeagent repairs it at once up to agent/fight's bound (10 within
# a minute), then once per resync (30 s): its repairs stay within that
# bound, the Conflict condition names the address, the rate and the likely
# program, and the node reads degraded. Meanwhile the kill switch's rule
# and unreachable default are deleted every 20 s and each is back at once,
# as always (deletion to re-add from an ip -ts monitor record, with the
# networkd step's repairs()); nothing from the VLAN leaks. After the loop
# stops the address is nodeagent's again within one resync.
begin fight
check ready wait_for 30 nodeagentctl status
check converged wait_for 20 owned_present
addr_ours() {
	local line
	line=$(ip addr show dev "$VLAN" | grep -F ' 10.10.50.1/24 ') || return 1
	[[ $line != *noprefixroute* ]] && ip addr show dev "$VLAN" | grep -A1 -F ' 10.10.50.1/24 ' | grep -q 'valid_lft forever'
}
check ours-before addr_ours
since=$(date '+%Y-%m-%d %H:%M:%S')
start=$SECONDS
ip -ts monitor rule route > /root/fight-monitor.log 2>&1 &
mon=$!
traffic_start
sleep 1
before=$(leaks)
ks_count=0 ks_missed=0
degraded_seen=0 named_seen=0 next_ks=20
while ((SECONDS - start < 120)); do
	ip addr del 10.10.50.1/24 dev "$VLAN" 2>/dev/null
	ip addr add 10.10.50.1/24 dev "$VLAN" noprefixroute valid_lft 300 preferred_lft 300 2>/dev/null
	t=$((SECONDS - start))
	if ((t >= next_ks)); then
		next_ks=$((next_ks + 20))
		# The kill switch's objects: repaired at once, never backed off.
		ip rule del priority 1000 2>/dev/null
		ip route del unreachable default table 150 metric 4294967295 2>/dev/null
		if wait_for 5 owned_present; then
			ks_count=$((ks_count + 1))
		else
			ks_missed=$((ks_missed + 1))
		fi
	fi
	if ((t >= 60 && named_seen == 0)); then
		nodeagentctl status -o json | grep -A3 '"type": "Conflict"' | grep -q "address 10.10.50.1/24 on $VLAN: changed back by another program [0-9]* repairs in" && named_seen=1
		nodeagentctl status > /dev/null 2>&1; [[ $? == 1 ]] && degraded_seen=1
		nodeagentctl status -o json | grep -A3 '"type": "Conflict"' | grep '"message"' | sed 's/^ */    condition: /'
	fi
	sleep 1
done
stopped=$SECONDS
echo "    the loop ran $((stopped - start)) s"
sleep 1
kill "$mon"; wait "$mon" 2>/dev/null
check back-within-one-resync wait_for 35 addr_ours
echo "    the address was nodeagent's again $((SECONDS - stopped)) s after the loop stopped"
after=$(leaks)
traffic_stop
echo "    at the WAN from the VLAN: before $before, after $after"
check no-leak test "$after" = "v4 0 v6 0"
repairs=$(journalctl -u nodeagent --since "$since" --no-pager -o cat | grep -cE "op=\"[+~] (re-own )?address 10.10.50.1/24 on $VLAN")
echo "    the address was repaired $repairs times in 2 minutes of changes every second (without the bound: about 120)"
# The bound: 10 at once, one at each resync of the 110 s left, one after.
check repairs-within-bound test "$repairs" -le 15
check backed-off test "$repairs" -ge 10
check condition-named test "$named_seen" = 1
check degraded-meanwhile test "$degraded_seen" = 1
journalctl -u nodeagent --since "$since" --no-pager -o cat | grep 'backing off' | sed 's/^/    journal: /'
echo "    kill switch: deleted and back $ks_count times, missed $ks_missed"
check killswitch-repaired test "$ks_missed" = 0 -a "$ks_count" -ge 5
# Deletion to re-add of each, from the kernel's own record.
repairs /root/fight-monitor.log | grep -E '^1000:|^unreachable default' > /root/fight.repairs
sed 's/^/    kill switch: /' /root/fight.repairs
check killswitch-each-repaired-once awk '{for (i = 1; i <= NF; i++) { if ($i == "deleted") d = $(i+1); if ($i == "re-added") a = $(i+1) } if (d != a || d < 5) bad = 1} END {exit bad || NR < 2}' /root/fight.repairs
check killswitch-at-once awk '{for (i = 1; i <= NF; i++) if ($i == "max-ms" && $(i+1) > 2000) bad = 1} END {exit bad}' /root/fight.repairs
journalctl -u nodeagent --since "$since" --no-pager -o cat | grep -c 'sync failed' | sed 's/^/    syncs failed during the fight: /' 
