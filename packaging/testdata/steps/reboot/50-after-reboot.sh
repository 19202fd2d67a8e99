# --- reboot: the boot after the adopt step --------------------------------
# Sourced by deb-acceptance.sh (with 05-topology.sh) when this boot is the
# one after the adopt step (the root it saved on /dev/vda). What made the
# node before (vlan50.service, wg-quick@wg0) is disabled; nodeagent alone
# must bring back the VLAN, wg0 with its key and 20 peers, the rule and
# table 150, and the remote client must get its session back.
begin reboot
echo "    root $(findmnt -n -o SOURCE /), kernel $(uname -r)"
check root-from-disk test "$(findmnt -n -o SOURCE /)" = /dev/vda
# The links no disk keeps: the namespaces, the trunk and the uplink, made
# again as the uplink's manager would at boot.
topo_up
# netplan's VLAN's trunk (35-neighbours.sh), made again as its manager would.
ip link add enp8s0 type veth peer name lan1 netns lan
ip link set enp8s0 up
ip -n lan link set lan1 up
ip addr replace 192.0.2.2/24 dev up0
ip link set up0 up
while read -r route; do
	ip route replace $route
done < /root/adopt-uplink-routes
ip -n wan route replace 10.10.50.0/24 via 192.0.2.2
ip -n wan link add wg9 type wireguard
ip netns exec wan wg set wg9 private-key /root/client.key peer "$(cat /root/adopt-wg0.pub)" endpoint 192.0.2.2:51820 allowed-ips 10.90.0.0/24 persistent-keepalive 5
ip -n wan addr add 10.90.0.2/24 dev wg9
ip -n wan link set wg9 up

check nodeagent-active wait_for 90 is active
check ready wait_for 60 nodeagentctl status
check old-wg-not-started sh -c '! systemctl is-active --quiet wg-quick@wg0 && ! systemctl is-enabled --quiet wg-quick@wg0'
check old-vlan-not-started sh -c '! systemctl is-active --quiet vlan50 && ! systemctl is-enabled --quiet vlan50'
check vlan-back ip link show "$VLAN"
check wg0-same-key test "$(wg show wg0 public-key)" = "$(cat /root/adopt-wg0.pub)"
check wg0-port test "$(wg show wg0 listen-port)" = 51820
check twenty-peers test "$(wg show wg0 peers | wc -l)" = 20
check client-reconnects wait_for 30 ip netns exec wan ping -c1 -W1 10.90.0.1
wg show wg0 latest-handshakes | awk '$2 != 0 {print "    handshake: " $0}'
check vlan-host-egress wait_for 30 ip netns exec lan ping -c1 -W1 192.0.2.1
ip route get 192.0.2.1 from 10.10.50.10 iif "$VLAN" | sed 's/^/    route get: /'
check by-its-table sh -c "ip route get 192.0.2.1 from 10.10.50.10 iif $VLAN | grep -q 'table vlan50-egress'"
check rule-ours sh -c 'ip rule show | grep -q "^1000:.*from 10.10.50.0/24.*proto nodeagent"'
check route-ours sh -c 'ip route show table 150 | grep -q "^default via 192.0.2.1 dev up0 proto nodeagent"'
check fallback-ours sh -c 'ip route show table 150 | grep -q "^unreachable default proto nodeagent metric 4000"'
check empty-plan test "$(nodeagent plan)" = "no changes"
rm -rf /root/import3
check reimport sh -c 'nodeagent import --out /root/import3 > /dev/null'
# The config's content, not its comments (the others' objects and the
# owners' files, gone now, were described there).
check fixed-point-after-reboot bash -c 'diff -u <(grep -v "^ *#" /root/import/nodeagent.yaml) <(grep -v "^ *#" /root/import3/nodeagent.yaml)'

# --- issue 40: after the owners' steps and the reboot, nodeagent alone -----
begin owners
echo "    enabled at this boot: networkd $(systemctl is-enabled systemd-networkd), NetworkManager $(systemctl is-enabled NetworkManager), ifupdown $(systemctl is-enabled networking)"
check owners-ran sh -c 'systemctl is-active --quiet systemd-networkd && systemctl is-active --quiet NetworkManager && systemctl is-enabled --quiet networking'
for l in $TRUNK.51 enp8s0.52 $TRUNK.53 $TRUNK.54; do
	check "made-by-nodeagent-$l" wait_for 60 sh -c "test \"\$(cat /sys/class/net/$l/ifalias 2>/dev/null)\" = nodeagent"
done
check addresses wait_for 30 sh -c "ip addr show dev $TRUNK.51 | grep -q 10.10.51.1/24 && ip addr show dev enp8s0.52 | grep -q 10.10.52.1/24 &&
	ip addr show dev $TRUNK.53 | grep -q 10.10.53.1/24 && ip addr show dev $TRUNK.54 | grep -q 10.10.54.1/24"
networkctl list --no-pager | sed 's/^/    networkctl: /'
nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device | sed 's/^/    nmcli: /'
ifquery --state 2>&1 | sed 's/^/    ifquery --state: /'
# The oracles: networkd manages neither VLAN (no .netdev, no .network, no
# VLAN= line made them or configures them), NetworkManager holds no
# profile for VLAN 54 and leaves it unmanaged, ifupdown brought no VLAN up.
for l in $TRUNK.51 enp8s0.52; do
	check "networkd-unmanaged-$l" sh -c "networkctl list --no-pager | grep -E ' $l ' | grep -q unmanaged"
done
check no-netplan-netdev sh -c '! grep -rls "Name=enp8s0.52" /run/systemd/network /etc/systemd/network 2>/dev/null | grep -q netdev'
check nm-no-profile sh -c '! nmcli -t -f NAME connection show | grep -qx "VLAN 54"'
check nm-unmanaged wait_for 30 sh -c "nmcli -t -f DEVICE,STATE device | grep -qx '$TRUNK.54:unmanaged'"
check ifupdown-none sh -c "! ifquery --state 2>/dev/null | grep -q '$TRUNK.53'"
check empty-plan-with-owners test "$(nodeagent plan)" = "no changes"

# --- the roaming client comes back through nodeagent's wg-pod ---------------
begin roaming
ip -n wan link add wg8 type wireguard
ip netns exec wan wg set wg8 private-key /root/roam.key listen-port 40000 peer "$(wg show wg-pod public-key)" endpoint 192.0.2.2:51821 allowed-ips 10.91.0.0/24 persistent-keepalive 5
ip -n wan addr add 10.91.0.2/24 dev wg8
ip -n wan link set wg8 up
check reconnects-after-reboot wait_for 30 ip netns exec wan ping -c1 -W1 10.91.0.1
