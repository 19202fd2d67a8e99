package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestDaemonStagedStart: the daemon's start-up fills a new kernel device
// while it reads the register (a staging device), and its first sync takes
// it: every peer is in the device, the sync itself wrote none, and no
// staging device is left, nor the one a dead process had left behind.
func TestDaemonStagedStart(t *testing.T) {
	testenv.RequireModule(t, "wireguard")
	ns := testenv.NewNetNS(t)
	if _, err := ns.Host.LinkCreate(host.LinkSpec{Name: "nastg00dead00", Kind: "wireguard", Group: host.StagingGroup}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k, _ := wgtypes.GeneratePrivateKey()
	key := filepath.Join(dir, "wg.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
	reg := filepath.Join(dir, "peers.d")
	const n = 200
	testenv.WriteRegister(t, reg, n)
	dev := uniqueName("wgs")
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("wireguard:\n  - name: %s\n    implementation: kernel\n    privateKeyFile: %s\n    listenPort: 51820\n    addresses: [10.93.0.1/24]\n    peersDir: %s\n", dev, key, reg)), 0o600)
	r := startDaemon(t, ns, cfg, nil)
	if out := ns.Exec(t, "wg", "show", dev, "peers"); strings.Count(out, "\n") != n {
		t.Fatalf("%s has %d peers after start, want %d", dev, strings.Count(out, "\n"), n)
	}
	if got := r.d.cv.WG().PeerWrites(); got != 0 {
		t.Errorf("the first sync wrote %d peers itself; the staging device should have held them", got)
	}
	// Stages are deleted in the background, off the loop.
	waitFor(t, "no staging device left", 30*time.Second, func() bool {
		return !strings.Contains(ns.Exec(t, "ip", "-o", "link", "show"), "nastg")
	})
	if out := ns.Exec(t, "ip", "-o", "addr", "show", "dev", dev); !strings.Contains(out, "10.93.0.1/24") || !strings.Contains(ns.Exec(t, "ip", "-o", "link", "show", dev), "UP") {
		t.Errorf("%s is not up with its address", dev)
	}
}
