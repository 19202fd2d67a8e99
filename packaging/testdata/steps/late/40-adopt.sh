# --- adopt: a node set up the old way, imported and taken over -------------
# Sourced by deb-acceptance.sh after the purge, so nodeagent is gone and
# the node is made the way the seeds' Ansible roles made it:
#   - vlan50.service, a oneshot unit running `ip link`, makes $VLAN with
#     10.10.50.1/24;
#   - wg-quick@wg0: 10.90.0.1/24, listen 51820, 20 peers (one of them the
#     remote client, wg9 in the wan namespace, 10.90.0.2), a PostUp
#     iptables MASQUERADE;
#   - `ip rule from 10.10.50.0/24 table 150` (priority 1000), table 150
#     named vlan50-egress in rt_tables.d, with a default via the WAN and
#     an unreachable fallback;
#   - sysctls: forwarding on, rp_filter loose on the VLAN.
# The VLAN host (lan0.50) pings the WAN through table 150 and the remote
# client pings 10.90.0.1 over the tunnel, 20 a second each, from before
# the import to after the take-over: not one may be lost.
begin adopt
systemctl stop nodeagent > /dev/null 2>&1
ip addr replace 192.0.2.2/24 dev up0
ip link set up0 up
# The WAN answers the VLAN (no NAT on the VLAN's egress in this setup).
ip -n wan route replace 10.10.50.0/24 via 192.0.2.2

cat > /etc/systemd/system/vlan50.service <<UNIT
[Unit]
Description=VLAN 50 on the trunk (the old way)
After=network-pre.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/ip link add link $TRUNK name $VLAN type vlan id 50
ExecStart=/sbin/ip addr add 10.10.50.1/24 dev $VLAN
ExecStart=/sbin/ip link set $VLAN up
ExecStart=/sbin/ip rule add from 10.10.50.0/24 table 150 priority 1000
ExecStart=/sbin/ip route add default via 192.0.2.1 dev up0 table 150
ExecStart=/sbin/ip route add unreachable default metric 4000 table 150
ExecStart=/bin/sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward; echo 2 > /proc/sys/net/ipv4/conf/all/rp_filter'
[Install]
WantedBy=multi-user.target
UNIT
mkdir -p /etc/iproute2/rt_tables.d
echo "150 vlan50-egress" > /etc/iproute2/rt_tables.d/vlan50.conf

# The remote client's key and the server's; 19 more peers that never
# connect, one with a preshared key.
server_key=$(wg genkey)
client_key=$(wg genkey)
psk=$(wg genpsk)
{
	cat <<CONF
[Interface]
Address = 10.90.0.1/24
ListenPort = 51820
PrivateKey = $server_key
PostUp = iptables -t nat -A POSTROUTING -s 10.90.0.0/24 -o up0 -j MASQUERADE
PostDown = iptables -t nat -D POSTROUTING -s 10.90.0.0/24 -o up0 -j MASQUERADE

# remote-laptop
[Peer]
PublicKey = $(echo "$client_key" | wg pubkey)
AllowedIPs = 10.90.0.2/32
CONF
	for i in $(seq 3 21); do
		printf '\n# phone-%d\n[Peer]\nPublicKey = %s\nAllowedIPs = 10.90.0.%d/32\n' "$i" "$(wg genkey | wg pubkey)" "$i"
		((i == 3)) && printf 'PresharedKey = %s\n' "$psk"
	done
} > /etc/wireguard/wg0.conf
chmod 600 /etc/wireguard/wg0.conf

check old-units-enabled systemctl enable vlan50.service wg-quick@wg0.service
check old-vlan-started systemctl start vlan50.service || journalctl -u vlan50 --no-pager | tail -20
check old-wg-started systemctl start wg-quick@wg0.service || journalctl -u wg-quick@wg0 --no-pager | tail -20
check old-twenty-peers test "$(wg show wg0 peers | wc -l)" = 20
check old-masquerade sh -c 'iptables -t nat -S POSTROUTING | grep -q "10.90.0.0/24.*MASQUERADE"'

# The remote client in the wan namespace.
ip -n wan link add wg9 type wireguard
echo "$client_key" > /root/client.key
ip netns exec wan wg set wg9 private-key /root/client.key peer "$(echo "$server_key" | wg pubkey)" endpoint 192.0.2.2:51820 allowed-ips 10.90.0.0/24 persistent-keepalive 5
ip -n wan addr add 10.90.0.2/24 dev wg9
ip -n wan link set wg9 up
check client-session wait_for 20 ip netns exec wan ping -c1 -W1 10.90.0.1
check vlan-host-egress wait_for 20 ip netns exec lan ping -c1 -W1 192.0.2.1

