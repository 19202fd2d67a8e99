package packaging

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
)

// TestNetplanUnmanagedFile: the README's file for Ubuntu (and any node
// whose .network files netplan writes), put where it says, leaves every
// link of the walkthrough's config unmanaged, as the hazard check reads
// networkd's files, beside a netplan file whose match catches them all;
// and it names exactly the example's links. (The package VM asks networkd
// itself, after netplan generate.)
func TestNetplanUnmanagedFile(t *testing.T) {
	const target = "/etc/systemd/network/00-nodeagent.network"
	var file string
	for _, b := range loadDocs(t).blocks("README.md") {
		if b.marker == "file:"+target {
			file = b.text
		}
	}
	if file == "" {
		t.Fatalf("README.md has no block marked file:%s", target)
	}
	var names []string
	for _, l := range strings.Split(file, "\n") {
		if v, ok := strings.CutPrefix(l, "Name="); ok {
			names = strings.Fields(v)
		}
	}
	links := configLinks(homelab(t))
	if strings.Join(names, " ") != strings.Join(links, " ") {
		t.Errorf("the file's Name= is %q; the example's links are %q", names, links)
	}

	root := t.TempDir()
	put := func(rel, text string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// What netplan generates for `match: {name: "en*"}` with DHCP: under
	// /run, rewritten at every boot.
	const netplan = "run/systemd/network/10-netplan-all-en.network"
	put(netplan, "[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\n")
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	kinds := map[string]hazard.Link{
		"enp1s0.50":   {Kind: "vlan", DevType: "vlan", IfType: 1, MAC: mac},
		"vlan50-shim": {Kind: "macvlan", IfType: 1, MAC: net.HardwareAddr{0x5a, 1, 2, 3, 4, 5}},
		"wg-pia":      {Kind: "wireguard", DevType: "wireguard", IfType: 65534},
		"wg0":         {Kind: "wireguard", DevType: "wireguard", IfType: 65534},
	}
	for _, v := range []int{252, 255} {
		sys := hazard.System{Networkd: true, Udev: true, Version: v}
		l := kinds["enp1s0.50"]
		l.Name = "enp1s0.50"
		if f, unmanaged := hazard.NetworkdVerdict(hazard.Paths{Root: root}, sys, l); unmanaged || !strings.HasSuffix(f, netplan) {
			t.Fatalf("systemd %d without the file: enp1s0.50 is caught by %q (unmanaged %v), want netplan's", v, f, unmanaged)
		}
	}
	put(strings.TrimPrefix(target, "/"), file)
	for _, v := range []int{252, 255} {
		sys := hazard.System{Networkd: true, Udev: true, Version: v}
		for _, name := range links {
			l, ok := kinds[name]
			if !ok {
				t.Fatalf("no link shape for %s", name)
			}
			l.Name = name
			f, unmanaged := hazard.NetworkdVerdict(hazard.Paths{Root: root}, sys, l)
			if !unmanaged || !strings.HasSuffix(f, target) {
				t.Errorf("systemd %d: %s is configured by %q (unmanaged %v), want unmanaged by %s", v, name, f, unmanaged, target)
			}
		}
		// The NIC itself stays netplan's.
		if f, unmanaged := hazard.NetworkdVerdict(hazard.Paths{Root: root}, sys, hazard.Link{Name: "enp1s0", Kind: "", IfType: 1, MAC: mac}); unmanaged || !strings.HasSuffix(f, netplan) {
			t.Errorf("systemd %d: enp1s0 is %q (unmanaged %v), want netplan's", v, f, unmanaged)
		}
	}
}
