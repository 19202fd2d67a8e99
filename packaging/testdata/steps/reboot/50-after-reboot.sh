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
check fixed-point-after-reboot diff -u /root/import/nodeagent.yaml /root/import3/nodeagent.yaml
