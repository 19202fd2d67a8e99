package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// running is a daemon running in a test namespace.
type running struct {
	d      *Daemon
	cancel context.CancelFunc
	done   chan error
	log    *testenv.SyncBuffer
	socket string
}

// startDaemon runs the daemon on cfg inside ns until the test ends, and
// waits for its first full convergence.
func startDaemon(t testing.TB, ns *testenv.NetNS, cfg string, tweak func(*RunOptions)) *running {
	t.Helper()
	return launch(t, ns, cfg, tweak, nil)
}

// launch is startDaemon with hooks, which may set the daemon's test
// hooks before it runs.
func launch(t testing.TB, ns *testenv.NetNS, cfg string, tweak func(*RunOptions), hooks func(*Daemon)) *running {
	t.Helper()
	return launchUntil(t, ns, cfg, tweak, hooks, "first convergence", func(s api.Status) bool { return s.Ready })
}

// launchUntil is launch that waits for until (named what) instead of
// readiness.
func launchUntil(t testing.TB, ns *testenv.NetNS, cfg string, tweak func(*RunOptions), hooks func(*Daemon), what string, until func(api.Status) bool) *running {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	r := &running{log: &testenv.SyncBuffer{}, done: make(chan error, 1), socket: filepath.Join(dir, "nodeagent.sock")}
	o := RunOptions{
		Options: Options{Config: cfg, TablesFile: filepath.Join(dir, "rt_tables.conf")},
		Socket:  r.socket, SocketGroup: "nogroup", Host: ns.Host, Version: "test",
		Log: slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&o)
	}
	d, err := NewDaemon(o)
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	r.d = d
	if hooks != nil {
		hooks(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("daemon log:\n%s", r.log.String())
		}
	})
	waitFor(t, what, 60*time.Second, func() bool { return until(d.Status()) })
	return r
}

func (r *running) stop(t testing.TB) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("daemon: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("daemon did not stop within 30s")
	}
}

