package hazard

import (
	"net"
	"strings"
	"testing"
)

// udev's .link files, read as udevd reads them (link-config.c): the first
// file in name order whose [Match] (OriginalName=, not alternative
// names) catches a link applies; Name= and NamePolicy= rename it unless a
// policy keeps the creator's name; Alias= overwrites the alias;
// MACAddress= (policy none) sets the address, the persistent and random
// policies never touch a VLAN's stolen or a set address.
func TestUdevLinkFiles(t *testing.T) {
	vlan, shim, wg := vmLinks()[0], vmLinks()[1], vmLinks()[2]
	vlan.Alias, shim.Alias, wg.Alias = "nodeagent", "nodeagent", "nodeagent"
	all := []Link{vlan, shim, wg}
	for _, tc := range []struct {
		name  string
		files map[string]string
		cmd   string
		// want: link -> what the hazard says ("" none)
		want map[string]string
	}{
		{"Debian's 99-default.link keeps the creator's names", map[string]string{
			"usr/lib/systemd/network/99-default.link": "[Match]\nOriginalName=*\n[Link]\nNamePolicy=keep kernel database onboard slot path\nAlternativeNamesPolicy=database onboard slot path\nMACAddressPolicy=persistent\n",
		}, "", nil},
		{"Name= renames the VLAN", map[string]string{
			"etc/systemd/network/10-vlan.link": "[Match]\nOriginalName=enp7s0.50\n[Link]\nName=vlan50\n",
		}, "", map[string]string{"enp7s0.50": "renames it to vlan50"}},
		{"NamePolicy=keep first keeps it", map[string]string{
			"etc/systemd/network/10-vlan.link": "[Match]\nOriginalName=enp7s0.50\n[Link]\nNamePolicy=keep\nName=vlan50\n",
		}, "", nil},
		{"an empty NamePolicy= leaves Name=", map[string]string{
			"etc/systemd/network/10-vlan.link": "[Match]\nOriginalName=enp7s0.50\n[Link]\nNamePolicy=\nName=vlan50\n",
		}, "", map[string]string{"enp7s0.50": "renames it to vlan50"}},
		{"net.naming_scheme=v239 does not rename a creator's name", map[string]string{
			"etc/systemd/network/10-vlan.link": "[Match]\nOriginalName=enp7s0.50\n[Link]\nName=vlan50\n",
		}, "net.naming_scheme=v239", nil},
		{"net.ifnames=0 turns NamePolicy off, Name= stays", map[string]string{
			"etc/systemd/network/10-vlan.link": "[Match]\nOriginalName=enp7s0.50\n[Link]\nNamePolicy=keep\nName=vlan50\n",
		}, "net.ifnames=0", map[string]string{"enp7s0.50": "renames it to vlan50"}},
		{"Alias= on every link", map[string]string{
			"etc/systemd/network/10-all.link": "[Match]\nOriginalName=*\n[Link]\nAlias=lab\n",
		}, "", map[string]string{"enp7s0.50": `alias to "lab"`, "shim0": `alias to "lab"`, "wg0": `alias to "lab"`}},
		{"Alias=nodeagent changes nothing", map[string]string{
			"etc/systemd/network/10-all.link": "[Match]\nOriginalName=*\n[Link]\nAlias=nodeagent\n",
		}, "", nil},
		{"Type=vlan (DEVTYPE) and a static MAC", map[string]string{
			"etc/systemd/network/10-v.link": "[Match]\nType=vlan\n[Link]\nMACAddress=02:00:00:00:00:09\n",
		}, "", map[string]string{"enp7s0.50": "address to 02:00:00:00:00:09"}},
		{"MACAddressPolicy=random leaves a VLAN's and a set address", map[string]string{
			"etc/systemd/network/10-v.link": "[Match]\nOriginalName=*\n[Link]\nMACAddressPolicy=random\n",
		}, "", nil},
		{"OriginalName= does not see alternative names", map[string]string{
			"etc/systemd/network/10-v.link": "[Match]\nOriginalName=trunk50\n[Link]\nName=vlan50\n",
		}, "", nil},
		{"the first file in name order wins", map[string]string{
			"etc/systemd/network/00-nodeagent.link": "[Match]\nOriginalName=enp7s0.50 shim0 wg0\n[Link]\nNamePolicy=keep\n",
			"etc/systemd/network/10-all.link":       "[Match]\nOriginalName=*\n[Link]\nName=renamed\nAlias=x\n",
		}, "", nil},
		{"an empty [Match] is ignored", map[string]string{
			"etc/systemd/network/10-all.link": "[Match]\n[Link]\nAlias=x\n",
		}, "", nil},
		{"a drop-in adds the rename", map[string]string{
			"usr/lib/systemd/network/10-wg.link":         "[Match]\nKind=wireguard\n",
			"etc/systemd/network/10-wg.link.d/name.conf": "[Link]\nName=wgx\n",
		}, "", map[string]string{"wg0": "renames it to wgx"}},
		{"PermanentMACAddress= as netplan writes it catches no VLAN", map[string]string{
			"run/systemd/network/10-netplan-up.link": "[Match]\nPermanentMACAddress=52:54:00:12:34:56\n[Link]\nName=enp7s0\nWakeOnLan=off\n",
		}, "", nil},
		{"MACAddress= of the parent catches the VLAN", map[string]string{
			"run/systemd/network/10-up.link": "[Match]\nMACAddress=52:54:00:12:34:56\n[Link]\nName=enp7s0\n",
		}, "", map[string]string{"enp7s0.50": "renames it to enp7s0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tree(t, tc.files)
			s := vmSystem()
			if tc.cmd != "" {
				s.KernelCmdline += " " + tc.cmd
			}
			hs := Udev(p, s, all)
			got := map[string]string{}
			for _, h := range hs {
				got[h.Link] = h.What
				if h.Manager != "udev" || !strings.Contains(h.Fix, "OriginalName=!"+h.Link) {
					t.Errorf("hazard %s", h)
				}
			}
			for l, want := range tc.want {
				if !strings.Contains(got[l], want) {
					t.Errorf("%s: %q, want %q", l, got[l], want)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	// No udevd, no hazard.
	p := tree(t, map[string]string{"etc/systemd/network/10-all.link": "[Match]\nOriginalName=*\n[Link]\nAlias=x\n"})
	s := vmSystem()
	s.Udev = false
	if hs := Udev(p, s, all); hs != nil {
		t.Errorf("without udevd: %v", hs)
	}
}

// The verdict is what `udevadm test-builtin net_setup_link` reports:
// ID_NET_LINK_FILE and ID_NET_NAME.
func TestUdevVerdict(t *testing.T) {
	p := tree(t, map[string]string{
		"usr/lib/systemd/network/99-default.link": "[Match]\nOriginalName=*\n[Link]\nNamePolicy=keep kernel database onboard slot path\nMACAddressPolicy=persistent\n",
		"etc/systemd/network/20-shim.link":        "[Match]\nKind=macvlan\n[Link]\nName=mv0\n",
	})
	shim := Predict("shim0", "macvlan", net.HardwareAddr{2, 0, 0, 0, 0, 1})
	if e := UdevVerdict(p, vmSystem(), shim); !strings.HasSuffix(e.File, "20-shim.link") || e.NewName != "mv0" {
		t.Errorf("shim: %+v", e)
	}
	vlan := Predict("enp7s0.50", "vlan", trunkMAC)
	if e := UdevVerdict(p, vmSystem(), vlan); !strings.HasSuffix(e.File, "99-default.link") || e.NewName != "" {
		t.Errorf("vlan: %+v", e)
	}
}
