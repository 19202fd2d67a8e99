# --- garp: what the shim says on the wire, under real udevd ----------------
# The macvlan shim is made with its MAC in the create message, so udev's
# MACAddressPolicy=persistent leaves it alone, and duplicate-address
# detection and the gratuitous ARPs go out with the address the link has.
# 10 creation cycles, captured on the other end of the trunk: every ARP the
# shim sends carries the shim's one MAC as Ethernet source and as ARP
# sender; the MAC is the same 2 s after each creation and after a restart.
begin garp
GW_DAD='{probes: 1, interval: 100ms, wait: 200ms, announcements: 2}'
ip netns exec lan tcpdump -i lan0 -n -U -w /root/garp.pcap arp > /root/garp.tcpdump 2>&1 &
cap=$!
sleep 1
gateway_config "macvlans:
  - {name: shim0, parent: $TRUNK, addresses: [10.10.60.3/24]}" | write_config
check reload systemctl reload nodeagent
check shim-created wait_for 20 sh -c 'ip -4 addr show shim0 | grep -q 10.10.60.3/24'
mac=$(cat /sys/class/net/shim0/address)
echo "    shim0 has $mac"
sleep 2
check kept-after-2s test "$(cat /sys/class/net/shim0/address)" = "$mac"
cycles=0
for i in 1 2 3 4 5 6 7 8 9 10; do
	ip link del shim0
	wait_for 20 sh -c 'ip -4 addr show shim0 | grep -q 10.10.60.3/24' || { fail "recreated-$i"; continue; }
	sleep 2
	[[ $(cat /sys/class/net/shim0/address) == "$mac" ]] || fail "same-mac-$i" "$(cat /sys/class/net/shim0/address)"
	cycles=$((cycles + 1))
done
check ten-cycles test "$cycles" = 10
check restart systemctl restart nodeagent
check ready-after-restart wait_for 30 nodeagentctl status
sleep 2
check same-after-restart test "$(cat /sys/class/net/shim0/address)" = "$mac"
sleep 1
kill "$cap"
wait "$cap" 2>/dev/null
# arps: one line per ARP frame sent from 10.10.60.3 or probing for it:
# "ETHER-SRC SENDER-MAC SENDER-IP TARGET-IP", from the frame's bytes.
arps() {
	tcpdump -r /root/garp.pcap -n -xx 2>/dev/null | awk '
	function flush() {
		if (hex == "") return
		src = substr(hex, 13, 12); sha = substr(hex, 45, 12); spa = substr(hex, 57, 8); tpa = substr(hex, 77, 8)
		if (tpa == "0a0a3c03" || spa == "0a0a3c03") print mac(src), mac(sha), spa, tpa
		hex = ""
	}
	function mac(h,  i, o) { for (i = 1; i <= 12; i += 2) o = o (i > 1 ? ":" : "") substr(h, i, 2); return o }
	/^[0-9]/ { flush(); next }
	/0x[0-9a-f]+:/ { line = $0; sub(/^[ \t]*0x[0-9a-f]+:[ \t]*/, "", line); gsub(/ /, "", line); hex = hex line }
	END { flush() }'
}
arps > /root/garp.arps
probes=$(awk '$3 == "00000000"' /root/garp.arps | wc -l)
announcements=$(awk '$3 == "0a0a3c03"' /root/garp.arps | wc -l)
others=$(awk -v m="$mac" '$1 != m || $2 != m' /root/garp.arps | wc -l)
echo "    captured: $probes probes, $announcements gratuitous ARPs, $others with another MAC"
awk -v m="$mac" '$1 != m || $2 != m' /root/garp.arps | head -5 | sed 's/^/    other: /'
# 11 creations (the first and 10 re-creates), each probed once and
# announced twice.
check probes-per-creation test "$probes" -ge 11
check announcements-per-creation test "$announcements" -ge 22
check every-arp-has-the-links-mac test "$others" = 0
