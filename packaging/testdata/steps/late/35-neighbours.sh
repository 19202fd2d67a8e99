# --- what a real node has beside the old setup (issue 40) ------------------
# Sourced by deb-acceptance.sh after the purge and before the adopt step
# (40-adopt.sh), which imports all of it at once:
#   - Cilium's and Tailscale's policy routing, exactly as their sources
#     install it (netcfg/importer/scope.go names the files): the local
#     rule moved from 0 to 100, the L7 proxy's rules 9 and 10 and tables
#     2004 and 2005, protocol kernel; Tailscale's rules 5210-5270 and
#     table 52 through tailscale0, protocol 0;
#   - four VLANs made by the owners an operator retires: systemd-networkd
#     (a .netdev, a .network, the trunk's VLAN= line), netplan (rendered
#     by networkd, on a second trunk), ifupdown (a stanza) and
#     NetworkManager (a keyfile profile), each enabled so that it would
#     make its VLAN again at the next boot;
#   - wg-pod, a WireGuard device made without a wg-quick file (as the
#     seeds' vpn-ingress pod makes it), with a remote client that roams.

# foreign_state prints Cilium's and Tailscale's objects as ip(8) shows them
# (rule 1000, the old setup's, left out: the take-over makes it
# nodeagent's).
foreign_state() {
	{
		ip -d rule show; ip -6 -d rule show
		for t in 2004 2005 52; do
			ip -d route show table "$t"
			ip -6 -d route show table "$t"
		done
	} 2>/dev/null | grep -v '^1000:'
}

begin foreign
ip link add cilium_host type veth peer name cilium_net
ip addr add 10.0.0.90/32 dev cilium_host
ip link set cilium_host up
ip link set cilium_net up
# Cilium: NodeEnsureLocalRoutingRule (pkg/datapath/linux/node.go) adds the
# local rule at 100, protocol kernel, then deletes the kernel's at 0; the
# proxy (pkg/proxy/routes.go) its rules and tables, protocol kernel.
check cilium-local-rule sh -c 'ip rule add pref 100 lookup local protocol kernel && ip rule del pref 0 lookup local &&
	ip -6 rule add pref 100 lookup local protocol kernel && ip -6 rule del pref 0 lookup local'
check cilium-proxy-rules sh -c 'ip rule add pref 9 fwmark 0x200/0xf00 lookup 2004 protocol kernel &&
	ip -6 rule add pref 9 fwmark 0x200/0xf00 lookup 2004 protocol kernel &&
	ip rule add pref 10 fwmark 0xa00/0xf00 lookup 2005 protocol kernel'
check cilium-proxy-tables sh -c 'ip route add local 0.0.0.0/0 dev lo table 2004 proto kernel scope host &&
	ip -6 route add local ::/0 dev lo table 2004 proto kernel &&
	ip route add 10.0.0.90/32 dev cilium_host table 2005 proto kernel scope link &&
	ip route add default via 10.0.0.90 dev cilium_host table 2005 proto kernel'
# Tailscale: router_linux.go adds its rules and routes over netlink with
# no protocol (0); ipPolicyPrefBase 5200.
ip tuntap add tailscale0 mode tun
ip link set tailscale0 up
ip addr add 100.101.102.103/32 dev tailscale0
check tailscale-rules sh -c 'for f in -4 -6; do
	ip $f rule add pref 5210 fwmark 0x80000/0xff0000 lookup main protocol 0 &&
	ip $f rule add pref 5230 fwmark 0x80000/0xff0000 lookup default protocol 0 &&
	ip $f rule add pref 5250 fwmark 0x80000/0xff0000 unreachable protocol 0 &&
	ip $f rule add pref 5270 lookup 52 protocol 0 || exit 1; done'
check tailscale-table sh -c 'ip route add 100.100.100.100/32 dev tailscale0 table 52 proto 0 &&
	ip route add 100.64.0.0/10 dev tailscale0 table 52 proto 0 &&
	ip route add throw 192.168.1.0/24 table 52 proto 0 &&
	ip -6 route add fd7a:115c:a1e0::/48 dev tailscale0 table 52 proto 0'
foreign_state > /root/foreign-before.txt
sed 's/^/    /' /root/foreign-before.txt

# --- the owners: a VLAN made by each ----------------------------------------
begin owners
# networkd must not delete the rules and routes it did not make (its
# defaults do: ManageForeignRoutingPolicyRules, ManageForeignRoutes), or it
# would take Tailscale's rules and the old setup's with it.
mkdir -p /etc/systemd/networkd.conf.d /etc/systemd/network /etc/netplan
printf '[Network]\nManageForeignRoutingPolicyRules=no\nManageForeignRoutes=no\n' > /etc/systemd/networkd.conf.d/keep-foreign.conf
# (a) systemd-networkd: a .netdev, a .network, and the trunk's VLAN= line.
cat > /etc/systemd/network/10-trunk.network <<NET
[Match]
Name=$TRUNK