func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func uniqueName(prefix string) string {
	var b [3]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// lab is a node with a trunk (a veth to a peer namespace) and a config
// using every subsystem: a macvlan shim with an address, a kill-switch
// table with a route and a rule, a masquerade, and a WireGuard server with
// one peer (userspace on a kernel without WireGuard, the kernel's in the
// VM), and a VLAN where the kernel has 8021q.
type lab struct {
	node, peer *testenv.NetNS
	cfg        string
	wg         string
	peerKey    wgtypes.Key
	secret     string // the device's private key, which must never be printed
	vlan       bool
}

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{node: testenv.NewNetNS(t), peer: testenv.NewNetNS(t), wg: uniqueName("wgd")}
	l.node.Veth(t, "enp1s0", l.peer, "eth0")
	dir := t.TempDir()
	k, _ := wgtypes.GeneratePrivateKey()
	pk, _ := wgtypes.GeneratePrivateKey()
	l.peerKey = pk.PublicKey()
	l.secret = k.String()
	key := filepath.Join(dir, "wg.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
	l.vlan = testenv.HasModule("8021q")
	vlans := ""
	if l.vlan {
		vlans = "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.51.1/24]}\n"
	}
	l.cfg = filepath.Join(dir, "nodeagent.yaml")
	l.write(t, fmt.Sprintf(`dad: {disabled: true}
%smacvlans:
  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}
wireguard:
  - name: %s
    privateKeyFile: %s
    listenPort: 51820
    addresses: [10.90.0.1/24]
    peers:
      - {name: laptop, publicKey: %s, allowedIPs: [10.90.0.2/32]}
routing:
  tables:
    - id: 150
      killSwitch: true
      routes: [{to: 10.70.0.0/24, dev: shim0}]
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  masquerade: [{from: 10.10.50.0/24, out: enp1s0}]
checks:
  gatewayARP: false
`, vlans, l.wg, key, l.peerKey))
	return l
}

func (l *lab) write(t *testing.T, s string) {
	t.Helper()
	tmp := l.cfg + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Rename(tmp, l.cfg) // as editors and config management do
}

func has(out, s string) bool { return strings.Contains(out, s) }

// TestDriftRepairedFromEvents deletes owned objects by hand, 20 times per
// kind, and measures how long the daemon takes to put each back. Links,
// addresses, routes, rules and nftables are repaired on the kernel's own
// notification; WireGuard peers, which the kernel sends none for, on the
// daemon's poll. The median of each kind is reported (target < 1s).
func TestDriftRepairedFromEvents(t *testing.T) {
	l := newLab(t)
	// 20 deletions of one object in a row are timed, not a fight.
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = time.Hour; o.FightBound = 1000 })
	n := l.node
	nftHandle := func() string {
		m := regexp.MustCompile(`masquerade # handle (\d+)`).FindStringSubmatch(n.Exec(t, "nft", "-a", "list", "chain", "inet", "nodeagent", "postrouting"))
		if m == nil {
			t.Fatal("no masquerade rule")
		}
		return m[1]
	}
	kinds := []struct {
		name    string
		del     func()
		present func() bool
	}{
		{"rule", func() { n.Exec(t, "ip", "rule", "del", "priority", "1000") },
			func() bool {
				out, _ := n.TryExec("ip", "rule", "show", "priority", "1000")
				return has(out, "lookup 150")
			}},
		{"route", func() { n.Exec(t, "ip", "route", "del", "10.70.0.0/24", "table", "150") },
			func() bool {
				out, _ := n.TryExec("ip", "route", "show", "table", "150")
				return has(out, "10.70.0.0/24 dev shim0")
			}},
		{"nft rule", func() { n.Exec(t, "nft", "delete", "rule", "inet", "nodeagent", "postrouting", "handle", nftHandle()) },
			func() bool {
				out, _ := n.TryExec("nft", "list", "chain", "inet", "nodeagent", "postrouting")
				return has(out, "masquerade")
			}},
		{"address", func() { n.Exec(t, "ip", "addr", "del", "10.10.50.3/24", "dev", "shim0") },
			func() bool {
				out, _ := n.TryExec("ip", "-br", "addr", "show", "dev", "shim0")
				return has(out, "10.10.50.3/24")
			}},
		{"macvlan", func() { n.Exec(t, "ip", "link", "del", "shim0") },
			func() bool {
				out, _ := n.TryExec("ip", "-br", "addr", "show", "dev", "shim0")
				return has(out, "10.10.50.3/24")
			}},
		{"wireguard peer", func() { n.Exec(t, "wg", "set", l.wg, "peer", l.peerKey.String(), "remove") },
			func() bool { out, _ := n.TryExec("wg", "show", l.wg, "peers"); return has(out, l.peerKey.String()) }},
	}
	if l.vlan {
		kinds = append(kinds, struct {
			name    string
			del     func()
			present func() bool
		}{"vlan", func() { n.Exec(t, "ip", "link", "del", "enp1s0.50") },
			func() bool {
				out, _ := n.TryExec("ip", "-br", "addr", "show", "dev", "enp1s0.50")
				return has(out, "10.10.51.1/24")
			}})
	} else {
		t.Log("kernel has no 8021q: the VLAN kind runs in the VM tier")
	}
	// The repairs are counted by kind in the metrics: each trial of a kind
	// is one repair of that kind (a rule is not a route; the nftables table
	// is one object however many of its lines a repair rewrites).
	repairs := func() map[string]float64 {
		mfs, err := r.d.Metrics().Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "nodeagent_drift_repairs_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					out[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
		return out
	}
	exact := map[string]map[string]float64{
		"rule":     {"rule": 1, "route": 0},
		"nft rule": {"nftables": 1, "rule": 0},
		"route":    {"route": 1, "rule": 0},
	}
	const trials = 20
	var report []string
	for _, k := range kinds {
		before := repairs()
		var lat []time.Duration
		for i := 0; i < trials; i++ {
			if !k.present() {
				t.Fatalf("%s: not present before trial %d", k.name, i)
			}
			k.del()
			lat = append(lat, waitFor(t, k.name+" restored", 20*time.Second, k.present))
			// Let the repair's own echo (the events of what it wrote) pass.
			time.Sleep(150 * time.Millisecond)
		}
		after := repairs()
		for kind, per := range exact[k.name] {
			if got := after[kind] - before[kind]; got != per*trials {
				t.Errorf("%d %s trials: nodeagent_drift_repairs_total{kind=%q} rose by %v, want %v", trials, k.name, kind, got, per*trials)
			}
		}
		slices.Sort(lat)
		report = append(report, fmt.Sprintf("%-15s median %6.0f ms  max %6.0f ms  (%d trials)", k.name, ms(lat[len(lat)/2]), ms(lat[len(lat)-1]), trials))
	}
	t.Logf("drift repair, delete -> restored:\n%s", strings.Join(report, "\n"))
	s := r.d.Status()
	if !s.Ready || s.Degraded || s.LastSync == nil || s.LastSync.Trigger == "resync" {
		t.Errorf("status after the trials: ready %v degraded %v last sync %+v", s.Ready, s.Degraded, s.LastSync)
	}
	if !has(r.log.String(), "drift repaired") {
		t.Error("the log does not show the repairs")
	}
	// Keys never reach the log, the status or the metrics.
	st, _ := json.Marshal(r.d.Status())
	var scrape strings.Builder
	mfsAll, _ := r.d.Metrics().Registry.Gather()
	for _, mf := range mfsAll {
		scrape.WriteString(mf.String())
	}
	for what, text := range map[string]string{"log": r.log.String(), "status": string(st), "metrics": scrape.String()} {
		if has(text, l.secret) {
			t.Errorf("the WireGuard private key appears in the daemon's %s", what)
		}
	}
	// Every kind was repaired at least once per trial; the start-up sync
	// brought the config in and counts as none.
	total := repairs()
	for _, kind := range []string{"link", "address", "route", "rule", "nftables", "wireguard_peer"} {
		if total[kind] < trials {
			t.Errorf("nodeagent_drift_repairs_total{kind=%q} = %v, want >= %d", kind, total[kind], trials)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// kernelState dumps what nodeagent manages in ns, for before/after
// comparisons (the tools' own formatting, not the code under test).
func kernelState(t *testing.T, ns *testenv.NetNS) string {
	t.Helper()
	var b strings.Builder
	for _, c := range [][]string{
		{"ip", "-d", "link", "show"}, {"ip", "addr", "show"}, {"ip", "rule", "show"},
		{"ip", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"}, {"nft", "list", "ruleset"},
	} {
		b.WriteString(ns.Exec(t, c...))
	}
	// Counters and what the kernel does by itself (IPv6 link-local
	// addresses finishing DAD, their local routes, the operational state
	// linkwatch settles) are not configuration.
	var out []string
	for _, line := range strings.Split(b.String(), "\n") {
		line = strings.TrimSpace(strings.ReplaceAll(line, " tentative", ""))
		// ip(8) names a veth's peer namespace by walking /run/netns; a
		// namespace another test package deletes meanwhile makes it print
		// this instead. Neither is this namespace's configuration.
		if line == "" || strings.Contains(line, "fe80::") || line == "Error: Peer netns reference is invalid." {
			continue
		}
		line = regexp.MustCompile(` link-netns \S+`).ReplaceAllString(line, "")
		line = regexp.MustCompile(`packets \d+ bytes \d+`).ReplaceAllString(line, "counter")
		out = append(out, regexp.MustCompile(` state (UP|DOWN|UNKNOWN|LOWERLAYERDOWN) `).ReplaceAllString(line, " state * "))
	}
	return strings.Join(out, "\n")
}

// TestBrokenReloadIsRejectedWhole: a config edit that does not validate
// changes nothing in the kernel (dump compared), status names file:line,
// and the fixed edit is applied.
func TestBrokenReloadIsRejectedWhole(t *testing.T) {
	l := newLab(t)
	r := startDaemon(t, l.node, l.cfg, nil)
	good, _ := os.ReadFile(l.cfg)
	before := kernelState(t, l.node)
	hash := r.d.Status().ConfigHash
	broken := strings.Replace(string(good), "{priority: 1000, from: 10.10.50.0/24, table: 150}", "{priority: 1000, from: 10.10.50.0/33, table: 150}", 1)
	broken = strings.Replace(broken, "addresses: [10.10.50.3/24]", "addresses: [10.10.50.4/24]", 1) // a valid change in the same edit
	l.write(t, broken)
	waitFor(t, "the rejection", 10*time.Second, func() bool { return r.d.Status().LastRejected != nil })
	time.Sleep(300 * time.Millisecond)
	s := r.d.Status()
	if got := strings.Join(s.LastRejected.Errors, "\n"); !has(got, l.cfg+":") || !has(got, "routing.rules[0].from") {
		t.Errorf("rejection names %q; want file:line and the field", got)
	}
	if c := s.Condition(api.CondConfigLoaded); c == nil || c.Status != api.False || c.Reason != "Rejected" {
		t.Errorf("ConfigLoaded = %+v", c)
	}
	if s.ConfigHash != hash || !s.Degraded {
		t.Errorf("running config %s (want %s), degraded %v", s.ConfigHash, hash, s.Degraded)
	}
	if after := kernelState(t, l.node); after != before {
		t.Errorf("the kernel changed on a rejected reload:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	fixed := strings.Replace(broken, "10.10.50.0/33", "10.10.50.0/24", 1)
	l.write(t, fixed)
	waitFor(t, "the fixed config", 10*time.Second, func() bool {
		out, _ := l.node.TryExec("ip", "-br", "addr", "show", "dev", "shim0")
		return has(out, "10.10.50.4/24") && !has(out, "10.10.50.3/24")
	})
	waitFor(t, "ConfigLoaded", 5*time.Second, func() bool {
		s := r.d.Status()
		c := s.Condition(api.CondConfigLoaded)
		return c != nil && c.Status == api.True && !s.Degraded
	})
}

// TestSafeApplyRollsBack: with the API server reachable, a config that
// blackholes the route to it is applied, the probe fails, and the daemon
// rolls back to the previous state and does not retry that config.
func TestSafeApplyRollsBack(t *testing.T) {
	l := newLab(t)
	run := func(ns *testenv.NetNS, lines ...string) {
		for _, s := range lines {
			ns.Exec(t, strings.Fields(s)...)
		}
	}
	run(l.node, "ip addr add 192.0.2.1/24 dev enp1s0")
	run(l.peer, "ip addr add 192.0.2.10/24 dev eth0")
	// An "API server" in the peer namespace: a TCP listener.
	stopListen := listenIn(t, l.peer, "192.0.2.10:6443")
	defer stopListen()
	good, _ := os.ReadFile(l.cfg)
	withProbe := strings.Replace(string(good), "checks:\n  gatewayARP: false\n", "checks:\n  gatewayARP: false\n  apiServer: 192.0.2.10:6443\n  probeDeadline: 1s\n", 1)
	l.write(t, withProbe)
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = 2 * time.Second })
	// Wait for a sync that records the config as good (the first sync has
	// no previous state to roll back to).
	l.write(t, strings.Replace(withProbe, "addresses: [10.10.50.3/24]", "addresses: [10.10.50.3/24, 10.10.50.5/24]", 1))
	waitFor(t, "second config", 10*time.Second, func() bool {
		out, _ := l.node.TryExec("ip", "-br", "addr", "show", "dev", "shim0")
		return has(out, "10.10.50.5/24")
	})
	time.Sleep(300 * time.Millisecond)
	before := kernelState(t, l.node)
	bad := strings.Replace(strings.Replace(withProbe, "addresses: [10.10.50.3/24]", "addresses: [10.10.50.3/24, 10.10.50.5/24]", 1),
		"  rules:\n", "  rules:\n    - {priority: 100, to: 192.0.2.10/32, action: blackhole}\n", 1)
	l.write(t, bad)
	waitFor(t, "the rollback", 20*time.Second, func() bool { return r.d.Status().LastRollback != nil })
	s := r.d.Status()
	if s.LastRollback.Probe != "apiServer 192.0.2.10:6443" {
		t.Errorf("rollback names probe %q", s.LastRollback.Probe)
	}
	if c := s.Condition(api.CondSafeApply); c == nil || c.Status != api.False || c.Reason != "RolledBack" {
		t.Errorf("SafeApply = %+v", c)
	}
	if after := kernelState(t, l.node); after != before {
		t.Errorf("the kernel is not back to the previous state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Not retried: resyncs come and go, the blackhole stays out.
	syncs := s.LastSync.Count
	waitFor(t, "a resync after the rollback", 20*time.Second, func() bool {
		ls := r.d.Status().LastSync
		return ls.Count > syncs && ls.Trigger == "resync"
	})
	if out := l.node.Exec(t, "ip", "rule", "show", "priority", "100"); has(out, "blackhole") {
		t.Errorf("the rolled-back config was retried: %s", out)
	}
}

// listenIn serves TCP on addr inside ns, accepting and closing, until the
// returned func is called.
func listenIn(t *testing.T, ns *testenv.NetNS, addr string) func() {
	t.Helper()
	var l net.Listener
	if err := ns.Host.Do(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return func() { l.Close() }
}

// notifyListener is a NOTIFY_SOCKET: it records each datagram with the
// time it arrived.
type notifyListener struct {
	mu   sync.Mutex
	msgs []notifyMsg
}

type notifyMsg struct {
	at   time.Time
	text string
}

func listenNotify(t *testing.T) *notifyListener {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	n := &notifyListener{}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, notifyMsg{time.Now(), string(buf[:k])})
			n.mu.Unlock()
		}
	}()
	return n
}

func (n *notifyListener) all() []notifyMsg {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]notifyMsg(nil), n.msgs...)
}

// TestSdNotify: READY=1 comes only after the first convergence (the
// kernel has every object when it arrives), WATCHDOG=1 comes from the loop
// while it runs, and none comes while the loop is wedged.
func TestSdNotify(t *testing.T) {
	l := newLab(t)
	n := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "400000") // pings every 200ms
	readyCh := make(chan string, 1)
	go func() {
		for {
			for _, m := range n.all() {
				if has(m.text, "READY=1") {
					out, _ := l.node.TryExec("ip", "-br", "addr", "show", "dev", "shim0")
					readyCh <- out
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	r := startDaemon(t, l.node, l.cfg, nil)
	var readyState string
	select {
	case readyState = <-readyCh:
	case <-time.After(10 * time.Second):
		t.Fatal("no READY=1 within 10s")
	}
	if !has(readyState, "10.10.50.3/24") {
		t.Errorf("READY=1 came before the config was applied: shim0 was %q", readyState)
	}
	for _, m := range n.all() {
		if has(m.text, "READY=1") {
			break
		}
		if has(m.text, "WATCHDOG") {
			continue
		}
		t.Errorf("before READY=1: %q", m.text)
	}
	time.Sleep(time.Second)
	stallAt := time.Now()
	r.d.stall <- 2 * time.Second
	time.Sleep(3 * time.Second)
	var before, during, after int
	for _, m := range n.all() {
		if m.text != "WATCHDOG=1" {
			continue
		}
		switch {
		case m.at.Before(stallAt):
			before++
		case m.at.Before(stallAt.Add(1900 * time.Millisecond)):
			if m.at.After(stallAt.Add(100 * time.Millisecond)) { // one may be in flight as the stall starts
				during++
			}
		default:
			after++
		}
	}
	t.Logf("WATCHDOG=1 pings: %d before the stall, %d during it, %d after", before, during, after)
	if before < 3 || during != 0 || after < 2 {
		t.Errorf("watchdog pings %d before, %d during the 2s stall, %d after; want >= 3, 0, >= 2", before, during, after)
	}
	var status bool
	for _, m := range n.all() {
		if strings.HasPrefix(m.text, "STATUS=") || has(m.text, "\nSTATUS=ready") {
			status = true
		}
	}
	if !status {
		t.Error("no STATUS= line was sent")
	}
	r.stop(t)
	// The datagram is sent before Run returns; the test's reader may take
	// a moment to have it.
	last := func() string { msgs := n.all(); return msgs[len(msgs)-1].text }
	deadline := time.Now().Add(2 * time.Second)
	for !has(last(), "STOPPING=1") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !has(last(), "STOPPING=1") {
		t.Errorf("last message %q, want STOPPING=1", last())
	}
}

// TestARPReachableCondition: checks.arpReachable addresses are resolved by
// ARP at start and every resync, and reported as the ARPReachable
// condition, which degrades the node while one does not answer.
func TestARPReachableCondition(t *testing.T) {
	l := newLab(t)
	l.node.Exec(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "enp1s0")
	l.peer.Exec(t, "ip", "addr", "add", "192.0.2.20/24", "dev", "eth0")
	good, _ := os.ReadFile(l.cfg)
	l.write(t, strings.Replace(string(good), "checks:\n", "checks:\n  arpReachable: [192.0.2.20, 192.0.2.21]\n", 1))
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = time.Second })
	cond := func() *api.Condition { s := r.d.Status(); return s.Condition(api.CondARPReachable) }
	waitFor(t, "ARPReachable=False", 10*time.Second, func() bool { c := cond(); return c != nil && c.Status == api.False })
	if c := cond(); !has(c.Message, "192.0.2.21") || has(c.Message, "192.0.2.20 ") {
		t.Errorf("ARPReachable message %q: want only 192.0.2.21 named", c.Message)
	}
	if s := r.d.Status(); !s.Degraded {
		t.Error("a failing ARP check does not degrade the node")
	}
	l.peer.Exec(t, "ip", "addr", "add", "192.0.2.21/24", "dev", "eth0")
	waitFor(t, "ARPReachable=True", 15*time.Second, func() bool { c := cond(); return c != nil && c.Status == api.True })
}

// TestLabelsNeverBlockNetworking runs the daemon with Node labels while
// the API server is down: networking converges and the daemon is ready,
// LabelsSynced is False (Unreachable); once a real API server (Node,RBAC,
// NodeRestriction) is up and the kubelet has registered the Node, the
// labels arrive, applied with the node's own identity.
func TestLabelsNeverBlockNetworking(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no etcd or kube-apiserver")
	}
	kubetest.Require(t)
	srv, err := kubetest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	l := newLab(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubelet.kubeconfig")
	if err := srv.WriteNodeKubeconfig(kubeconfig, "node-a"); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(l.cfg)
	l.write(t, "node: {name: node-a}\n"+string(good)+fmt.Sprintf(`kubernetes:
  kubeconfig: %s
  hold: 0s
  labels: {homelab.example/vpn-ingress: "true"}
  conditionalLabels:
    - {key: homelab.example/converged, value: "true", when: converged}
`, kubeconfig))
	r := startDaemon(t, l.node, l.cfg, nil) // returns once networking converged
	waitFor(t, "LabelsSynced=False", 20*time.Second, func() bool {
		s := r.d.Status()
		c := s.Condition(api.CondLabelsSynced)
		return c != nil && c.Status == api.False && c.Reason == "Unreachable"
	})
	if s := r.d.Status(); !s.Ready || s.Degraded {
		t.Errorf("with the API server down: ready %v, degraded %v; want ready and not degraded", s.Ready, s.Degraded)
	}
	if out := l.node.Exec(t, "ip", "-br", "addr", "show", "dev", "shim0"); !has(out, "10.10.50.3/24") {
		t.Errorf("networking did not converge while the API server was down: %s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := srv.Start(ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
	if err := srv.CreateNode(ctx, "node-a", nil); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	waitFor(t, "the labels on node-a", 90*time.Second, func() bool {
		n, err := srv.Admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		return err == nil && n.Labels["homelab.example/vpn-ingress"] == "true" && n.Labels["homelab.example/converged"] == "true"
	})
	t.Logf("labels arrived %s after the API server and the Node were up", time.Since(started).Round(10*time.Millisecond))
	waitFor(t, "LabelsSynced=True", 20*time.Second, func() bool {
		s := r.d.Status()
		c := s.Condition(api.CondLabelsSynced)
		return c != nil && c.Status == api.True
	})
}