# Traffic from here to the end of the take-over; ping's summary (on
# SIGINT) counts what was lost.
ip netns exec lan ping -i 0.05 -W 1 192.0.2.1 > /root/adopt-vlan.ping 2>&1 &
vping=$!
ip netns exec wan ping -i 0.05 -W 1 10.90.0.1 > /root/adopt-client.ping 2>&1 &
cping=$!

ip -d rule show | sed 's/^/    before: /'
ip -6 -d rule show | sed 's/^/    before: /'

# --- import ---
check install dpkg -i --force-confold "$deb"
check not-started test "$(systemctl is-active nodeagent)" = inactive
rm -rf /root/import
check import sh -c 'nodeagent import --out /root/import > /root/import.out 2>&1; rc=$?; cat /root/import.out; exit $rc'
sed 's/^/    | /' /root/import/nodeagent.yaml | head -120
# The PostUp line is listed, with the firewall stanza that does its job.
check import-lists-masquerade sh -c 'grep -q "#.*PostUp = iptables -t nat -A POSTROUTING -s 10.90.0.0/24 -o up0 -j MASQUERADE" /root/import/nodeagent.yaml && grep -q "^# *masquerade:" /root/import/nodeagent.yaml && grep -q "^# *- {from: 10.90.0.0/24, out: up0}" /root/import/nodeagent.yaml'
check import-prints-disable grep -q 'systemctl disable wg-quick@wg0' /root/import.out
check import-prints-old-vlan-unit grep -q 'systemctl disable vlan50.service' /root/import.out
check import-key-private test "$(stat -c %a /root/import/keys/wg0.key)" = 600
check import-twenty-peer-files test "$(ls /root/import/peers/wg0 | wc -l)" = 20
cp -a /root/import/* /etc/nodeagent/
check validates nodeagent validate
nodeagent plan > /root/adopt-plan.out 2>&1
sed 's/^/    plan: /' /root/adopt-plan.out
# Every line of the plan is an adoption.
check plan-only-adoptions sh -c '! grep -v " adopt (" /root/adopt-plan.out | grep -q .'
check plan-has-adoptions grep -qi adopt /root/adopt-plan.out

# --- take-over ---
wg_idx=$(ifindex wg0)
vlan_idx=$(ifindex "$VLAN")
client_peer=$(echo "$client_key" | wg pubkey)
hs_before=$(wg show wg0 latest-handshakes | awk -v p="$client_peer" '$1 == p {print $2}')
rx_before=$(wg show wg0 transfer | awk -v p="$client_peer" '$1 == p {print $2}')
ip -ts monitor route rule > /root/adopt-monitor.log 2>&1 &
mon=$!
check old-wg-disabled systemctl disable wg-quick@wg0.service
check old-vlan-disabled systemctl disable vlan50.service
check start systemctl start nodeagent
check ready wait_for 60 nodeagentctl status
sleep 3
kill "$mon"
wait "$mon" 2>/dev/null
sed 's/^/    monitor: /' /root/adopt-monitor.log | head -40
check wg-ifindex-kept test "$(ifindex wg0)" = "$wg_idx"
check vlan-ifindex-kept test "$(ifindex "$VLAN")" = "$vlan_idx"
check twenty-peers-kept test "$(wg show wg0 peers | wc -l)" = 20
hs_after=$(wg show wg0 latest-handshakes | awk -v p="$client_peer" '$1 == p {print $2}')
rx_after=$(wg show wg0 transfer | awk -v p="$client_peer" '$1 == p {print $2}')
echo "    remote client: handshake $hs_before -> $hs_after, rx $rx_before -> $rx_after"
# The session goes on: the counters were not reset, and no handshake came
# of the take-over (one from WireGuard's own two-minute rekey may).
check session-counts test "$rx_after" -gt "$rx_before"
check no-forced-handshake test "$hs_after" = "$hs_before" -o $((hs_after - hs_before)) -ge 110
check route-ours sh -c 'ip route show table 150 | grep -q "^default via 192.0.2.1 dev up0 proto nodeagent"'
check fallback-ours sh -c 'ip route show table 150 | grep -q "^unreachable default proto nodeagent metric 4000"'
check rule-ours sh -c 'ip rule show | grep -q "^1000:.*from 10.10.50.0/24.*proto nodeagent"'
check one-rule test "$(ip rule show | grep -c '^1000:')" = 1
check no-route-deleted sh -c '! grep -q "^.*Deleted.*table \(150\|vlan50-egress\)" /root/adopt-monitor.log'
# The old rule goes only after nodeagent's is in: the first added rule
# 1000 line comes before the Deleted one.
added=$(grep -n '1000:.*proto nodeagent' /root/adopt-monitor.log | grep -v Deleted | head -1 | cut -d: -f1)
deleted=$(grep -n 'Deleted.*1000:' /root/adopt-monitor.log | head -1 | cut -d: -f1)
echo "    monitor: nodeagent's rule at line ${added:-none}, the old one deleted at line ${deleted:-none}"
check rule-make-before-break test -n "$added" -a -n "$deleted" -a "${added:-0}" -lt "${deleted:-0}"
check after-empty-plan test "$(nodeagent plan)" = "no changes"
sleep 2
kill -INT "$vping" "$cping"
wait "$vping" "$cping" 2>/dev/null
grep 'packets transmitted' /root/adopt-vlan.ping | sed 's/^/    VLAN host: /'
grep 'packets transmitted' /root/adopt-client.ping | sed 's/^/    remote client: /'
# lost FILE: the echoes that got no reply before a later one did (a gap in
# the icmp_seq of the replies). The last one or two may still be in flight
# when ping is stopped: under load (TCG) an echo takes longer than the
# 50 ms between two, and ping then counts it lost; that is not a loss of
# the path, and is printed apart.
lost() { awk -F'icmp_seq=' '/icmp_seq=/ {split($2, a, " "); s = a[1] + 0; n++; if (s > max) max = s} END {print max - n}' "$1"; }
inflight() { awk -F'icmp_seq=' '/icmp_seq=/ {split($2, a, " "); if (a[1] + 0 > max) max = a[1] + 0} /packets transmitted/ {sent = $1 + 0} END {print sent - max}' "$1"; }
echo "    in flight when stopped (not counted): VLAN host $(inflight /root/adopt-vlan.ping), remote client $(inflight /root/adopt-client.ping)"
check vlan-host-no-loss test "$(lost /root/adopt-vlan.ping)" = 0
check client-no-loss test "$(lost /root/adopt-client.ping)" = 0
check at-most-two-in-flight test "$(inflight /root/adopt-vlan.ping)" -le 2 -a "$(inflight /root/adopt-client.ping)" -le 2

# --- a fixed point: importing what nodeagent now runs gives the same ---
rm -rf /root/import2
check reimport sh -c 'nodeagent import --out /root/import2 > /dev/null'
check fixed-point sh -c 'diff -u /root/import/nodeagent.yaml /root/import2/nodeagent.yaml'
check old-units-off sh -c '! systemctl is-enabled --quiet wg-quick@wg0 && ! systemctl is-enabled --quiet vlan50'

# --- the reboot: the node must come up from nodeagent alone -------------
# This boot runs from an initramfs, which a reboot would bring back
# fresh, so the root as it is now is copied to the VM's disk, which
# testdata/rdinit.sh boots from next time (the namespaces, which no
# disk keeps, are made again there, as the uplink's manager would).
wg show wg0 public-key > /root/adopt-wg0.pub
# The uplink's default route, which its manager makes again at boot.
ip -4 route show default table main > /root/adopt-uplink-routes
mkdir -p /mnt/vm
if mount /dev/vda /mnt/vm; then
	# tar, not cp: cp refuses to copy / into a directory under it.
	tar -C / --one-file-system --exclude=./mnt/vm -cf - . | tar -C /mnt/vm -xpf - &&
		mkdir -p /mnt/vm/dev /mnt/vm/proc /mnt/vm/sys /mnt/vm/run /mnt/vm/tmp &&
		touch /mnt/vm/root/adopt-rebooted /mnt/vm/.vm-root
	saved=no
	check root-saved test -e /mnt/vm/.vm-root && saved=yes
	echo "    saved the root: $(df -h /mnt/vm | awk 'NR == 2 {print $3}') on /dev/vda"
	umount /mnt/vm
	# No @@deb:done@@ yet: the boot after this one says it. Without a
	# saved root the reboot would run the whole test again: stop here.
	[[ $saved == yes ]] || exit 1
	trap - EXIT
	sync
	echo "=== rebooting"
	systemctl reboot
	exit 0
else
	fail root-saved "no /dev/vda to save the root on"
fi
