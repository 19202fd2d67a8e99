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
#
# Issue 40 adds, besides 35-neighbours.sh's objects: the VLAN's address in
# NetworkManager's form (noprefixroute, its own prefix route at a metric)
# with a route whose src it is; an IPv6 table 100 with a source-specific
# route in it; a hook with a token and a password; and after the take-over
# a later config without the imported rules.
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
ExecStart=/sbin/ip addr add 10.10.50.1/24 dev $VLAN noprefixroute
ExecStart=/sbin/ip -6 addr add fd50::1/64 dev $VLAN nodad
ExecStart=/sbin/ip link set $VLAN up
ExecStart=/sbin/ip route add 10.10.50.0/24 dev $VLAN proto kernel scope link src 10.10.50.1 metric 400
ExecStart=/sbin/ip route add 10.20.0.0/16 via 10.10.50.254 dev $VLAN src 10.10.50.1
ExecStart=/sbin/ip -6 route add 2001:db8:b::/48 via fd50::fe dev $VLAN table 100
ExecStart=/sbin/ip -6 route add default from 2001:db8:a::/48 via fd50::fe dev $VLAN table 100
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
PostUp = curl -fsS "https://ddns.example/update?host=node1&token=s3cr3t" -u p1234567:hunter2pass
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

# The DDNS hook's curl (the VM has none): it succeeds, as the real one would.
printf '#!/bin/sh\nexit 0\n' > /usr/local/bin/curl
chmod 755 /usr/local/bin/curl
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
ip -6 route show table 100 | grep ' from ' > /root/from-route-before.txt
sed 's/^/    from-route: /' /root/from-route-before.txt
ip route show 10.20.0.0/16 > /root/src-route-before.txt

# --- import ---
check install dpkg -i --force-confold "$deb"
check not-started test "$(systemctl is-active nodeagent)" = inactive
rm -rf /root/import
check import sh -c 'nodeagent import --out /root/import > /root/import.out 2>&1; rc=$?; cat /root/import.out; exit $rc'
sed 's/^/    | /' /root/import/nodeagent.yaml | head -200
# What the PostUp line did is said, with the firewall stanza that does its
# job; the line itself is only in the root-only notes file.
check import-lists-masquerade sh -c 'grep -q "# wg0.s PostUp (hook 1 of /etc/wireguard/wg0.conf) masquerades 10.90.0.0/24 out up0" /root/import/nodeagent.yaml && grep -q "^# *masquerade:" /root/import/nodeagent.yaml && grep -q "^# *- {from: 10.90.0.0/24, out: up0}" /root/import/nodeagent.yaml'
check import-prints-disable grep -q 'systemctl disable wg-quick@wg0' /root/import.out
# --- item 7: secrets never in a 0644 file nor in stdout; --out checked ---
begin secrets
check notes-file-0600 test "$(stat -c %a /root/import/import-notes.txt)" = 600
check notes-keep-the-hook grep -q 'token=s3cr3t' /root/import/import-notes.txt
for secret in s3cr3t hunter2pass; do
	check "no-$secret-in-stdout" sh -c "! grep -q $secret /root/import.out"
	check "no-$secret-in-0644" sh -c "! find /root/import -type f ! -perm 600 -exec grep -l $secret {} + | grep ."
done
install -d -o nobody -m 0755 /root/nobodys
check out-under-anothers-refused sh -c 'nodeagent import --out /root/nobodys/import > /root/nobodys.out 2>&1; rc=$?; cat /root/nobodys.out; test $rc = 1 && grep -q "belongs to uid" /root/nobodys.out && test -z "$(ls -A /root/nobodys)"'
# --- item 1: Cilium's and Tailscale's listed, never imported ---
begin foreign
n=0
for r in "rule 9: from all fwmark 0x200/0xf00 lookup 2004 proto kernel: Cilium's" "rule 100: from all lookup local proto kernel: Cilium's" \
	"rule 10: from all fwmark 0xa00/0xf00 lookup 2005 proto kernel: Cilium's" "rule 5270: from all lookup 52: Tailscale's" \
	"rule 5210: from all fwmark 0x80000/0xff0000 lookup main: Tailscale's" "table 2004, 2 route(s): Cilium's" "table 52, 4 route(s): Tailscale's"; do
	n=$((n + 1))
	echo "    listed $n: $r"
	check "listed-$n" grep -qF "#   $r" /root/import/nodeagent.yaml
