# --- release: the way back to the old setup (issue 45) ---------------------
# Sourced after 50-after-reboot.sh, in the boot from the root the adopt
# step saved: nodeagent runs the imported config alone, and the old setup's
# units (vlan50.service, which makes the VLAN, its addresses, rule 1000
# and table 150's routes with ip; wg-quick@wg0) are disabled. release is
# refused while the daemon runs, naming the fix; after systemctl stop it
# deletes what those units make themselves (they fail on an object that
# exists), hands back what the other owners had (the VLANs .51-.54,
# wg-pod) unmarked and as they are, and prints the steps that start the
# old setup again. Run as printed, they start both units; the VLAN host
# reaches the WAN through the old setup's table 150 and the remote client
# reaches 10.90.0.1 through wg-quick's wg0, with no object of nodeagent's
# left.
begin release
check refused-while-running sh -c 'nodeagent release > /root/release-refused.out 2>&1; rc=$?; cat /root/release-refused.out; test $rc = 1 && grep -q "stop it first: systemctl stop nodeagent" /root/release-refused.out'
check dry-run sh -c 'nodeagent release --dry-run > /root/release-dry.out 2>&1; rc=$?; cat /root/release-dry.out; test $rc = 0 && grep -q "^dry run: nothing changed" /root/release-dry.out'
check dry-run-changed-nothing sh -c "ip link show $VLAN && ip link show wg0 && test \"\$(cat /sys/class/net/$VLAN/ifalias)\" = nodeagent"
declare -A kept_idx
for l in $TRUNK.51 enp8s0.52 $TRUNK.53 $TRUNK.54 wg-pod; do kept_idx[$l]=$(ifindex "$l"); done
check stop systemctl stop nodeagent
check release sh -c 'nodeagent release > /root/release.out 2>&1; rc=$?; cat /root/release.out; exit $rc'
check vlan-deleted-for-its-unit sh -c "! ip link show $VLAN && grep -q 'link $VLAN (vlan 50 on $TRUNK): vlan50.service makes it again' /root/release.out"
check wg0-deleted-for-wg-quick sh -c "! ip link show wg0 && grep -q 'wireguard wg0 (kernel): wg-quick@wg0 makes it again from /etc/wireguard/wg0.conf' /root/release.out"
for l in $TRUNK.51 enp8s0.52 $TRUNK.53 $TRUNK.54 wg-pod; do
	check "handed-back-$l" sh -c "test \"\$(cat /sys/class/net/$l/ifindex)\" = '${kept_idx[$l]}' && test -z \"\$(cat /sys/class/net/$l/ifalias)\""
done
check nothing-marked sh -c '! { ip -d rule show; ip -6 -d rule show; ip route show table all; ip -6 route show table all; } | grep -E "proto (nodeagent|147)"'
check no-nft-table sh -c '! nft list tables | grep -q nodeagent'
check no-link-marked sh -c '! grep -lx nodeagent /sys/class/net/*/ifalias'
# The steps release printed, each run as printed.
sed -n 's/^  [0-9][0-9]*\. //p' /root/release.out | sed 's/   #.*//' > /root/release-steps.sh
sed 's/^/    step: /' /root/release-steps.sh
check steps-start-the-units sh -c 'grep -qx "systemctl stop vlan50.service; systemctl enable --now vlan50.service" /root/release-steps.sh &&
	grep -qx "systemctl stop wg-quick@wg0; systemctl enable --now wg-quick@wg0" /root/release-steps.sh && grep -qx "systemctl disable nodeagent" /root/release-steps.sh'
n=0
while read -r line; do
	n=$((n + 1))
	check "step-$n" sh -c "$line"
done < /root/release-steps.sh
check vlan50-started systemctl is-active vlan50.service || journalctl -u vlan50 --no-pager | tail -20
check wg-quick-started systemctl is-active wg-quick@wg0 || journalctl -u wg-quick@wg0 --no-pager | tail -20
check nodeagent-disabled sh -c '! systemctl is-enabled --quiet nodeagent && ! systemctl is-active --quiet nodeagent'
check vlan-back-unmarked sh -c "ip link show $VLAN && test -z \"\$(cat /sys/class/net/$VLAN/ifalias)\""
check twenty-peers test "$(wg show wg0 peers | wc -l)" = 20
check vlan-host-pings wait_for 30 ip netns exec lan ping -c1 -W1 192.0.2.1
ip route get 192.0.2.1 from 10.10.50.10 iif "$VLAN" | sed 's/^/    route get: /'
check by-the-old-table sh -c "ip route get 192.0.2.1 from 10.10.50.10 iif $VLAN | grep -q 'table vlan50-egress' && ip rule show | grep -q '^1000:' && ! ip rule show | grep '^1000:' | grep -q proto"
check client-reconnects wait_for 30 ip netns exec wan ping -c1 -W1 10.90.0.1
