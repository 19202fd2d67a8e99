# --- netplan: the README's means keeps netplan's networkd off nodeagent's links --
# Issue 45, acceptance 3. The links are the README's walkthrough's own
# (enp1s0.50, vlan50-shim, wg-pia, wg0), so its file is used unchanged: a
# trunk enp1s0 (a veth with a fixed MAC; the VM has no NIC), nodeagent's
# VLAN 50 on it with the shim and two WireGuard devices, added to the
# running gateway config. netplan's YAML matches the uplink by MAC with
# set-name, as an Ubuntu install writes it. First without the README's
# file (what networkd says is printed), then with a second entry matching
# enp1s0* (a name pattern) whose file does catch the VLAN (the control:
# the check can fail), then the README's block (netplan:unmanaged) run as
# written, and `netplan apply`: networkctl list must say unmanaged for
# each of the four. The file the block wrote is the README's
# file:/etc/systemd/network/00-nodeagent.network block. The uplink's YAML
# and that file are kept in /root/netplan-carry for the boot after the
# adopt step (reboot/55-netplan.sh checks them there); here the step
# leaves the node as it found it.
begin netplan
NP_MAC=52:54:00:4e:50:01
np_networkd_was=$(systemctl is-active systemd-networkd)
np_dropin_was=no
[[ -e /etc/systemd/networkd.conf.d/nodeagent.conf ]] && np_dropin_was=yes
# networkd's drop-in (the README's block installs it again) before
# netplan apply starts networkd: the rules and routes stay nodeagent's.
install -D -m 0644 /usr/share/doc/nodeagent/examples/networkd.conf.d/nodeagent.conf /etc/systemd/networkd.conf.d/nodeagent.conf
cp /etc/nodeagent/nodeagent.yaml /root/netplan-saved.yaml
ip netns add np
check trunk ip link add enp1s0 address "$NP_MAC" type veth peer name np0 netns np
ip link set enp1s0 up
(umask 077; wg genkey > /etc/nodeagent/keys/wg-pia.key)
if (set -o pipefail; np_config /root/netplan-saved.yaml > /root/netplan-config.yaml); then pass config-made; else fail config-made "the running config has no vlans: or wireguard: list"; fi
write_config < /root/netplan-config.yaml
check validates nodeagent validate
check reload systemctl reload nodeagent
check links-made wait_for 30 sh -c "for l in $np_links; do test \"\$(cat /sys/class/net/\$l/ifalias 2>/dev/null)\" = nodeagent || exit 1; done"
mkdir -p /etc/netplan
rm -f /etc/netplan/*.yaml
cat > /etc/netplan/50-uplink.yaml <<YAML
network:
  version: 2
  renderer: networkd
  ethernets:
    uplink:
      match: {macaddress: "$NP_MAC"}
      set-name: enp1s0
      dhcp4: false
      addresses: [192.168.2.10/24]
YAML
chmod 600 /etc/netplan/50-uplink.yaml
check apply-without-fix netplan apply
for f in /run/systemd/network/10-netplan-*; do sed "s|^|    $(basename "$f"): |" "$f"; done
echo "    without the README's file, networkctl list: $(np_verdicts)"
# The control: an entry matching the NIC's name pattern (netplan writes
# Name=enp1s0*) catches the VLAN, so the file below has something to keep
# it from. (en* would catch the gateway config's VLAN too, which the
# README's file does not name.)
cat > /etc/netplan/60-others.yaml <<'YAML'
network:
  version: 2
  renderer: networkd
  ethernets:
    others:
      match: {name: "enp1s0*"}
      dhcp4: false
YAML
chmod 600 /etc/netplan/60-others.yaml
check apply-with-others netplan apply
check control-vlan-caught wait_for 20 sh -c "networkctl list --no-legend --no-pager | awk '\$2 == \"enp1s0.50\"' | grep -v unmanaged | grep ."
# The README's means, as written (it restarts networkd and lists).
check readme-block run_block netplan:unmanaged
check file-is-readmes np_file_is_readmes
np_links_state() { local l; for l in $np_links; do printf '%s:%s:%s ' "$l" "$(ifindex "$l")" "$(cat "/sys/class/net/$l/flags")"; done; }
np_before=$(np_links_state)
check apply netplan apply
check unmanaged-after-apply np_all_unmanaged
# netplan apply renames by MAC what set-name names, and the VLAN has the
# uplink's MAC: the links are the same ones, still up, after it.
check links-kept-through-apply test "$(np_links_state)" = "$np_before"
echo "    $(np_links_state)"
networkctl list --no-pager | sed 's/^/    networkctl: /'
# nodeagent's own view: converged after all that (its Converged
# condition; the fight step's config, which this step runs beside, does
# not plan "no changes" by itself, so the plan is printed, not judged).
np_converged() { nodeagentctl status | grep -qE '^ *Converged +True'; }
check converged-after-apply wait_for 30 np_converged
nodeagent plan 2>&1 | sed 's/^/    plan: /' | head -20
nodeagentctl status | sed 's/^/    status: /' | head -20
# For the boot after the adopt step: the uplink's YAML and the file. The
# name-pattern entry stays out.
mkdir -p /root/netplan-carry
cp -p /etc/netplan/50-uplink.yaml /etc/systemd/network/00-nodeagent.network /root/netplan-carry/
echo "$NP_MAC" > /root/netplan-carry/mac
# Leave the node as it was: the config, the files, networkd.
rm -f /etc/netplan/50-uplink.yaml /etc/netplan/60-others.yaml /etc/systemd/network/00-nodeagent.network /run/systemd/network/10-netplan-*
write_config < /root/netplan-saved.yaml
check restore-reload systemctl reload nodeagent
check links-removed wait_for 30 sh -c "! ip link show enp1s0.50 && ! ip link show vlan50-shim && ! ip link show wg-pia"
ip link del enp1s0
ip netns del np
rm -f /etc/nodeagent/keys/wg-pia.key
[[ $np_dropin_was == no ]] && rm -f /etc/systemd/networkd.conf.d/nodeagent.conf
if [[ $np_networkd_was == active ]]; then
	networkctl reload
else
	systemctl stop systemd-networkd.socket systemd-networkd
fi
check converged-after wait_for 30 np_converged
