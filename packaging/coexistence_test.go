package packaging

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/hazard"
)

// The shipped networkd drop-in, installed where its comment says, leaves a
// running networkd with no setting that deletes nodeagent's routing, as
// the hazard check reads networkd's configuration.
func TestNetworkdDropInClearsTheHazard(t *testing.T) {
	root := t.TempDir()
	put := func(rel string, b []byte) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Debian's own networkd.conf: every setting commented out.
	put("etc/systemd/networkd.conf", []byte("[Network]\n#ManageForeignRoutingPolicyRules=yes\n#ManageForeignRoutes=yes\n"))
	if hs := hazard.Networkd(hazard.Paths{Root: root}, hazard.System{Networkd: true, Version: 252}, nil); len(hs) != 2 {
		t.Fatalf("without the drop-in: %v, want both settings", hs)
	}
	dropIn, err := os.ReadFile("../systemd/networkd.conf.d/nodeagent.conf")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dropIn), "/etc/systemd/networkd.conf.d/nodeagent.conf") {
		t.Error("the drop-in does not say where it goes")
	}
	put("etc/systemd/networkd.conf.d/nodeagent.conf", dropIn)
	if hs := hazard.Networkd(hazard.Paths{Root: root}, hazard.System{Networkd: true, Version: 252}, nil); len(hs) != 0 {
		t.Errorf("with the drop-in: %v", hs)
	}
}

// The NetworkManager example leaves every link of the example config
// unmanaged, and nothing else.
func TestNetworkManagerExampleCoversTheExample(t *testing.T) {
	b, err := os.ReadFile("examples/NetworkManager/nodeagent.conf")
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[keyfile]" && strings.HasPrefix(line, "unmanaged-devices="):
			for _, d := range strings.Split(strings.TrimPrefix(line, "unmanaged-devices="), ";") {
				name, ok := strings.CutPrefix(d, "interface-name:")
				if !ok {
					t.Errorf("unmanaged-devices entry %q is not interface-name:", d)
				}
				devs = append(devs, name)
			}
		}
	}
	links := configLinks(homelab(t))
	if strings.Join(devs, " ") != strings.Join(links, " ") {
		t.Errorf("unmanaged-devices names %q; the example config's links are %q", devs, links)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
