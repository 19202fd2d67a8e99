# --- networkd: systemd-networkd owns the uplink ----------------------------
# networkd 252 with its defaults deletes every routing rule and route it did
# not make whenever it configures a link it manages. nodeagent runs the
# gateway config while the uplink is reconfigured, networkd reloaded and
# restarted, 5 times each, with the VLAN host sending throughout: nothing
# from the VLAN reaches the WAN, every deletion is repaired once (not
# fought over), and the Coexistence condition names both settings and the
# fix. With the shipped drop-in installed, the same runs delete nothing.
begin networkd
check topology topo_up
mkdir -p /etc/systemd/network
cat > /etc/systemd/network/10-up0.network <<'NET'
[Match]
Name=up0

[Network]
Address=192.0.2.2/24
Gateway=192.0.2.1
Address=2001:db8:1::2/64
IPv6AcceptRA=no
NET
check networkd-start systemctl start systemd-networkd
check uplink-configured wait_for 30 sh -c 'networkctl status up0 | grep -q "State: routable (configured)"'
# A clean start on the gateway config: the earlier steps' objects go.
systemctl stop nodeagent
nodeagent teardown >/dev/null 2>&1
gateway_config | write_config
since=$(date +%s)
check validates nodeagent validate
check start systemctl start nodeagent
check ready wait_for 30 nodeagentctl status
check converged wait_for 20 owned_present
status_json() { nodeagentctl status -o json; }
check names-rules-setting wait_for 35 sh -c 'nodeagentctl status -o json | grep -q ManageForeignRoutingPolicyRules'
check names-routes-setting sh -c 'nodeagentctl status -o json | grep -q ManageForeignRoutes=yes'
check names-fix sh -c 'nodeagentctl status -o json | grep -q /etc/systemd/networkd.conf.d/nodeagent.conf'
check not-degraded nodeagentctl status
nodeagentctl status | grep -A3 -i coexistence | sed 's/^/    /'

# A .network file whose Name=en* catches the VLAN: named, live (the file
# watch, not the 30 s look), and gone once the file is.
printf '[Match]\nName=en*\n\n[Network]\nDHCP=yes\n' > /etc/systemd/network/50-en.network
check names-matching-file wait_for 10 sh -c "nodeagentctl status -o json | grep -q '50-en.network.*$VLAN'"
rm /etc/systemd/network/50-en.network
check matching-file-gone wait_for 10 sh -c '! nodeagentctl status -o json | grep -q 50-en.network'

# repairs LOG: per object (rule or route, v4 or v6), "deleted N re-added M
# median-ms max-ms", from an ip -ts monitor record: each deletion to the
# next addition of the same object.
repairs() {
	awk '
	function secs(ts,  t) { split(ts, t, "T"); split(t[2], t, ":"); return t[1]*3600 + t[2]*60 + t[3] }
	/^\[/ {
		ts = substr($1, 2, length($1) - 2)
		line = $0; sub(/^\[[^]]*\] /, "", line)
		del = sub(/^Deleted /, "", line)
		if (line !~ /^100[01]:|vlan50-egress/) next
		key = line; gsub(/[ \t]+/, " ", key)
		if (del) { dels[key]++; at[key] = secs(ts); next }
		adds[key]++
		if (key in at) { ms = (secs(ts) - at[key]) * 1000; n[key]++; d[key, n[key]] = ms; delete at[key] }
	}
	END {
		for (k in dels) {
			m = n[k]; for (i = 1; i <= m; i++) v[i] = d[k, i]
			for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
			printf "%s | deleted %d re-added %d median-ms %.0f max-ms %.0f\n", k, dels[k], adds[k]+0, m ? v[int((m+1)/2)] : -1, m ? v[m] : -1
		}
	}' "$1"
}

