package netcfg

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// BenchmarkNoopSyncHomelab is the daemon's steady state with the homelab's
// shape of config (DESIGN.md §8: no-op sync <= 2 ms, zero writes): the
// VLAN-50 shim and a SAN shim (macvlans: the host kernel has no 8021q), the
// PIA gateway's kill-switch table, rules and nftables (masquerade, kill
// switch, MSS clamp), forwarding sysctls, and wg0 with a register of 10
// peers (userspace on this kernel). Each iteration is what a kernel event
// or resync costs: observe every subsystem and plan, with the desired state
// in memory.
func BenchmarkNoopSyncHomelab(b *testing.B) {
	testenv.RequireRoot(b)
	node, peer := testenv.NewNetNS(b), testenv.NewNetNS(b)
	node.Veth(b, "enp1s0", peer, "eth0")
	node.Veth(b, "tun0", testenv.NewNetNS(b), "eth0")
	dir := b.TempDir()
	k, _ := wgtypes.GeneratePrivateKey()
	key := filepath.Join(dir, "wg0.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
	peers := filepath.Join(dir, "peers.d")
	os.Mkdir(peers, 0o755)
	for i := 0; i < 10; i++ {
		p, _ := wgtypes.GeneratePrivateKey()
		os.WriteFile(filepath.Join(peers, fmt.Sprintf("client%d.yaml", i)), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.90.0.%d/32]\n", p.PublicKey(), 10+i)), 0o644)
	}
	name := "wgb" + strings.TrimPrefix(node.Name, "na-test-")[:6]
	yaml := fmt.Sprintf(`dad: {disabled: true}
sysctls:
  net.ipv4.ip_forward: "1"
macvlans:
  - {name: vlan50-shim, parent: enp1s0, addresses: [10.10.50.3/24]}
  - {name: san-shim, parent: enp1s0, addresses: [10.10.49.3/24]}
wireguard:
  - {name: %s, privateKeyFile: %s, listenPort: 51820, addresses: [10.90.0.1/24], mtu: 1420, peersDir: %s}
routing:
  tables:
    - id: 150
      name: vlan50-egress
      killSwitch: true
      routes: [{to: default, dev: tun0}, {to: 10.10.50.0/24, dev: vlan50-shim}]
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  masquerade: [{from: 10.10.50.0/24, out: tun0}, {from: 10.90.0.0/24, out: enp1s0}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [tun0]}]
  mssClamp: [tun0]
`, name, key, peers)
	c, err := config.Parse(filepath.Join(dir, "nodeagent.yaml"), []byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	d, err := FromConfig(c, filepath.Join(dir, "rt_tables.conf"))
	if err != nil {
		b.Fatal(err)
	}
	us := wg.NewUserspace(nil)
	defer us.Close()
	cv := &Converger{Host: node.Host, Userspace: us}
	defer cv.Close()
	ctx := context.Background()
	if _, err := cv.Sync(ctx, d); err != nil {
		b.Fatal(err)
	}
	writes, cfgWrites := node.Host.Writes(), cv.WG().ConfigWrites()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		p, err := cv.Plan(ctx, d)
		if err != nil || !p.Empty() {
			b.Fatalf("no-op plan: %v\n%s", err, p)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.StopTimer()
	w := node.Host.Writes() - writes + cv.WG().ConfigWrites() - cfgWrites
	b.ReportMetric(float64(per.Microseconds())/1000, "noop-ms")
	b.ReportMetric(float64(w), "noop-writes")
	fmt.Printf("\nhomelab-shaped config, no-op sync (observe + plan of every subsystem): %.2f ms (target <= 2 ms), %d writes (target 0)\n\n", float64(per.Microseconds())/1000, w)
}
