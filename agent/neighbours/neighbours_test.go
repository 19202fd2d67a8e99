package neighbours

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// Links gives each of nodeagent's links what networkd and udev see of it:
// a VLAN not made yet its parent's address, one that exists what the sync
// observed (its alternative names, its mark).
func TestLinks(t *testing.T) {
	parentMAC := net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}
	var d netcfg.Desired
	d.Link.Links = []link.Link{{Name: "enp7s0.50", Kind: link.VLAN, Parent: "enp7s0", VLANID: 50}, {Name: "shim0", Kind: link.Macvlan, Parent: "enp7s0.50"}}
	d.WG.Devices = []wg.Device{{Name: "wg0"}}
	obs := link.Observed{Links: map[string]link.ObservedLink{
		"enp7s0": {Index: 2, Name: "enp7s0"},
		"shim0":  {Index: 9, Name: "shim0", Kind: "macvlan", Owned: true, AltNames: []string{"mv9"}},
	}, MACs: map[int]net.HardwareAddr{2: parentMAC, 9: {2, 0, 0, 0, 0, 9}}}
	ls := Links(hazard.Paths{Root: t.TempDir()}, d, obs)
	if len(ls) != 3 {
		t.Fatalf("%d links", len(ls))
	}
	vlan, shim, wg0 := ls[0], ls[1], ls[2]
	if vlan.DevType != "vlan" || !bytes.Equal(vlan.MAC, parentMAC) || vlan.Driver != "802.1Q VLAN Support" || len(vlan.PermMAC) != 6 || vlan.Parent != "enp7s0" {
		t.Errorf("vlan %+v", vlan)
	}
	if shim.Alias != "nodeagent" || shim.AltNames[0] != "mv9" || shim.MAC[5] != 9 || shim.DevType != "" {
		t.Errorf("shim %+v", shim)
	}
	if wg0.DevType != "wireguard" || wg0.MAC != nil || wg0.IfType != 65534 {
		t.Errorf("wg0 %+v", wg0)
	}
}

// Look puts the hazards of networkd, udev and ifupdown together; Suspect
// names the one that explains a fight's object, else what its form says.
func TestLookAndSuspect(t *testing.T) {
	root := t.TempDir()
	put := func(rel, body string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("etc/systemd/network/50-en.network", "[Match]\nName=en*\n")
	put("etc/systemd/network/10-wg.link", "[Match]\nKind=wireguard\n[Link]\nName=wgx\n")
	put("etc/network/interfaces", "auto shim0\niface shim0 inet dhcp\n")
	var logs bytes.Buffer
	n := &Neighbours{o: Options{Paths: hazard.Paths{Root: root}, Log: slog.New(slog.NewTextHandler(&logs, nil)),
		System: &hazard.System{Networkd: true, Udev: true, Ifupdown: true, Version: 252}}}
	links := []hazard.Link{hazard.Predict("enp7s0.50", "vlan", net.HardwareAddr{2, 0, 0, 0, 0, 1}), hazard.Predict("shim0", "macvlan", net.HardwareAddr{2, 0, 0, 0, 0, 2}), hazard.Predict("wg0", "wireguard", nil)}
	hs := n.Eval(links, true)
	byManager := map[string][]string{}
	for _, h := range hs {
		byManager[h.Manager] = append(byManager[h.Manager], h.Link)
	}
	if got := strings.Join(byManager["systemd-networkd"], ","); got != ",,enp7s0.50" {
		t.Errorf("networkd: %q (two settings, then the VLAN)", got)
	}
	if got := strings.Join(byManager["udev"], ","); got != "wg0" {
		t.Errorf("udev: %q", got)
	}
	if got := strings.Join(byManager["ifupdown"], ","); got != "shim0" {
		t.Errorf("ifupdown: %q", got)
	}
	if n.Eval(links, true); strings.Count(logs.String(), "a neighbour undoes") != len(hs) {
		t.Errorf("the same hazards logged again:\n%s", logs.String())
	}
	for _, c := range []struct{ kind, object, text, want string }{
		{"address", "address 10.10.50.3/24 on shim0", "~ re-own ...", "ifupdown (/etc/network/interfaces:2)"},
		{"rule", "rule 1000: from 10.10.50.0/24 lookup 150", "+ rule", "systemd-networkd (systemd-networkd (default))"},
		{"address", "address 10.90.0.1/24 on wg9", "~ re-own address 10.90.0.1/24 on wg9 (noprefixroute, valid_lft 300sec, not ours)", "a DHCP client or NetworkManager"},
		{"address", "address 10.90.0.1/24 on wg9", "~ re-own address 10.90.0.1/24 on wg9 (noprefixroute, not ours)", "NetworkManager or a DHCP client"},
		{"link", "link other0", "+ link other0", "unknown"},
	} {
		if got := n.Suspect(c.kind, c.object, c.text); !strings.HasPrefix(got, c.want) {
			t.Errorf("suspect of %s: %q, want %q", c.object, got, c.want)
		}
	}
}
