# --- netplan after the reboot (issue 45, acceptance 3) -----------------------
# The netplan step (steps/46-netplan.sh) kept its uplink YAML (match by
# MAC, set-name enp1s0) and the README's 00-nodeagent.network; the adopt
# step put both back before it saved the root. At this boot netplan's
# generator wrote its files into /run afresh and networkd started with
# them. The uplink (a veth with the same MAC: the VM has no NIC) is made
# again, and nodeagent's links of the README (enp1s0.50, vlan50-shim,
# wg-pia, wg0) are added to the running config: networkctl list must say
# unmanaged for each. The config and the node are left as they were for
# the steps after this one.
begin netplan-reboot
check files-kept test -s /etc/netplan/50-uplink.yaml -a -s /etc/systemd/network/00-nodeagent.network
check file-is-readmes np_file_is_readmes
# Written at this boot by netplan's generator, not carried: /run is new.
check generated-at-boot sh -c 'test -s /run/systemd/network/10-netplan-uplink.network && test /run/systemd/network/10-netplan-uplink.network -nt /root/netplan-carry/mac'
check networkd-active systemctl is-active systemd-networkd
cp /etc/nodeagent/nodeagent.yaml /root/netplan-saved-reboot.yaml
ip netns add np
check trunk ip link add enp1s0 address "$(cat /root/netplan-carry/mac)" type veth peer name np0 netns np
ip link set enp1s0 up
(umask 077; wg genkey > /etc/nodeagent/keys/wg-pia.key)
if (set -o pipefail; np_config /root/netplan-saved-reboot.yaml > /root/netplan-config.yaml); then pass config-made; else fail config-made "the running config has no vlans: or wireguard: list"; fi
write_config < /root/netplan-config.yaml
check validates nodeagent validate
check reload systemctl reload nodeagent
check links-made wait_for 30 sh -c "for l in $np_links; do test \"\$(cat /sys/class/net/\$l/ifalias 2>/dev/null)\" = nodeagent || exit 1; done"
check unmanaged-after-reboot np_all_unmanaged
networkctl list --no-pager | sed 's/^/    networkctl: /'
write_config < /root/netplan-saved-reboot.yaml
check restore-reload systemctl reload nodeagent
check links-removed wait_for 30 sh -c "! ip link show enp1s0.50 && ! ip link show vlan50-shim && ! ip link show wg-pia"
ip link del enp1s0
ip netns del np
rm -f /etc/nodeagent/keys/wg-pia.key
check ready-after wait_for 30 nodeagentctl status
check empty-plan-after test "$(nodeagent plan)" = "no changes"