done
check no-foreign-rule-imported sh -c '! grep -E "^    - \{priority: (9|10|100|52[0-9][0-9])," /root/import/nodeagent.yaml'
check no-foreign-table-imported sh -c '! grep -E "^    - id: (2004|2005|52)$" /root/import/nodeagent.yaml'
# --- item 4: the IPv6 from-route listed, not adopted ---
begin fromroute
check listed-in-config grep -q "# not imported: default (IPv6) from 2001:db8:a::/48 via fd50::fe dev $VLAN" /root/import/nodeagent.yaml
check listed-in-notes grep -q "from 2001:db8:a::/48" /root/import.out
check table-100-imported grep -q "^    - id: 100$" /root/import/nodeagent.yaml
# --- item 2: the roaming client's peer file names no endpoint ---
begin roaming
roam_file=$(grep -l "$(echo "$roam_key" | wg pubkey)" /root/import/peers.d/wg-pod/* 2>/dev/null)
echo "    its peer file: $roam_file"; sed 's/^/    | /' "$roam_file"
check no-endpoint-imported sh -c "test -n '$roam_file' && ! grep -qi endpoint '$roam_file'"
check port-kept grep -q "listenPort: 51821" /root/import/nodeagent.yaml
# --- item 5: each VLAN's owner named, with its step ---
begin owners
for o in "systemd-networkd: /etc/systemd/network/51-vlan51.netdev" "netplan: /etc/netplan/60-vlan52.yaml" \
	"ifupdown: /etc/network/interfaces.d/vlan53" "NetworkManager: /etc/NetworkManager/system-connections/vlan54.nmconnection"; do
	check "named-${o%%:*}" grep -qF "# $o" /root/import/nodeagent.yaml
done
for st in "rm /etc/systemd/network/51-vlan51.netdev" "sed -i '6s/^/#/' /etc/systemd/network/10-trunk.network" "sed -i '6,10s/^/#/' /etc/netplan/60-vlan52.yaml" \
	"sed -i '1s/^/#/' /etc/network/interfaces.d/vlan53" "nmcli device set $TRUNK.54 managed no" "nmcli connection delete 5f6c1a2e-7d54-4b54-8c54-0a5454545454"; do
	check "step-${st%% *}-${st##* }" grep -qF "$st" /root/import.out
done
begin adopt
check import-prints-old-vlan-unit grep -q 'systemctl disable vlan50.service' /root/import.out
check import-key-private test "$(stat -c %a /root/import/keys/wg0.key)" = 600
check import-twenty-peer-files test "$(ls /root/import/peers.d/wg0 | wc -l)" = 20
cp -a /root/import/* /etc/nodeagent/
check validates nodeagent validate
# A peer the old setup adds after the import: the adoption keeps it.
late_peer=$(wg genkey | wg pubkey)
wg set wg-pod peer "$late_peer" allowed-ips 10.91.0.9/32
nodeagent plan > /root/adopt-plan.out 2>&1
sed 's/^/    plan: /' /root/adopt-plan.out
# Every line of the plan is an adoption (or a peer kept as it is).
# (warning: lines are the coexistence hazards of the owners' files, which
# the owners' steps below retire; they change nothing.)
check plan-only-adoptions sh -c '! grep -v -e " adopt (" -e "^~ adopt " -e " kept (" -e "^warning: " /root/adopt-plan.out | grep -q .'
check plan-has-adoptions grep -qi adopt /root/adopt-plan.out
check plan-keeps-late-peer grep -q "peer $late_peer kept (in the kernel, not in the register" /root/adopt-plan.out
# NetworkManager's form: marked in place where it can, else kept, never
# deleted; the plan says which.
check plan-says-kept grep -q "10.10.50.1/24 (noprefixroute: the kernel cannot change an IPv4 address's flags in place)" /root/adopt-plan.out

# --- the owners' steps, as printed, in order ---
begin owners
sed -n 's/^ *[0-9][0-9]*\. //p' /root/import.out | grep -E '^(nmcli |sed -i |rm /etc/)' | sed 's/   #.*//' > /root/owner-steps.sh
sed 's/^/    step: /' /root/owner-steps.sh
declare -A owner_idx
for l in $TRUNK.51 enp8s0.52 $TRUNK.53 $TRUNK.54; do owner_idx[$l]=$(ifindex "$l"); done
check owner-steps sh -e /root/owner-steps.sh
check vlans-stay-after-steps sh -c "for l in $TRUNK.51 enp8s0.52 $TRUNK.53 $TRUNK.54; do ip link show \$l > /dev/null || exit 1; done"
check nm-let-go wait_for 10 sh -c "nmcli -t -f DEVICE,STATE device | grep -qx '$TRUNK.54:unmanaged'"
check nm-address-stays sh -c "ip addr show dev $TRUNK.54 | grep -q 10.10.54.1/24"
begin adopt

# --- take-over ---
wg_idx=$(ifindex wg0)
vlan_idx=$(ifindex "$VLAN")
client_peer=$(echo "$client_key" | wg pubkey)
hs_before=$(wg show wg0 latest-handshakes | awk -v p="$client_peer" '$1 == p {print $2}')
rx_before=$(wg show wg0 transfer | awk -v p="$client_peer" '$1 == p {print $2}')
roam_peer=$(echo "$roam_key" | wg pubkey)
ip netns exec wan ping -i 0.05 -W 1 10.91.0.1 > /root/roam.ping 2>&1 &
rping=$!
rhs_before=$(wg show wg-pod latest-handshakes | awk -v p="$roam_peer" '$1 == p {print $2}')
ip -ts monitor address route rule > /root/adopt-monitor.log 2>&1 &
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
check no-route-deleted sh -c '! grep -q "^.*Deleted.*table \(150\|vlan50-egress\|100\)" /root/adopt-monitor.log'
# Never delete to adopt: no address of an imported link, no route through
# one, is ever deleted (ip monitor's Deleted lines).
check no-address-deleted sh -c "! grep Deleted /root/adopt-monitor.log | grep -E '[ :]($VLAN|$TRUNK\.5[1-4]|enp8s0\.52|wg0|wg-pod)[ @:]'"
grep Deleted /root/adopt-monitor.log | sed 's/^/    monitor: /' | head -20
begin nmform
check address-present sh -c "ip addr show dev $VLAN | grep -q 'inet 10.10.50.1/24 .*noprefixroute'"
ip route show 10.20.0.0/16 > /root/src-route-after.txt
check src-route-present diff -u /root/src-route-before.txt /root/src-route-after.txt
check no-address-deleted sh -c "! grep -E 'Deleted.*10\.10\.50\.1/24' /root/adopt-monitor.log"
check no-src-route-deleted sh -c "! grep -E 'Deleted.*10\.20\.0\.0/16' /root/adopt-monitor.log"
check nm-vlan-address-kept sh -c "ip addr show dev $TRUNK.54 | grep -q 'inet 10.10.54.1/24 .*noprefixroute'"
begin fromroute
ip -6 route show table 100 | grep ' from ' > /root/from-route-after.txt
check unchanged-after-takeover diff -u /root/from-route-before.txt /root/from-route-after.txt
check plain-route-adopted sh -c 'ip -6 route show table 100 | grep -q "^2001:db8:b::/48 via fd50::fe dev .* proto nodeagent"'
begin foreign
foreign_state > /root/foreign-after.txt
check unchanged-after-takeover diff -u /root/foreign-before.txt /root/foreign-after.txt
begin owners
for l in $TRUNK.51 enp8s0.52 $TRUNK.53 $TRUNK.54; do
	echo "    $l: ifindex ${owner_idx[$l]} -> $(ifindex "$l"), ifalias $(cat "/sys/class/net/$l/ifalias")"
	check "adopted-$l" test "$(cat "/sys/class/net/$l/ifalias")" = nodeagent -a "$(ifindex "$l")" = "${owner_idx[$l]}"
done
begin adopt
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
check late-peer-kept sh -c "wg show wg-pod peers | grep -q '$late_peer'"

# --- item 2: the client roams after the take-over and after two resyncs ---
begin roaming
rendpoint() { wg show wg-pod endpoints | awk -v p="$roam_peer" '$1 == p {print $2}'; }
echo "    wg-pod's client at $(rendpoint) after the take-over"
ip netns exec wan wg set wg8 listen-port 40001
check roams-to-40001 wait_for 10 sh -c "wg show wg-pod endpoints | grep -q '$roam_peer.*:40001$'"
check resync-1 systemctl reload nodeagent
sleep 2
check resync-2 systemctl reload nodeagent
sleep 2
echo "    after two resyncs: $(rendpoint)"
check still-at-40001 sh -c "wg show wg-pod endpoints | grep -q '$roam_peer.*:40001$'"
ip netns exec wan wg set wg8 listen-port 40002
check roams-to-40002 wait_for 10 sh -c "wg show wg-pod endpoints | grep -q '$roam_peer.*:40002$'"
check resync-3 systemctl reload nodeagent
sleep 2
echo "    after a third resync: $(rendpoint)"
check still-at-40002 sh -c "wg show wg-pod endpoints | grep -q '$roam_peer.*:40002$'"
kill -INT "$rping"
wait "$rping" 2>/dev/null
rhs_after=$(wg show wg-pod latest-handshakes | awk -v p="$roam_peer" '$1 == p {print $2}')
grep 'packets transmitted' /root/roam.ping | sed 's/^/    roaming client: /'
echo "    roaming client: handshake $rhs_before -> $rhs_after"
check no-loss test "$(lost /root/roam.ping)" = 0
check no-forced-handshake test "$rhs_after" = "$rhs_before" -o $((rhs_after - rhs_before)) -ge 110
begin adopt

# --- a fixed point: importing what nodeagent now runs gives the same ---
rm -rf /root/import2
check reimport sh -c 'nodeagent import --out /root/import2 > /dev/null'
# The config's content, not its comments: those describe the node's
# surroundings, and the owners' files are retired by now.
check fixed-point bash -c 'diff -u <(grep -v "^ *#" /root/import/nodeagent.yaml) <(grep -v "^ *#" /root/import2/nodeagent.yaml)'
check old-units-off sh -c '! systemctl is-enabled --quiet wg-quick@wg0 && ! systemctl is-enabled --quiet vlan50'

# --- item 1: a later config without the imported rules leaves the others ---
begin foreign
cp /etc/nodeagent/nodeagent.yaml /root/imported.yaml
awk '/^  rules:/{skip=1; next} skip && /^    /{next} {skip=0; print}' /root/imported.yaml | write_config
check drop-validates nodeagent validate
check drop-reload systemctl reload nodeagent
check imported-rules-gone wait_for 10 sh -c '! ip rule show | grep -q "^1000:"'
foreign_state > /root/foreign-dropped.txt
check unchanged-after-drop diff -u /root/foreign-before.txt /root/foreign-dropped.txt
write_config < /root/imported.yaml
check restore-reload systemctl reload nodeagent
check imported-rules-back wait_for 10 sh -c 'ip rule show | grep -q "^1000:.*proto nodeagent"'
begin adopt

# --- the reboot: the node must come up from nodeagent alone -------------
# This boot runs from an initramfs, which a reboot would bring back
# fresh, so the root as it is now is copied to the VM's disk, which
# testdata/rdinit.sh boots from next time (the namespaces, which no
# disk keeps, are made again there, as the uplink's manager would).
wg show wg0 public-key > /root/adopt-wg0.pub
# The uplink's default route, which its manager makes again at boot.
ip -4 route show default table main > /root/adopt-uplink-routes
# The netplan step's uplink YAML and the README's file (steps/46-netplan.sh),
# put back for the boot after this one (reboot/55-netplan.sh).
if [[ -d /root/netplan-carry ]]; then
	cp -p /root/netplan-carry/50-uplink.yaml /etc/netplan/
	cp -p /root/netplan-carry/00-nodeagent.network /etc/systemd/network/
fi
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
