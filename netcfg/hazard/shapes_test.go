package hazard

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// shape is one testdata/networkd/*.shape: files and the links networkd
// manages with them.
type shape struct {
	name    string
	want    []string
	fixture bool // fixture-only
	files   []*shapeFile
}

type shapeFile struct {
	path, target string // target: a symbolic link's
	mode         os.FileMode
	body         strings.Builder
}

func readShapes(t *testing.T, dir string) []shape {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, "*.shape"))
	var out []shape
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		s := shape{name: strings.TrimSuffix(filepath.Base(p), ".shape")}
		var cur *shapeFile
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case cur == nil && strings.HasPrefix(line, "#"):
			case strings.HasPrefix(line, "want: "):
				if w := strings.Fields(strings.TrimPrefix(line, "want: ")); len(w) > 0 && w[0] != "-" {
					s.want = w
				}
			case line == "fixture-only":
				s.fixture = true
			case strings.HasPrefix(line, "file "):
				w := strings.Fields(line)
				sf := &shapeFile{path: w[1], mode: 0o644}
				if len(w) == 4 && w[2] == "mode" {
					m, _ := strconv.ParseUint(w[3], 8, 32)
					sf.mode = os.FileMode(m)
				}
				s.files = append(s.files, sf)
				cur = sf
			case strings.HasPrefix(line, "link "):
				w := strings.Fields(line)
				s.files = append(s.files, &shapeFile{path: w[1], target: w[2]})
				cur = nil
			case cur != nil:
				cur.body.WriteString(line + "\n")
			}
		}
		f.Close()
		out = append(out, s)
	}
	return out
}

// networkTail keeps networkd's hands off a link it takes (the VM step
// appends the same).
const networkTail = "[Network]\nKeepConfiguration=yes\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n"

// write puts the shape under root, with the placeholders filled.
func (s shape) write(t *testing.T, root string, subst map[string]string) {
	t.Helper()
	for _, f := range s.files {
		p := filepath.Join(root, f.path)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if f.target != "" {
			if err := os.Symlink(f.target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		body := f.body.String()
		for k, v := range subst {
			body = strings.ReplaceAll(body, k, v)
		}
		if strings.HasSuffix(f.path, ".network") {
			body += networkTail
		}
		if err := os.WriteFile(p, []byte(body), f.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, f.mode)
	}
}

// The links of the package VM's gateway config, as networkd sees them.
var (
	trunkMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	shimMAC  = net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01}
)

func vmLinks() []Link {
	vlan := Predict("enp7s0.50", "vlan", trunkMAC)
	vlan.Parent, vlan.AltNames = "enp7s0", []string{"trunk50"}
	shim := Predict("shim0", "macvlan", shimMAC)
	shim.Parent = "enp7s0.50"
	return []Link{vlan, shim, Predict("wg0", "wireguard", nil)}
}

// vmSystem is the package VM as networkd 252 sees it.
func vmSystem() System {
	return System{Networkd: true, Udev: true, Version: 252, Hostname: "node1", MachineID: "0123456789abcdef0123456789abcdef",
		Virtualization: "qemu", VirtualizationKnown: true, Architecture: "x86-64", Native: "x86-64",
		KernelCmdline: "console=ttyS0 panic=-1 rdinit=/lib/systemd/systemd", KernelRelease: "6.1.0-57-amd64",
		NetworkdUser: &User{UID: 998, GIDs: []uint32{998}}}
}

// TestNetworkdShapes asks the reader about every shape of testdata/
// networkd, with the facts networkd 252 has of the package VM's links:
// the links it says networkd manages are the shape's want, which the
// package VM's oracle step checks against networkd itself.
func TestNetworkdShapes(t *testing.T) {
	shapes := readShapes(t, "testdata/networkd")
	if len(shapes) < 40 {
		t.Fatalf("%d shapes", len(shapes))
	}
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			root := t.TempDir()
			s.write(t, root, map[string]string{"@MAC@": trunkMAC.String(), "@SHIMMAC@": shimMAC.String(), "@HOST@": "node1"})
			p := Paths{Root: root}
			hs := Networkd(p, vmSystem(), vmLinks())
			var got []string
			for _, h := range hs {
				if h.Link != "" {
					got = append(got, h.Link)
				}
			}
			if !slices.Equal(got, s.want) {
				t.Errorf("caught %v, want %v\n%s", got, s.want, hazardLines(hs))
			}
			// NetworkdVerdict says the same, link by link.
			for _, l := range vmLinks() {
				file, unmanaged := NetworkdVerdict(p, vmSystem(), l)
				if caught := !unmanaged; caught != slices.Contains(s.want, l.Name) {
					t.Errorf("verdict for %s: file %q unmanaged %v", l.Name, file, unmanaged)
				}
			}
		})
	}
}

func hazardLines(hs []Hazard) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(h.String() + "\n")
	}
	return b.String()
}
