package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/testenv"
)

// Fixed keys, so that plans (which print public keys) are the same on
// every run.
const (
	goldenServerKey = "GNFhAMkQuzpt7H0/Ne2OyeS2qB1u4mgpo0R0CsD8mXU="
	goldenPeerPub   = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
	goldenPeer2Pub  = "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="
)

// goldenConfigs are the configs whose plan and apply --once outputs are
// kept in testdata/golden: the homelab example and the shapes the other
// tests use (macvlans with routes and rules, the PIA gateway's routing and
// firewall, a WireGuard server with a register). Each sets up its node
// first; DIR stands for the test's directory.
var goldenConfigs = []struct {
	name  string
	setup []string // ip commands in the node's namespace
	files map[string]string
	cfg   string
	apply bool // also apply --once, twice (WireGuard needs the daemon on this kernel)
}{
	{name: "homelab", setup: []string{"ip link add enp1s0 type veth peer name wire0", "ip link set enp1s0 up"}},
	{name: "macvlans", setup: []string{"ip link add trunk0 type veth peer name wire0", "ip link set trunk0 up"}, cfg: killConfig(3), apply: true},
	{name: "gateway", setup: []string{
		"ip link add vlan50 type veth peer name lan0", "ip link set vlan50 up", "ip addr add 10.10.50.1/24 dev vlan50",
		"ip link add tun0 type veth peer name far0", "ip link set tun0 up", "ip addr add 10.99.0.1/24 dev tun0",
		"ip link add uplink type veth peer name wan0", "ip link set uplink up"},
		cfg: `dad: {disabled: true}
sysctls:
  net.ipv4.ip_forward: "1"
  net.ipv4.conf.vlan50.rp_filter: "2"
  net.ipv6.conf.*.forwarding: "1"
macvlans:
  - {name: shim50, parent: vlan50, addresses: [10.10.50.3/32, "fd00:50::3/128"]}
routing:
  tables:
    - id: 150
      name: vlan50-egress
      killSwitch: true
      routes:
        - {to: default, via: 10.99.0.2, dev: tun0}
        - {to: 10.10.50.0/24, dev: vlan50}
        - {to: 10.70.0.0/24, dev: shim50, metric: 10}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
    - {priority: 1001, to: 10.10.49.0/24, action: unreachable}
firewall:
  masquerade: [{from: 10.10.50.0/24, out: tun0}, {from: 10.90.0.0/24, out: uplink}]
  snat: [{from: 10.10.51.0/24, out: uplink, to: 192.0.2.1}]
  forward: [{in: vlan50, out: tun0}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [tun0]}, {from: "fd00:50::/64", allowOut: [tun0]}]
  mssClamp: [tun0]
`, apply: true},
	{name: "wireguard", files: map[string]string{
		"wg0.key":            goldenServerKey + "\n",
		"peers.d/alice.yaml": "publicKey: " + goldenPeerPub + "\nallowedIPs: [10.90.0.2/32]\n",
		"peers.d/bob.conf":   "[Peer]\nPublicKey = " + goldenPeer2Pub + "\nAllowedIPs = 10.90.0.3/32, fd00:90::3/128\nEndpoint = 192.0.2.7:51820\n",
		"peers.d/typo.yaml":  "publicKey: " + goldenPeerPub + "\nallowedIPs: [10.90.0.300/32]\n",
	}, cfg: `wireguard:
  - name: wgold0
    privateKeyFile: DIR/wg0.key
    listenPort: 51820
    addresses: [10.90.0.1/24]
    mtu: 1420
    peersDir: DIR/peers.d
    peers:
      - {name: gw, publicKey: ` + goldenPeer2Pub + `, allowedIPs: [10.90.1.0/24], persistentKeepalive: 25}
`},
}

// TestGoldenOutputs: plan and apply --once print exactly what
// testdata/golden holds for each config, run by run (NODEAGENT_UPDATE_GOLDEN=1
// rewrites the files). A change to these outputs is a change users see:
// it is made on purpose, in the golden files too.
func TestGoldenOutputs(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this")
	}
	bin := binary(t)
	for _, g := range goldenConfigs {
		t.Run(g.name, func(t *testing.T) {
			node := testenv.NewNetNS(t)
			for _, line := range g.setup {
				node.Exec(t, strings.Fields(line)...)
			}
			dir := t.TempDir()
			t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "rt_tables.d", "nodeagent.conf"))
			for name, content := range g.files {
				p := filepath.Join(dir, name)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cfg := "../../examples/homelab.yaml"
			if g.cfg != "" {
				cfg = filepath.Join(dir, "nodeagent.yaml")
				os.WriteFile(cfg, []byte(strings.ReplaceAll(g.cfg, "DIR", dir)), 0o600)
			}
			var b strings.Builder
			step := func(args ...string) {
				out, err := node.TryExec(append([]string{bin}, args...)...)
				fmt.Fprintf(&b, "$ nodeagent %s (%s)\n%s", strings.Join(args, " "), exitOf(err), out)
			}
			step("plan", "-c", cfg)
			if g.apply {
				step("apply", "--once", "--log-level", "error", "-c", cfg)
				step("plan", "-c", cfg)
				step("apply", "--once", "--log-level", "error", "-c", cfg)
			}
			got := normalizeGolden(b.String(), dir)
			path := filepath.Join("testdata", "golden", g.name+".txt")
			if os.Getenv("NODEAGENT_UPDATE_GOLDEN") == "1" {
				os.MkdirAll(filepath.Dir(path), 0o755)
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (NODEAGENT_UPDATE_GOLDEN=1 writes it)", err)
			}
			if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); diff != "" {
				t.Errorf("output differs from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

func exitOf(err error) string {
	if err == nil {
		return "exit 0"
	}
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		return fmt.Sprintf("exit %d", ee.ExitCode())
	}
	return err.Error()
}

// normalizeGolden replaces what differs from run to run: the test's
// directory and the interface indexes the kernel hands out.
func normalizeGolden(s, dir string) string {
	s = strings.ReplaceAll(s, dir, "DIR")
	return regexp.MustCompile(`index \d+`).ReplaceAllString(s, "index N")
}
