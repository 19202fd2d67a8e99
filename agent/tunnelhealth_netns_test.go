package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestIdleServerHasNoTunnelHealth: a remote-access device whose one
// registered peer (a phone) is offline is idle, not down. The daemon
// exports its peers (1, none live) and no nodeagent_tunnel_healthy series
// for it, so NodeagentTunnelUnhealthy cannot fire on it; only a PIA
// tunnel has a health.
func TestIdleServerHasNoTunnelHealth(t *testing.T) {
	ns := testenv.NewNetNS(t)
	dir := t.TempDir()
	k, _ := wgtypes.GeneratePrivateKey()
	key := filepath.Join(dir, "wg.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
	reg := filepath.Join(dir, "peers.d")
	os.Mkdir(reg, 0o755)
	phone, _ := wgtypes.GeneratePrivateKey()
	os.WriteFile(filepath.Join(reg, "phone.yaml"), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.92.0.2/32]\n", phone.PublicKey())), 0o644)
	dev := uniqueName("wgi")
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("wireguard:\n  - name: %s\n    privateKeyFile: %s\n    listenPort: 51821\n    addresses: [10.92.0.1/24]\n    peersDir: %s\n", dev, key, reg)), 0o600)
	r := startDaemon(t, ns, cfg, nil)

	mfs, err := r.d.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if labelIs(m, "device", dev) {
				got[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	if v, ok := got["nodeagent_wireguard_peers"]; !ok || v != 1 {
		t.Errorf("nodeagent_wireguard_peers{device=%q} = %v (present %v), want 1", dev, v, ok)
	}
	if v, ok := got["nodeagent_wireguard_live_peers"]; !ok || v != 0 {
		t.Errorf("nodeagent_wireguard_live_peers{device=%q} = %v (present %v), want 0", dev, v, ok)
	}
	if v, ok := got["nodeagent_tunnel_healthy"]; ok {
		t.Errorf("the idle server device exports nodeagent_tunnel_healthy %v; want no series", v)
	}
}
