package hazard

import (
	"strings"
	"testing"
)

// ifupdown 0.8's configuration, read as ifupdown reads it: a stanza for
// one of nodeagent's links (a VLAN by its dotted name is made by ifup and
// deleted by ifdown), a stanza for a parent whose ifdown deletes it, what
// `source` and `source-directory` pull in, `auto` and `allow-hotplug`.
func TestIfupdown(t *testing.T) {
	all := vmLinks()
	for _, tc := range []struct {
		name  string
		files map[string]string
		// want: link -> a part of what the hazard says
		want map[string]string
		fix  string
	}{
		{"Debian's default: lo only", map[string]string{
			"etc/network/interfaces": "source /etc/network/interfaces.d/*\n\nauto lo\niface lo inet loopback\n",
		}, nil, ""},
		{"auto enp7s0.50", map[string]string{
			"etc/network/interfaces": "auto lo\niface lo inet loopback\n\nauto enp7s0.50\niface enp7s0.50 inet manual\n",
		}, map[string]string{"enp7s0.50": "(auto: at boot and at every systemctl restart networking): ifup creates it (nodeagent then finds a link it did not make), ifdown deletes it (ip link del) at ifdown and at systemctl stop or restart networking, and the kernel deletes shim0 with it"},
			"remove the stanza iface enp7s0.50 (/etc/network/interfaces:5) and enp7s0.50 from its auto line (/etc/network/interfaces:4)"},
		{"a stanza in interfaces.d, by hand only", map[string]string{
			"etc/network/interfaces":          "source-directory interfaces.d\n",
			"etc/network/interfaces.d/vlan50": "iface enp7s0.50 inet static\n    address 10.10.50.1/24\n",
			"etc/network/interfaces.d/skip.x": "iface wg0 inet manual\n",
		}, map[string]string{"enp7s0.50": "(by hand: ifup and ifdown)"}, "/etc/network/interfaces.d/vlan50:1"},
		{"allow-hotplug and a description", map[string]string{
			"etc/network/interfaces": "allow-hotplug wg0\niface wg0 inet manual\n  description lab tunnel\n",
		}, map[string]string{"wg0": `alias to "lab tunnel"`}, "allow-hotplug line"},
		{"the parent of the shim is our VLAN: one hazard names both", map[string]string{
			"etc/network/interfaces":     "source interfaces.d/*\n",
			"etc/network/interfaces.d/a": "auto enp7s0.50\niface enp7s0.50 inet manual\n",
		}, map[string]string{"enp7s0.50": "ifdown deletes it"}, "/etc/network/interfaces.d/a:2"},
		// A parent not of nodeagent's whose ifdown deletes it.
		{"a bridge parent", map[string]string{
			"etc/network/interfaces": "auto enp7s0\niface enp7s0 inet manual\n  bridge_ports eth0\n",
		}, map[string]string{"enp7s0.50": "the parent of nodeagent's link enp7s0.50"}, ""},
		{"a plain parent is not deleted by ifdown", map[string]string{
			"etc/network/interfaces": "auto enp7s0\niface enp7s0 inet dhcp\n",
		}, nil, ""},
		{"a continued line and a comment", map[string]string{
			"etc/network/interfaces": "# iface wg0 inet manual\nauto \\\n  shim0\niface shim0 inet manual\n",
		}, map[string]string{"shim0": "(auto:"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := Ifupdown(tree(t, tc.files), System{Ifupdown: true}, all)
			got := map[string]Hazard{}
			for _, h := range hs {
				got[h.Link] = h
			}
			for l, want := range tc.want {
				if !strings.Contains(got[l].What, want) {
					t.Errorf("%s: %q, want %q", l, got[l].What, want)
				}
				if tc.fix != "" && strings.Contains(got[l].What, "a stanza for nodeagent's link") && !strings.Contains(got[l].Fix, tc.fix) {
					t.Errorf("%s fix: %q, want %q", l, got[l].Fix, tc.fix)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", hs, tc.want)
			}
		})
	}
	// Without ifupdown installed its files do nothing.
	p := tree(t, map[string]string{"etc/network/interfaces": "auto enp7s0.50\niface enp7s0.50 inet manual\n"})
	if hs := Ifupdown(p, System{}, all); hs != nil {
		t.Errorf("without ifupdown: %v", hs)
	}
}