# events LOG: the 15 events, each waited out until every object is back,
# with the monitor recording into LOG.
events() {
	ip -ts monitor rule route > "$1" 2>&1 &
	local mon=$! i
	sleep 0.5
	for i in 1 2 3 4 5; do
		networkctl reconfigure up0
		sleep 1
		wait_for 10 owned_present || fail "back-after-reconfigure-$i" "$(ip rule; ip route show table 150)"
	done
	for i in 1 2 3 4 5; do
		networkctl reload
		sleep 1
		wait_for 10 owned_present || fail "back-after-reload-$i" "$(ip rule; ip route show table 150)"
	done
	for i in 1 2 3 4 5; do
		systemctl restart systemd-networkd
		wait_for 20 sh -c 'networkctl status up0 | grep -q "State: routable (configured)"'
		sleep 1
		wait_for 10 owned_present || fail "back-after-restart-$i" "$(ip rule; ip route show table 150)"
	done
	sleep 1
	kill "$mon"
	wait "$mon" 2>/dev/null
}

traffic_start
sleep 1
before=$(leaks)
events /root/networkd-defaults.log
after=$(leaks)
traffic_stop
echo "    at the WAN from the VLAN: before $before, after $after"
check no-leak test "$after" = "v4 0 v6 0"
check traffic-flowed sh -c 'ip netns exec lan ip -s link show lan0.50 | awk "/TX:/{getline; exit !(\$2 > 200)}"'
repairs /root/networkd-defaults.log > /root/networkd-defaults.repairs
sed 's/^/    defaults: /' /root/networkd-defaults.repairs
check deletions-seen grep -q 'deleted [1-9]' /root/networkd-defaults.repairs
check rule-v4-deleted grep -q '^1000:.*deleted [1-9]' /root/networkd-defaults.repairs
check killswitch-route-deleted grep -q '^unreachable default.*deleted [1-9]' /root/networkd-defaults.repairs
# One repair per deletion: re-added as often as deleted, no fight.
check one-repair-per-deletion awk '{for (i = 1; i <= NF; i++) { if ($i == "deleted") d = $(i+1); if ($i == "re-added") a = $(i+1) } if (d != a) bad = 1} END {exit bad}' /root/networkd-defaults.repairs
check all-back owned_present
# One WARN line per cause, with its fix, however many repairs.
jc() { journalctl -u nodeagent --since "@$since" --no-pager -o cat; }
check cause-rules-logged-once test "$(jc | grep 'repairing what a neighbour deleted' | grep -c ManageForeignRoutingPolicyRules)" = 1
check cause-routes-logged-once test "$(jc | grep 'repairing what a neighbour deleted' | grep -c 'ManageForeignRoutes=yes')" = 1
jc | grep 'repairing what a neighbour deleted' | sed 's/^/    journal: /'
# Counted per kind (the metrics listener is on since the metrics step).
check rule-repairs-counted bash -c "scrape | grep -E '^nodeagent_drift_repairs_total\\{kind=\"rule\"\\} [1-9]'"
check route-repairs-counted bash -c "scrape | grep -E '^nodeagent_drift_repairs_total\\{kind=\"route\"\\} [1-9]'"

# The documented drop-in: networkd leaves foreign rules and routes alone.
mkdir -p /etc/systemd/networkd.conf.d
check drop-in-shipped cp /usr/share/doc/nodeagent/examples/networkd.conf.d/nodeagent.conf /etc/systemd/networkd.conf.d/nodeagent.conf
check restart-with-drop-in systemctl restart systemd-networkd
check condition-clears wait_for 35 sh -c '! nodeagentctl status -o json | grep -q ManageForeign'
check converged-with-drop-in wait_for 20 owned_present
traffic_start
events /root/networkd-dropin.log
after=$(leaks)
traffic_stop
repairs /root/networkd-dropin.log > /root/networkd-dropin.repairs
sed 's/^/    drop-in: /' /root/networkd-dropin.repairs
grep '^\[.*\] Deleted' /root/networkd-dropin.log | head -5 | sed 's/^/    drop-in, deleted (not ours): /'
check drop-in-no-deletions sh -c '! grep -q "deleted [1-9]" /root/networkd-dropin.repairs'
check drop-in-no-leak test "$after" = "v4 0 v6 0"

# networkd off for the steps after this one.
rm -f /etc/systemd/network/10-up0.network /etc/systemd/networkd.conf.d/nodeagent.conf
systemctl stop systemd-networkd.socket systemd-networkd
check networkd-stopped sh -c '! systemctl is-active --quiet systemd-networkd'