[Network]
LinkLocalAddressing=no
VLAN=$TRUNK.51
NET
printf '[NetDev]\nName=%s.51\nKind=vlan\n\n[VLAN]\nId=51\n' "$TRUNK" > /etc/systemd/network/51-vlan51.netdev
printf '[Match]\nName=%s.51\n\n[Network]\nAddress=10.10.51.1/24\nLinkLocalAddressing=no\n' "$TRUNK" > /etc/systemd/network/51-vlan51.network
# (b) netplan, rendered by networkd, on a trunk of its own (two .network
# files for one trunk would see one of them ignored).
ip link add enp8s0 type veth peer name lan1 netns lan
ip link set enp8s0 up
ip -n lan link set lan1 up
cat > /etc/netplan/60-vlan52.yaml <<YAML
network:
  version: 2
  renderer: networkd
  ethernets:
    enp8s0: {}
  vlans:
    enp8s0.52:
      id: 52
      link: enp8s0
      addresses: [10.10.52.1/24]
YAML
chmod 600 /etc/netplan/60-vlan52.yaml
check netplan-generate netplan generate
check networkd-enabled systemctl enable --now systemd-networkd
check networkd-made-51 wait_for 30 ip link show "$TRUNK.51"
check netplan-made-52 wait_for 30 ip link show enp8s0.52
check networkd-addresses wait_for 30 sh -c "ip addr show dev $TRUNK.51 | grep -q 10.10.51.1/24 && ip addr show dev enp8s0.52 | grep -q 10.10.52.1/24"
networkctl list --no-pager | sed 's/^/    networkctl: /'
# (c) ifupdown: a stanza, brought up as networking.service does at boot.
mkdir -p /etc/network/interfaces.d
grep -q '^source /etc/network/interfaces.d/\*' /etc/network/interfaces 2>/dev/null || echo 'source /etc/network/interfaces.d/*' >> /etc/network/interfaces
cat > /etc/network/interfaces.d/vlan53 <<IF
auto $TRUNK.53
iface $TRUNK.53 inet static
	address 10.10.53.1/24
	vlan-raw-device $TRUNK
IF
check ifupdown-enabled systemctl enable networking
check ifup-53 ifup "$TRUNK.53"
check ifupdown-made-53 ip addr show dev "$TRUNK.53"
# (d) NetworkManager: a keyfile profile (NetworkManager adds its
# addresses with noprefixroute: its form, which the take-over keeps).
mkdir -p /etc/NetworkManager/conf.d
printf '[main]\nno-auto-default=*\n' > /etc/NetworkManager/conf.d/90-test.conf
(
	umask 077
	cat > /etc/NetworkManager/system-connections/vlan54.nmconnection <<NM
[connection]
id=VLAN 54
uuid=5f6c1a2e-7d54-4b54-8c54-0a5454545454
type=vlan
interface-name=$TRUNK.54
autoconnect=true

[vlan]
id=54
parent=$TRUNK

[ipv4]
method=manual
address1=10.10.54.1/24

[ipv6]
method=disabled
NM
)
check nm-enabled sh -c 'systemctl unmask NetworkManager && systemctl enable --now NetworkManager'
check nm-running wait_for 30 sh -c 'nmcli -t general status'
nmcli connection up "VLAN 54" 2>&1 | sed 's/^/    nmcli: /'
check nm-made-54 wait_for 30 sh -c "ip addr show dev $TRUNK.54 | grep -q 10.10.54.1/24"
nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device | sed 's/^/    nmcli: /'
ip -br addr show | grep -E "\.5[1-4]" | sed 's/^/    /'

# --- wg-pod: WireGuard without a wg-quick file, and a client that roams -----
begin roaming
ip addr replace 192.0.2.2/24 dev up0
ip link set up0 up
pod_key=$(wg genkey)
roam_key=$(wg genkey)
echo "$pod_key" > /root/pod.key
echo "$roam_key" > /root/roam.key
ip link add wg-pod type wireguard
check pod-device sh -c "wg set wg-pod private-key /root/pod.key listen-port 51821 peer $(echo "$roam_key" | wg pubkey) allowed-ips 10.91.0.2/32 &&
	wg set wg-pod peer $(wg genkey | wg pubkey) allowed-ips 10.91.0.3/32 &&
	ip addr add 10.91.0.1/24 dev wg-pod && ip link set wg-pod up"
ip -n wan link add wg8 type wireguard
ip netns exec wan wg set wg8 private-key /root/roam.key listen-port 40000 peer "$(wg show wg-pod public-key)" endpoint 192.0.2.2:51821 allowed-ips 10.91.0.0/24 persistent-keepalive 5
ip -n wan addr add 10.91.0.2/24 dev wg8
ip -n wan link set wg8 up
check roaming-session wait_for 20 ip netns exec wan ping -c1 -W1 10.91.0.1
wg show wg-pod endpoints | sed 's/^/    wg-pod endpoint: /'
