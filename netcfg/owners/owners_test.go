package owners

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReadAndSteps: the owners of five VLANs in a fixture /etc, one made
// by each of networkd, netplan, ifupdown (one on an auto line with another
// interface) and NetworkManager, and the steps that retire them: commands
// that change no link now, and an edit where a file does more than make
// the link.
func TestReadAndSteps(t *testing.T) {
	owners, problems := Read("testdata/etc", []string{"enp7s0.50", "vlan51", "enp7s0.52", "enp7s0.53", "vlan54", "enp7s0.99"})
	if len(problems) > 0 {
		t.Errorf("problems: %q", problems)
	}
	var got []string
	for _, o := range owners {
		got = append(got, o.Link+": "+o.Kind+" "+o.File+": "+o.Role)
	}
	want := []string{
		"enp7s0.50: systemd-networkd /etc/systemd/network/10-trunk.network: the parent's VLAN=enp7s0.50 line, which makes networkd create enp7s0.50 with its .netdev",
		"enp7s0.50: systemd-networkd /etc/systemd/network/50-vlan50.netdev: the .netdev that creates enp7s0.50 (Kind=vlan)",
		"enp7s0.50: systemd-networkd /etc/systemd/network/50-vlan50.network: the .network that configures enp7s0.50",
		"enp7s0.50: systemd-networkd /etc/systemd/network/90-all-en.network: its [Match] (Name= on line 3) matches enp7s0.50 and more: narrow it so that it no longer matches enp7s0.50",
		"enp7s0.52: systemd-networkd /etc/systemd/network/90-all-en.network: its [Match] (Name= on line 3) matches enp7s0.52 and more: narrow it so that it no longer matches enp7s0.52",
		"enp7s0.52: ifupdown /etc/network/interfaces.d/vlan52: the auto line that brings enp7s0.52 up at boot",
		"enp7s0.52: ifupdown /etc/network/interfaces.d/vlan52: the iface enp7s0.52 stanza",
		"enp7s0.53: systemd-networkd /etc/systemd/network/90-all-en.network: its [Match] (Name= on line 3) matches enp7s0.53 and more: narrow it so that it no longer matches enp7s0.53",
		"enp7s0.53: NetworkManager /etc/NetworkManager/system-connections/vlan53.nmconnection: the vlan profile that creates enp7s0.53",
		"enp7s0.99: systemd-networkd /etc/systemd/network/90-all-en.network: its [Match] (Name= on line 3) matches enp7s0.99 and more: narrow it so that it no longer matches enp7s0.99",
		"vlan51: netplan /etc/netplan/01-vlans.yaml: the vlans section, vlan51's entry alone",
		"vlan54: ifupdown /etc/network/interfaces.d/vlan52: line 6: auto names vlan54 and eth9: take vlan54 out of it",
		"vlan54: ifupdown /etc/network/interfaces.d/vlan52: the iface vlan54 stanza",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("owners (-want +got):\n%s", d)
	}
	var only []Owner
	for _, o := range owners {
		if !strings.Contains(o.File, "90-all-en") {
			only = append(only, o)
		}
	}
	steps := Steps(only)
	wantSteps := []string{
		"nmcli device set enp7s0.53 managed no   # NetworkManager lets go of enp7s0.53 now and leaves it as it is",
		"sed -i '6s/^/#/' /etc/systemd/network/10-trunk.network   # systemd-networkd: comment out the parent's VLAN=enp7s0.50 line, which makes networkd create enp7s0.50 with its .netdev (line 6); no networkctl reload now (it would reconfigure the link)",
		"rm /etc/systemd/network/50-vlan50.netdev   # systemd-networkd: the .netdev that creates enp7s0.50 (Kind=vlan); no networkctl reload now (it would reconfigure the link)",
		"rm /etc/systemd/network/50-vlan50.network   # systemd-networkd: the .network that configures enp7s0.50; no networkctl reload now (it would reconfigure the link)",
		"sed -i '1s/^/#/' /etc/network/interfaces.d/vlan52   # ifupdown: comment out the auto line that brings enp7s0.52 up at boot (line 1); do NOT run ifdown enp7s0.52 (it deletes the link)",
		"sed -i '2,4s/^/#/' /etc/network/interfaces.d/vlan52   # ifupdown: comment out the iface enp7s0.52 stanza (lines 2-4); do NOT run ifdown enp7s0.52 (it deletes the link)",
		`nmcli connection delete 7a1f6f4e-3c1f-4b47-9a33-2f0d3c2e5353   # NetworkManager's profile "VLAN 53" (/etc/NetworkManager/system-connections/vlan53.nmconnection), now that enp7s0.53 is unmanaged; enp7s0.53 stays`,
		"sed -i '5,9s/^/#/' /etc/netplan/01-vlans.yaml   # netplan: comment out the vlans section, vlan51's entry alone (lines 5-9); do NOT run netplan apply (the reboot applies it)",
		"edit /etc/network/interfaces.d/vlan52   # ifupdown: line 6: auto names vlan54 and eth9: take vlan54 out of it; do NOT run ifdown vlan54 (it deletes the link)",
		"sed -i '7,8s/^/#/' /etc/network/interfaces.d/vlan52   # ifupdown: comment out the iface vlan54 stanza (lines 7-8); do NOT run ifdown vlan54 (it deletes the link)",
	}
	if d := cmp.Diff(wantSteps, steps); d != "" {
		t.Errorf("steps (-want +got):\n%s", d)
	}
}
