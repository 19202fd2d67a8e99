package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestPeerViaPIA is issue 43's acceptance 5 against the PIA stub: a
// client added with --full-tunnel --via the PIA device reaches the stub's
// internet as the stub's exit address; with the tunnel down it reaches
// nothing outside (0 packets from it at the WAN) while it still reaches
// the LAN behind the node; and the VLAN's kill switch and forwarded port
// are as they were before wg0 and its clients came.
func TestPeerViaPIA(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this")
	}
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.PIA = "      portForward: {enabled: true, to: 10.10.50.20}\n"
	l.WriteConfig(t, "stub_ams")
	cl := &clientLab{node: l.Node, client: testenv.NewNetNS(t), lan: testenv.NewNetNS(t)}
	for _, tool := range []string{"wg-quick"} {
		if _, err := os.Stat("/usr/bin/" + tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	cl.wgGo = wireguardGo(t)
	l.Node.Veth(t, "remote", cl.client, "eth0")
	l.Node.Veth(t, "enp1s0", cl.lan, "eth0")
	cl.client.Exec(t, "ip", "addr", "add", "198.51.100.50/24", "dev", "eth0")
	l.Node.Exec(t, "ip", "addr", "add", "198.51.100.1/24", "dev", "remote")
	l.Node.Exec(t, "ip", "addr", "add", "192.168.2.10/24", "dev", "enp1s0")
	cl.lan.Exec(t, "ip", "addr", "add", "192.168.2.20/24", "dev", "eth0")
	// Anything from wg0's clients seen at the WAN left outside the tunnel.
	l.WAN.Exec(t, "nft", "add", "rule", "inet", "leak", "pre", "ip", "saddr", "10.90.0.0/24", "counter", "comment", `"clients"`)

	var d *agent.Daemon
	d, cl.socket = runPIADaemon(t, l)
	cl.ctl = ctlAt(cl.socket)
	tunnel := func() api.PIATunnel {
		for _, p := range d.Status().PIA {
			return p
		}
		return api.PIATunnel{}
	}
	waitUntil(t, "the tunnel healthy with a forwarded port", 60*time.Second, func() bool { return tunnel().Healthy && tunnel().ForwardedPort != 0 })
	port := tunnel().ForwardedPort
	vlan := func() string {
		var keep []string
		for _, line := range strings.Split(l.Node.Exec(t, "nft", "list", "table", "inet", "nodeagent"), "\n") {
			if strings.Contains(line, "@ks_"+l.Dev+"_v") || strings.Contains(line, "dnat") {
				keep = append(keep, strings.TrimSpace(line))
			}
		}
		for _, set := range []string{"_out", "_v4"} {
			keep = append(keep, l.Node.Exec(t, "nft", "list", "set", "inet", "nodeagent", "ks_"+l.Dev+set))
		}
		return strings.Join(keep, "\n")
	}
	waitUntil(t, "the forwarded port's DNAT", 20*time.Second, func() bool { return strings.Contains(vlan(), "dnat") })
	before := vlan()
	if !strings.Contains(before, "dnat") || !strings.Contains(before, "10.10.50.0/24") {
		t.Fatalf("the VLAN's kill switch and forwarded port in nft:\n%s", before)
	}

	// wg0 and its clients, the pool routed as the VLAN is.
	key, _ := wgtypes.GeneratePrivateKey()
	keyFile := filepath.Join(l.Dir, "wg0.key")
	os.WriteFile(keyFile, []byte(key.String()+"\n"), 0o600)
	wg0 := "wgs" + strings.TrimPrefix(l.Node.Name, "na-test-")[:6]
	cfg, _ := os.ReadFile(l.Config)
	text := string(cfg)
	for _, r := range []struct{ old, new string }{
		{"wireguard:\n", fmt.Sprintf(`wireguard:
  - name: %s
    implementation: userspace
    privateKeyFile: %s
    listenPort: 51820
    addresses: [10.90.0.1/24]
    peersDir: %s
    clients:
      endpoint: 198.51.100.1:51820
      allowedIPs: [10.90.0.0/24, 192.168.2.0/24]
      egress: [{via: %s, pool: 10.90.0.128/25}]
`, wg0, keyFile, filepath.Join(l.Dir, "peers.d"), l.Dev)},
		{"        - {to: 10.10.50.0/24, dev: vlan50}\n", "        - {to: 10.10.50.0/24, dev: vlan50}\n        - {to: 192.168.2.0/24, dev: enp1s0}\n"},
		{"  rules:\n", "  rules:\n    - {priority: 1002, from: 10.90.0.128/25, table: 150}\n"},
		{"  masquerade:\n", fmt.Sprintf("  masquerade:\n    - {from: 10.90.0.0/24, out: enp1s0}\n    - {from: 10.90.0.128/25, out: %s}\n", l.Dev)},
		{"  killSwitch:\n", fmt.Sprintf("  killSwitch:\n    - {from: 10.90.0.128/25, allowOut: [%s], allowTo: [192.168.2.0/24]}\n", l.Dev)},
	} {
		if !strings.Contains(text, r.old) {
			t.Fatalf("the lab's config has no %q:\n%s", r.old, text)
		}
		text = strings.Replace(text, r.old, r.new, 1)
	}
	os.WriteFile(l.Config, []byte(text), 0o644)
	if code, out := cl.ctl("reload"); code != 0 {
		t.Fatalf("reload: %s\n%s", out, text)
	}
	waitUntil(t, "wg0 up", 20*time.Second, func() bool {
		_, err := l.Node.TryExec("wg", "show", wg0)
		return err == nil && tunnel().Healthy
	})

	code, out := cl.ctl("peer", "add", "laptop", "--full-tunnel", "--via", l.Dev)
	if code != 0 {
		t.Fatalf("peer add --full-tunnel --via: %s", out)
	}
	if !strings.Contains(out, "Address = 10.90.0.128/32\n") || !strings.Contains(out, "AllowedIPs = 0.0.0.0/0, ::/0\n") {
		t.Fatalf("the client's config:\n%s", privateKeyRE.ReplaceAllString(out, "PrivateKey = (not shown)"))
	}
	conf := out[:strings.Index(out, "PersistentKeepalive = 25\n")+len("PersistentKeepalive = 25\n")]
	cl.up(t, cl.client, "wgc"+strings.TrimPrefix(cl.client.Name, "na-test-")[:6], conf)

	exit0, other0 := l.FarSaw(t)
	cl.client.Exec(t, "ping", "-c", "3", "-i", "0.2", "-W", "3", piastub.Far.String())
	exit1, other1 := l.FarSaw(t)
	cl.client.Exec(t, "ping", "-c", "2", "-i", "0.2", "-W", "3", "192.168.2.20")
	t.Logf("the far side saw %d packets from the stub's exit address %s and %d from others while the client pinged it", exit1-exit0, piastub.Exit, other1-other0)
	if exit1-exit0 < 3 || other1 != other0 {
		t.Errorf("the far side saw %d from the exit address, %d from others", exit1-exit0, other1-other0)
	}

	// wg0's clients changed nothing of the VLAN's.
	if after := vlan(); after != before || tunnel().ForwardedPort != port {
		t.Errorf("the VLAN's kill switch or forwarded port changed with wg0's clients (port %d, now %d):\nbefore:\n%s\nafter:\n%s", port, tunnel().ForwardedPort, before, after)
	}
	if !l.PingFar() {
		t.Error("the VLAN no longer reaches the far side")
	}

	// The tunnel down: every server answers nothing.
	for _, s := range l.Stub.Servers {
		s.Down()
	}
	waitUntil(t, "the tunnel unhealthy", 60*time.Second, func() bool { return !tunnel().Healthy })
	leak0 := piastub.Count(t, l.WAN, "leak", "pre", "clients")
	_, _, plain0 := l.Leaks(t)
	exit0, other0 = l.FarSaw(t)
	if _, err := cl.client.TryExec("ping", "-c", "5", "-i", "0.2", "-W", "1", piastub.Far.String()); err == nil {
		t.Error("the client reached the far side with the tunnel down")
	}
	if _, err := cl.client.TryExec("curl", "-s", "-m", "2", "http://"+piastub.Far.String()+"/"); err == nil {
		t.Error("the client reached the far side over TCP with the tunnel down")
	}
	cl.client.Exec(t, "ping", "-c", "3", "-i", "0.2", "-W", "3", "192.168.2.20")
	leak1 := piastub.Count(t, l.WAN, "leak", "pre", "clients")
	_, _, plain1 := l.Leaks(t)
	exit1, other1 = l.FarSaw(t)
	t.Logf("tunnel down: the LAN answered the client; at the WAN %d packets from the clients' addresses and %d plaintext to the far side; the far side saw %d", leak1-leak0, plain1-plain0, exit1-exit0+other1-other0)
	if leak1 != 0 || plain1 != plain0 || exit1 != exit0 || other1 != other0 {
		t.Errorf("with the tunnel down: %d packets from the clients at the WAN (all along), %d plaintext to the far side, far side %d", leak1, plain1-plain0, exit1-exit0+other1-other0)
	}
	for _, s := range l.Stub.Servers {
		s.Up()
	}
	waitUntil(t, "the tunnel healthy again", 60*time.Second, func() bool { return tunnel().Healthy && tunnel().ForwardedPort != 0 })
	cl.client.Exec(t, "ping", "-c", "2", "-i", "0.2", "-W", "3", piastub.Far.String())

	l.NoLeaks(t, "the whole test")
}

func waitUntil(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runPIADaemon runs the daemon on l's node, its socket (returned), port
// files and routing tables' names in a directory of the test's, with
// PIA's timers shortened.
func runPIADaemon(t *testing.T, l *piastub.Lab) (*agent.Daemon, string) {
	run := t.TempDir()
	os.Chmod(run, 0o755)
	socket := filepath.Join(run, "nodeagent.sock")
	d, _ := runDaemon(t, agent.RunOptions{
		Options: agent.Options{Config: l.Config, TablesFile: filepath.Join(run, "rt.conf"), StateDir: l.StateDir, PortDir: filepath.Join(run, "pia")},
		Socket:  socket, SocketGroup: "nogroup", Host: l.Node.Host, Resync: time.Hour,
		PIATimers: pia.Timers{HandshakeWait: 4 * time.Second, BackoffMin: 300 * time.Millisecond, BackoffMax: 3 * time.Second},
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hazards:   hazard.Paths{Root: t.TempDir()},
	})
	return d, socket
}
