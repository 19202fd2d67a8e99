package hazard

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree writes a fixture root: files by path relative to it; a value
// "->TARGET" makes a symlink.
func tree(t *testing.T, files map[string]string) Paths {
	t.Helper()
	root := t.TempDir()
	for rel, body := range files {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if target, ok := strings.CutPrefix(body, "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Paths{Root: root}
}

func sources(hs []Hazard) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(h.String() + "\n")
	}
	return b.String()
}

const off = "[Network]\nManageForeignRoutingPolicyRules=no\nManageForeignRoutes=no\n"

// The settings, read as networkd reads them: the main file from the first
// directory of the search path that has one, drop-ins from every
// networkd.conf.d in file-name order, an earlier directory's file hiding a
// later one's of the same name, a link to /dev/null masking it.
func TestNetworkdSettings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		runs  bool
		want  []string // the keys reported, in order
		// version is systemd's (0: 252)
		version int
	}{
		{"networkd not running", map[string]string{}, false, nil, 0},
		{"defaults", map[string]string{}, true, []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"}, 0},
		{"both off in /etc/systemd/networkd.conf", map[string]string{"etc/systemd/networkd.conf": off}, true, nil, 0},
		{"main file only from /usr/lib (256 and later)", map[string]string{"usr/lib/systemd/networkd.conf": off}, true, nil, 257},
		{"/etc's main file hides /usr/lib's", map[string]string{"etc/systemd/networkd.conf": "[Network]\n", "usr/lib/systemd/networkd.conf": off}, true, []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"}, 0},
		{"a drop-in in /usr/local/lib", map[string]string{"usr/local/lib/systemd/networkd.conf.d/10-x.conf": off}, true, nil, 0},
		{"drop-ins in file-name order across directories", map[string]string{
			"etc/systemd/networkd.conf.d/10-off.conf":    off,
			"usr/lib/systemd/networkd.conf.d/20-on.conf": "[Network]\nManageForeignRoutes=yes\n",
		}, true, []string{"ManageForeignRoutes"}, 0},
		{"/etc's drop-in hides /usr/lib's of the same name", map[string]string{
			"etc/systemd/networkd.conf.d/50-x.conf":     off,
			"usr/lib/systemd/networkd.conf.d/50-x.conf": "[Network]\nManageForeignRoutes=yes\n",
		}, true, nil, 0},
		{"a drop-in masked by /dev/null", map[string]string{
			"etc/systemd/networkd.conf":             off,
			"etc/systemd/networkd.conf.d/50-x.conf": "->/dev/null",
			"run/systemd/networkd.conf.d/50-x.conf": "[Network]\nManageForeignRoutes=yes\n",
		}, true, nil, 0},
		{"other sections do not count", map[string]string{"etc/systemd/networkd.conf": "[DHCPv4]\nManageForeignRoutes=no\n[Network]\nManageForeignRoutingPolicyRules=false\n"}, true, []string{"ManageForeignRoutes"}, 0},
		// Before 256 the main file is /etc/systemd/networkd.conf only;
		// from 256 the first of the four directories' (networkd-conf.c).
		{"252 reads no main file from /usr/lib", map[string]string{"usr/lib/systemd/networkd.conf": off}, true, []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"}, 252},
		{"255 reads no main file from /usr/lib", map[string]string{"usr/lib/systemd/networkd.conf": off}, true, []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"}, 255},
		{"256 reads the main file from /usr/lib", map[string]string{"usr/lib/systemd/networkd.conf": off}, true, nil, 256},
		{"257: /run's main file hides /usr/lib's", map[string]string{"run/systemd/networkd.conf": "[Network]\n", "usr/lib/systemd/networkd.conf": off}, true, []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"}, 257},
		{"257: an empty /etc main file hides /usr/lib's", map[string]string{"etc/systemd/networkd.conf": "", "usr/lib/systemd/networkd.conf": off}, true, []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"}, 257},
		// 252 is built with split-usr on Debian: /lib is searched too.
		{"252: a drop-in in /lib", map[string]string{"lib/systemd/networkd.conf.d/10.conf": off}, true, nil, 252},
		{"255: no /lib", map[string]string{"lib/systemd/networkd.conf.d/10.conf": off}, true, []string{"ManageForeignRoutingPolicyRules", "ManageForeignRoutes"}, 255},
		// networkd's parse_boolean(): a value that is not a boolean
		// leaves the setting as it was (the default yes, or an earlier
		// file's).
		{"not a boolean keeps the default", map[string]string{"etc/systemd/networkd.conf": "[Network]\nManageForeignRoutingPolicyRules=maybe\nManageForeignRoutes=off\n"}, true, []string{"ManageForeignRoutingPolicyRules"}, 0},
		{"not a boolean keeps an earlier file's no", map[string]string{"etc/systemd/networkd.conf": off, "etc/systemd/networkd.conf.d/10.conf": "[Network]\nManageForeignRoutes=nope\n"}, true, nil, 0},
		{"booleans in any case", map[string]string{"etc/systemd/networkd.conf": "[Network]\nManageForeignRoutingPolicyRules=FALSE\nManageForeignRoutes=N\n"}, true, nil, 0},
		{"empty value keeps the setting", map[string]string{"etc/systemd/networkd.conf": off, "etc/systemd/networkd.conf.d/10.conf": "[Network]\nManageForeignRoutes=\n"}, true, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.version
			if v == 0 {
				v = 252
			}
			hs := Networkd(tree(t, tc.files), System{Networkd: tc.runs, Version: v}, nil)
			if len(hs) != len(tc.want) {
				t.Fatalf("got:\n%swant %q", sources(hs), tc.want)
			}
			for i, k := range tc.want {
				if !strings.Contains(hs[i].What, k+"=yes") || !strings.Contains(hs[i].Fix, k+"=no") {
					t.Errorf("hazard %d: %s", i, hs[i])
				}
			}
		})
	}
	// The source names the file that turned a setting on.
	hs := Networkd(tree(t, map[string]string{"etc/systemd/networkd.conf": off, "run/systemd/networkd.conf.d/9.conf": "[Network]\nManageForeignRoutes=true\n"}), System{Networkd: true, Version: 252}, nil)
	if len(hs) != 1 || !strings.HasSuffix(hs[0].Source, "run/systemd/networkd.conf.d/9.conf") {
		t.Errorf("source: %s", sources(hs))
	}
}

// .network files that catch nodeagent's links: by name glob, by MAC (a
// VLAN has its parent's), by kind and type; the first file in name order
// is the one networkd applies; negated and non-matching lists do not.
func TestNetworkFilesThatCatchOurLinks(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	vlan := Predict("enp1s0.50", "vlan", mac)
	shim := Predict("vlan50-shim", "macvlan", net.HardwareAddr{0x02, 1, 2, 3, 4, 5})
	wg := Predict("wg0", "wireguard", nil)
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  map[string]string // link -> file (relative) that catches it
	}{
		{"Name=en* catches the VLAN", map[string]string{"etc/systemd/network/10-uplink.network": "[Match]\nName=en*\n[Network]\nDHCP=yes\n"},
			map[string]string{"enp1s0.50": "etc/systemd/network/10-uplink.network"}},
		{"an exact name does not", map[string]string{"etc/systemd/network/10-uplink.network": "[Match]\nName=enp1s0\n"}, nil},
		{"the parent's MAC catches the VLAN", map[string]string{"usr/lib/systemd/network/10-mac.network": "[Match]\nMACAddress=52:54:00:12:34:56\n"},
			map[string]string{"enp1s0.50": "usr/lib/systemd/network/10-mac.network"}},
		{"Kind=macvlan", map[string]string{"run/systemd/network/5-mv.network": "[Match]\nKind=macvlan\n"},
			map[string]string{"vlan50-shim": "run/systemd/network/5-mv.network"}},
		// networkd takes the udev DEVTYPE first: a VLAN's Type= is vlan,
		// not ether (this case used to assert the VLAN was caught).
		{"Type=ether catches the macvlan, not the VLAN or WireGuard", map[string]string{"etc/systemd/network/99-all.network": "[Match]\nType=ether\n"},
			map[string]string{"vlan50-shim": "etc/systemd/network/99-all.network"}},
		{"a negated list catches what it does not name", map[string]string{"etc/systemd/network/10-x.network": "[Match]\nName=!enp1s0.50 wg0\n"},
			map[string]string{"vlan50-shim": ""}},
		{"every key must match", map[string]string{"etc/systemd/network/10-x.network": "[Match]\nName=en*\nKind=macvlan\n"}, nil},
		{"a Path= match is not ours", map[string]string{"etc/systemd/network/10-x.network": "[Match]\nName=*\nPath=pci-0000:01:00.0\n"}, nil},
		// "No valid settings found in the [Match] section, ignoring
		// file" (this case used to assert it matched everything).
		{"an empty [Match] is ignored", map[string]string{"etc/systemd/network/10-x.network": "[Match]\n[Network]\nDHCP=yes\n"}, nil},
		{"the first file in name order wins, across directories", map[string]string{
			"usr/lib/systemd/network/05-first.network": "[Match]\nName=enp1s0.*\n",
			"etc/systemd/network/10-second.network":    "[Match]\nName=en*\n",
		}, map[string]string{"enp1s0.50": "usr/lib/systemd/network/05-first.network"}},
		{"/etc's file hides /usr/lib's of the same name", map[string]string{
			"etc/systemd/network/10-x.network":     "[Match]\nName=eth0\n",
			"usr/lib/systemd/network/10-x.network": "[Match]\nName=*\n",
		}, nil},
		{"a file masked by /dev/null", map[string]string{
			"etc/systemd/network/10-x.network":     "->/dev/null",
			"usr/lib/systemd/network/10-x.network": "[Match]\nName=*\n",
		}, nil},
		{"no [Match] section at all is not a match here", map[string]string{"etc/systemd/network/10-x.network": "[Network]\nDHCP=yes\n"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{"etc/systemd/networkd.conf": off}
			for k, v := range tc.files {
				files[k] = v
			}
			p := tree(t, files)
			hs := Networkd(p, System{Networkd: true, Udev: true, Version: 252}, []Link{vlan, shim, wg})
			got := map[string]string{}
			for _, h := range hs {
				for _, l := range []string{"enp1s0.50", "vlan50-shim", "wg0"} {
					if strings.Contains(h.What, "link "+l+",") {
						got[l] = strings.TrimPrefix(h.Source, p.Root+"/")
						if !strings.Contains(h.Fix, "Name=!"+l) || !strings.Contains(h.Fix, "Unmanaged=yes") {
							t.Errorf("fix for %s: %s", l, h.Fix)
						}
					}
				}
			}
			for l, f := range tc.want {
				if f == "" {
					f = "etc/systemd/network/10-x.network"
				}
				if got[l] != f {
					t.Errorf("%s: caught by %q, want %q\n%s", l, got[l], f, sources(hs))
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("caught %v, want %v\n%s", got, tc.want, sources(hs))
			}
		})
	}
}
