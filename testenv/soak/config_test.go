package soak

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

func testParams(standIn bool) ConfigParams {
	return ConfigParams{
		Dir: "/run/soak", PIADev: "wgpia1234", WG0Dev: "wg0s1234", StandIn: standIn,
		Node: "homelab-node", Kubeconfig: "/run/soak/kubelet.kubeconfig",
		ServerList: "https://198.18.0.10/vpninfo/servers/v6", TokenURL: "https://198.18.0.10/api/client/v2/token",
		CAFile: "/run/soak/ca.crt", ServerListKeyFile: "/run/soak/list.pem", WebCAFile: "/run/soak/web.crt",
		Region: "stub_ams", Hook: "/run/soak/hook.sh", HookEvery: "30s", HookTimeout: "10s", Endpoint: "192.0.2.1:51820",
	}
}

// TestHomelabConfig: the soak runs the example's own config, with only
// the lab's names, paths and the stub changed; it parses, and every
// section of the example is still there.
func TestHomelabConfig(t *testing.T) {
	example, err := os.ReadFile(filepath.Join("..", "..", ExampleFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, standIn := range []bool{true, false} {
		p := testParams(standIn)
		out, err := HomelabConfig(example, p)
		if err != nil {
			t.Fatal(err)
		}
		c, err := config.Parse("soak.yaml", out)
		if err != nil {
			t.Fatalf("standIn %v: %v\n%s", standIn, err, out)
		}
		s := string(out)
		for _, gone := range []string{"wg-pia", "/etc/nodeagent", "vpn.example.org", "kubelet.kubeconfig\n"} {
			for _, l := range strings.Split(s, "\n") {
				if i := strings.Index(l, "#"); i >= 0 {
					l = l[:i]
				}
				if strings.Contains(l, gone) && !strings.Contains(l, p.Dir) {
					t.Errorf("standIn %v: %q still in %q", standIn, gone, l)
				}
			}
		}
		if len(c.WireGuard) != 2 || c.WireGuard[0].PIA == nil || c.WireGuard[0].Name != p.PIADev || c.WireGuard[1].Name != p.WG0Dev {
			t.Errorf("standIn %v: wireguard %+v", standIn, c.WireGuard)
		}
		if len(c.Routing.Rules) != 2 || len(c.Firewall.KillSwitch) != 2 || len(c.Kubernetes.ConditionalLabels) != 1 {
			t.Errorf("standIn %v: the example's rules, kill switches and conditional label are not all there", standIn)
		}
		links := len(c.VLANs) + len(c.Macvlans)
		if links != 3 || standIn != (len(c.VLANs) == 0) {
			t.Errorf("standIn %v: %d VLANs and %d macvlans", standIn, len(c.VLANs), len(c.Macvlans))
		}
	}
}
