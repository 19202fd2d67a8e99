# --- uninstall: the README's way out, in its order (issue 45, acceptance 2) --
# Sourced first after the purge step, so the package is gone: it is
# installed again and started with the gateway config, k3s's drop-in is
# installed by the README's own block (walkthrough:k3s-dropin) beside a
# stand-in k3s.service (the unit the drop-in's directory names; it sleeps),
# and a pod sits on the VLAN: a macvlan on it moved into a network
# namespace, as a CNI plugin makes it. Then the README's uninstall blocks
# run as written: uninstall:stop, then what uninstall-kubectl:pods asks
# (there is no cluster: the pod's namespace is deleted, which deletes its
# link), then uninstall:teardown. Nothing of nodeagent's may be left
# (links, addresses' routes and rules, its nft table, the package), the
# pod's link must outlive every step before the pods', and k3s.service
# must still start once the package is gone, and also with the drop-in
# left behind by mistake. The node is left as the purge step left it.
begin uninstall
check install dpkg -i "$deb"
gateway_config | write_config
check validates nodeagent validate
check start systemctl start nodeagent
check ready wait_for 60 nodeagentctl status
cat > /etc/systemd/system/k3s.service <<'UNIT'
[Unit]
Description=k3s (a stand-in for the uninstall step: it sleeps)
[Service]
ExecStart=/bin/sleep infinity
UNIT
check k3s-dropin-block run_block walkthrough:k3s-dropin
check dropin-in-effect sh -c 'systemctl show -p DropInPaths --value k3s | grep -q /etc/systemd/system/k3s.service.d/10-nodeagent.conf'
cp /etc/systemd/system/k3s.service.d/10-nodeagent.conf /root/k3s-dropin.conf
check k3s-starts systemctl start k3s
check k3s-active systemctl is-active k3s
# The pod: net1 in its own namespace, on the VLAN.
ip netns add pod1
ip link add link "$VLAN" name pod1v type macvlan mode bridge
ip link set pod1v netns pod1
ip -n pod1 link set pod1v name net1
ip -n pod1 link set net1 up
ip -n pod1 addr add 10.10.50.20/24 dev net1
pod_idx=$(ip netns exec pod1 cat /sys/class/net/net1/ifindex)
check pod-link ip -n pod1 -d link show net1
check stop-block run_block uninstall:stop
check stopped sh -c '! systemctl is-active --quiet nodeagent && ! systemctl is-enabled --quiet nodeagent'
check pod-link-survives-stop test "$(ip netns exec pod1 cat /sys/class/net/net1/ifindex 2>/dev/null)" = "$pod_idx"
check vlan-survives-stop ip link show "$VLAN"
check k3s-still-active systemctl is-active k3s
# Out of order: teardown with the pod still there refuses and deletes
# nothing (the README says so).
check teardown-refused-with-pod sh -c 'nodeagent teardown; test $? -ne 0'
check pod-link-survives-refusal test "$(ip netns exec pod1 cat /sys/class/net/net1/ifindex 2>/dev/null)" = "$pod_idx"
# uninstall-kubectl:pods, without a cluster: the pod goes, and its link
# with its namespace.
readme_block uninstall-kubectl:pods | sed 's/^/    (no cluster) $ /'
ip netns del pod1
check pod-gone sh -c '! ip netns list | grep -qw pod1'
check teardown-block run_block uninstall:teardown
check package-purged sh -c "! dpkg-query -W -f='\${Status}' nodeagent 2>/dev/null | grep -q 'ok installed'"
check no-config test ! -e /etc/nodeagent/nodeagent.yaml
check no-marked-link sh -c '! grep -lx nodeagent /sys/class/net/*/ifalias'
check vlan-gone sh -c "! ip link show $VLAN"
check wg0-gone sh -c '! ip link show wg0'
check nft-gone sh -c '! nft list table inet nodeagent'
check no-rule sh -c '! ip -d rule show | grep -qE "proto (nodeagent|147)" && ! ip -6 -d rule show | grep -qE "proto (nodeagent|147)"'
check no-route sh -c 'test -z "$(ip route show table all proto 147)" && test -z "$(ip -6 route show table all proto 147)"'
check rt-names-gone test ! -e /etc/iproute2/rt_tables.d/nodeagent.conf
check foreign-trunk-stays ip link show "$TRUNK"
check dropin-gone test ! -e /etc/systemd/system/k3s.service.d/10-nodeagent.conf
check k3s-restarts systemctl restart k3s
check k3s-active-after systemctl is-active k3s
# The drop-in left behind by mistake: k3s still starts (the drop-in's
# ExecStartPre passes when nodeagentctl is gone).
mkdir -p /etc/systemd/system/k3s.service.d
cp /root/k3s-dropin.conf /etc/systemd/system/k3s.service.d/10-nodeagent.conf
systemctl daemon-reload
check k3s-restarts-with-dropin-left systemctl restart k3s
check k3s-active-with-dropin-left systemctl is-active k3s
systemctl stop k3s
rm -rf /etc/systemd/system/k3s.service /etc/systemd/system/k3s.service.d
systemctl daemon-reload
