package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestStatusJSONGolden: `nodeagentctl status -o json` of a daemon that
// converged a node with every subsystem (a macvlan shim, routing, the
// nftables kill switch and masquerade, sysctls, a WireGuard server with a
// register holding a good and a bad peer file) is exactly
// testdata/golden/status.json, once what changes from run to run (times,
// durations, counts, the directory) is masked. NODEAGENT_UPDATE_GOLDEN=1
// rewrites it.
func TestStatusJSONGolden(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this")
	}
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "enp1s0", peer, "eth0")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "wg.key"), []byte("GNFhAMkQuzpt7H0/Ne2OyeS2qB1u4mgpo0R0CsD8mXU=\n"), 0o600)
	os.Mkdir(filepath.Join(dir, "peers.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "peers.d", "alice.yaml"), []byte("publicKey: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\nallowedIPs: [10.90.0.2/32]\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "peers.d", "typo.yaml"), []byte("publicKey: TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0=\nallowedIPs: [10.90.0.300/32]\n"), 0o600)
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(`node: {name: golden}
dad: {disabled: true}
sysctls: {net.ipv4.ip_forward: "1"}
macvlans:
  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}
wireguard:
  - name: wgstat0
    implementation: userspace
    privateKeyFile: `+filepath.Join(dir, "wg.key")+`
    listenPort: 51820
    addresses: [10.90.0.1/24]
    peersDir: `+filepath.Join(dir, "peers.d")+`
routing:
  tables:
    - {id: 150, killSwitch: true, routes: [{to: 10.70.0.0/24, dev: shim0}]}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  masquerade: [{from: 10.10.50.0/24, out: enp1s0}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [enp1s0]}]
checks: {gatewayARP: false}
`), 0o600)
	socket := filepath.Join(dir, "nodeagent.sock")
	d, _ := testDaemon(t, node, cfg, socket, "golden")
	ctl := ctlAt(socket)
	if code, out := ctl("wait", "--for=ready", "--timeout=30s"); code != 0 {
		t.Fatalf("wait: exit %d\n%s", code, out)
	}
	// The status after a quiet sync (the one that made the changes has
	// counts that depend on timing: a kernel event may split it).
	d.Reload(context.Background())
	time.Sleep(300 * time.Millisecond)
	code, out := ctl("status", "-o", "json")
	var st api.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status -o json (exit %d): %v\n%s", code, err, out)
	}
	got := normalizeStatus(t, out, dir)
	path := filepath.Join("testdata", "golden", "status.json")
	if os.Getenv("NODEAGENT_UPDATE_GOLDEN") == "1" {
		os.MkdirAll(filepath.Dir(path), 0o755)
		os.WriteFile(path, []byte(got), 0o644)
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (NODEAGENT_UPDATE_GOLDEN=1 writes it)", err)
	}
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("status -o json differs from %s (-want +got):\n%s", path, diff)
	}
}

// normalizeStatus masks what changes from run to run.
func normalizeStatus(t *testing.T, s, dir string) string {
	t.Helper()
	s = strings.ReplaceAll(s, dir, "DIR")
	for _, re := range []struct{ pat, repl string }{
		{`"(time|started|lastTransitionTime|lastHandshake)": "[^"]*"`, `"$1": "T"`},
		{`"(durationMs|count|changes|rxBytes|txBytes)": [0-9.e+-]+`, `"$1": 0`},
		{`"(handshakeAgeSeconds)": -?[0-9]+`, `"$1": 0`},
		{`"trigger": "[a-z]+"`, `"trigger": "X"`},
		{`"configHash": "[0-9a-f]+"`, `"configHash": "H"`},
		{`config [0-9a-f]{16}`, `config H`},
		{`(last sync [^;"]*)`, `last sync X`},
	} {
		s = regexp.MustCompile(re.pat).ReplaceAllString(s, re.repl)
	}
	return s
}
