package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// objects counts the lab's objects in the kernel: the nft table with its
// masquerade, shim0 with its address, the WireGuard device, the kill-switch
// table's route and its unreachable default, and rule 1000.
func (l *lab) objects(t *testing.T) map[string]bool {
	t.Helper()
	n := l.node
	out := func(args ...string) string {
		o, err := n.TryExec(args...)
		if err != nil {
			return "" // ip(8) names a missing device in its error
		}
		return o
	}
	return map[string]bool{
		"nft masquerade":      strings.Contains(out("nft", "list", "table", "inet", "nodeagent"), "masquerade"),
		"shim0 address":       strings.Contains(out("ip", "-br", "addr", "show", "dev", "shim0"), "10.10.50.3/24"),
		"wireguard device":    strings.Contains(out("ip", "link", "show", l.wg), l.wg),
		"route table 150":     strings.Contains(out("ip", "route", "show", "table", "150"), "10.70.0.0/24 dev shim0"),
		"kill-switch default": strings.Contains(out("ip", "route", "show", "table", "150"), "unreachable default"),
		"rule 1000":           strings.Contains(out("ip", "rule", "show", "priority", "1000"), "lookup 150"),
	}
}

func (l *lab) allThere(t *testing.T, when string) {
	t.Helper()
	for what, ok := range l.objects(t) {
		if !ok {
			t.Errorf("%s: %s is gone", when, what)
		}
	}
}

// TestBadSaveNeverTearsDown is issue 30's item 1 in the running daemon.
// What a save may bring in by itself: an empty file (a truncating or failed
// write) is rejected; a file that declares nothing, or one that disarms the
// kill switch, is held, logged at WARN once, and leaves every object in
// place; a file being written is not read until its writer closes it; an
// ordinary change applies at once; and an operator's reload applies a held
// change.
func TestBadSaveNeverTearsDown(t *testing.T) {
	l := newLab(t)
	good, err := os.ReadFile(l.cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = 300 * time.Millisecond })
	l.allThere(t, "at start")
	hash := r.d.Status().ConfigHash
	loaded := func() *api.Condition { s := r.d.Status(); return s.Condition(api.CondConfigLoaded) }
	settle := func() { time.Sleep(1500 * time.Millisecond) } // the watch's event, then resyncs

	// `: > nodeagent.yaml`: truncated in place.
	if err := os.WriteFile(l.cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the empty file rejected", 10*time.Second, func() bool { c := loaded(); return c != nil && c.Reason == "Rejected" })
	if c := loaded(); !strings.Contains(c.Message, "the file is empty") {
		t.Errorf("ConfigLoaded: %+v", c)
	}
	settle()
	l.allThere(t, "after an empty save")

	// A file that declares nothing (comments only), renamed into place.
	l.write(t, "# nothing here yet\n")
	waitFor(t, "the objects-free file held", 10*time.Second, func() bool { c := loaded(); return c != nil && c.Reason == "Held" })
	if c := loaded(); !strings.Contains(c.Message, "it declares no objects") || !strings.Contains(c.Message, "nodeagentctl reload") {
		t.Errorf("ConfigLoaded: %+v", c)
	}
	settle()
	l.allThere(t, "after an objects-free save")
	if s := r.d.Status(); s.ConfigHash != hash || !s.Degraded {
		t.Errorf("held: config %s (want %s still), degraded %v (want true)", s.ConfigHash, hash, s.Degraded)
	}
	if n := strings.Count(r.log.String(), "config change held"); n != 1 {
		t.Errorf("%d WARN lines for the held change over several resyncs, want 1", n)
	}

	// The kill switch turned off, everything else as it was.
	l.write(t, strings.Replace(string(good), "killSwitch: true", "killSwitch: false", 1))
	waitFor(t, "the disarming change held", 10*time.Second, func() bool {
		c := loaded()
		return c != nil && c.Reason == "Held" && strings.Contains(c.Message, "disarms the kill switch of routing table 150")
	})
	settle()
	l.allThere(t, "after a save that disarms the kill switch")

	// Half a file, its writer still at work: not read until it closes.
	f, err := os.OpenFile(l.cfg, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	next := strings.Replace(string(good), "masquerade: [{from: 10.10.50.0/24, out: enp1s0}]", "masquerade: [{from: 10.10.50.0/24, out: enp1s0}, {from: 10.10.52.0/24, out: enp1s0}]", 1)
	half := strings.Index(next, "wireguard:")
	f.WriteString(next[:half])
	f.Sync()
	settle()
	if c := loaded(); c == nil || c.Reason != "Held" {
		t.Errorf("while the file is half written: %+v (want the last verdict, Held, kept: the half file not read)", c)
	}
	l.allThere(t, "while the file is half written")
	f.WriteString(next[half:])
	f.Close()
	waitFor(t, "the whole file loaded", 10*time.Second, func() bool { c := loaded(); return c != nil && c.Status == api.True })
	waitFor(t, "the new masquerade", 10*time.Second, func() bool {
		out, _ := l.node.TryExec("nft", "list", "table", "inet", "nodeagent")
		return strings.Contains(out, "10.10.52.0/24")
	})
	l.allThere(t, "after the whole file")

	// An operator's reload applies a held change, with a WARN line.
	l.write(t, "# nothing here yet\n")
	waitFor(t, "held again", 10*time.Second, func() bool { c := loaded(); return c != nil && c.Reason == "Held" })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res := r.d.Reload(ctx); !res.Applied {
		t.Fatalf("reload: %+v", res)
	}
	waitFor(t, "everything removed after the reload", 10*time.Second, func() bool {
		for _, ok := range l.objects(t) {
			if ok {
				return false
			}
		}
		return true
	})
	if !strings.Contains(r.log.String(), "applying a config change that takes away wholesale") {
		t.Error("no WARN line for the reload that took everything away")
	}
}

// sighup sends this process SIGHUP, as `kill -HUP` or systemd's
// ExecReload of a signalling unit would: every daemon running in it
// hears it. The test keeps a handler of its own for as long as it runs, so
// that a SIGHUP nobody else listens for never ends the test binary.
func sighup(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

func keepSIGHUP(t *testing.T) {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { signal.Stop(ch); close(done) })
}

// configHash is the daemon's name for a config file's bytes.
func configHash(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:8])
}

// reloadTiming is when an operator's reload comes, against the save.
type reloadTiming struct {
	name   string
	api    bool          // nodeagentctl reload (the API), else SIGHUP
	offset time.Duration // after the rename; negative: before it
}

var reloadTimings = []reloadTiming{
	{"SIGHUP at once", false, 0},
	{"SIGHUP 1ms after", false, time.Millisecond},
	{"SIGHUP 10ms after", false, 10 * time.Millisecond},
	{"SIGHUP 100ms after", false, 100 * time.Millisecond},
	{"SIGHUP 1s after", false, time.Second},
	{"SIGHUP 1ms before", false, -time.Millisecond},
	{"API reload at once", true, 0},
	{"API reload 1ms before", true, -time.Millisecond},
}

// saveThenReload renames body into place as the config and has an
// operator's reload come at tm, and returns when the later of the two
// happened.
func saveThenReload(t *testing.T, l *lab, r *running, body string, tm reloadTiming) time.Time {
	t.Helper()
	reload := func() {
		if !tm.api {
			sighup(t)
			return
		}
		// The API's reload answers once the loop has served it; the save
		// does not wait for that.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r.d.Reload(ctx)
		}()
	}
	if tm.offset < 0 {
		reload()
		time.Sleep(-tm.offset)
		l.write(t, body)
		return time.Now()
	}
	l.write(t, body)
	if tm.offset > 0 {
		time.Sleep(tm.offset)
	}
	reload()
	return time.Now()
}

// wholesaleCase is one save that takes away wholesale, and how to see that
// it was applied.
type wholesaleCase struct {
	name    string
	full    string
	cut     string
	applied func() bool // the cut is in force
	present func() bool // the full config is in force
}

// runWholesale drives one wholesale save against an operator's reload at
// every timing, and once with no reload at all: each reload applies the
// cut within one sync of the later of the two events; the save alone is
// held.
func runWholesale(t *testing.T, l *lab, r *running, c wholesaleCase) {
	loaded := func() *api.Condition { s := r.d.Status(); return s.Condition(api.CondConfigLoaded) }
	restore := func(what string) {
		l.write(t, c.full)
		waitFor(t, what+": the full config in force", 20*time.Second, func() bool {
			cond := loaded()
			return cond != nil && cond.Status == api.True && r.d.Status().ConfigHash == configHash(c.full) && c.present()
		})
	}
	restore(c.name + ": at start")

	// The save alone is held: a file event and resyncs never apply it.
	l.write(t, c.cut)
	waitFor(t, c.name+": the save alone held", 10*time.Second, func() bool { cond := loaded(); return cond != nil && cond.Reason == "Held" })
	time.Sleep(2 * time.Second) // several resyncs
	if !c.present() || r.d.Status().ConfigHash != configHash(c.full) {
		t.Errorf("%s: a save with no reload was applied", c.name)
	}
	if cond := loaded(); cond == nil || cond.Reason != "Held" || !strings.Contains(cond.Message, "nodeagentctl reload or SIGHUP applies it") {
		t.Errorf("%s: the held state does not say what applies it: %+v", c.name, cond)
	}

	for _, tm := range reloadTimings {
		restore(c.name + ", before " + tm.name)
		later := saveThenReload(t, l, r, c.cut, tm)
		deadline := time.Now().Add(5 * time.Second)
		for !(c.applied() && r.d.Status().ConfigHash == configHash(c.cut)) {
			if time.Now().After(deadline) {
				cond := loaded()
				t.Errorf("%s, %s: not applied 5s after the later event (ConfigLoaded %+v)", c.name, tm.name, cond)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if !time.Now().After(deadline) {
			t.Logf("%s, %s: applied %s after the later event", c.name, tm.name, time.Since(later).Round(time.Millisecond))
		}
	}
	restore(c.name + ": at the end")
}

// TestReloadAppliesASaveInAnyOrder is issue 38's item 1: a save that
// takes away wholesale, renamed into place, and an operator's reload
// (SIGHUP to the process, or the API's reload that nodeagentctl and
// systemctl reload use) after it by 0, 1, 10, 100 ms and 1 s, or before it
// by 1 ms: in every order the change is applied within one sync of the
// later event, however the two were debounced together. The same save
// with no reload is held. The cases: the kill switch turned off, the last
// VLAN (a macvlan stands in where the kernel has no 8021q) and, against a
// real kube-apiserver, the last label.
func TestReloadAppliesASaveInAnyOrder(t *testing.T) {
	keepSIGHUP(t)
	t.Run("kill switch off", func(t *testing.T) {
		l := newLab(t)
		full, _ := os.ReadFile(l.cfg)
		r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = 500 * time.Millisecond })
		armed := func() bool {
			out, _ := l.node.TryExec("ip", "route", "show", "table", "150")
			return strings.Contains(out, "unreachable default")
		}
		runWholesale(t, l, r, wholesaleCase{
			name: "kill switch off", full: string(full),
			cut:     strings.Replace(string(full), "killSwitch: true", "killSwitch: false", 1),
			applied: func() bool { return !armed() }, present: armed,
		})
	})
	t.Run("last VLAN", func(t *testing.T) {
		l := newLab(t)
		full, _ := os.ReadFile(l.cfg)
		r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = 500 * time.Millisecond })
		link, cut := "enp1s0.50", ""
		if l.vlan {
			i := strings.Index(string(full), "vlans:\n")
			j := strings.Index(string(full), "macvlans:\n")
			cut = string(full)[:i] + string(full)[j:]
		} else {
			// No 8021q here: the last macvlan is the same save for the
			// guard (every entry of a kind), its route moved to the trunk.
			link = "shim0"
			cut = strings.Replace(string(full), "macvlans:\n  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}\n", "", 1)
			cut = strings.Replace(cut, "dev: shim0", "dev: enp1s0", 1)
		}
		there := func() bool { _, err := l.node.TryExec("ip", "link", "show", link); return err == nil }
		runWholesale(t, l, r, wholesaleCase{
			name: "last " + link, full: string(full), cut: cut,
			applied: func() bool { return !there() }, present: there,
		})
	})
	t.Run("last label", func(t *testing.T) {
		if testenv.InVM() {
			t.Skip("the host tier runs this: the VM has no etcd or kube-apiserver")
		}
		srv := kubetest.Start(t)
		ctx := context.Background()
		if err := srv.CreateNode(ctx, "node-a", nil); err != nil {
			t.Fatal(err)
		}
		l := newLab(t)
		kubeconfig := filepath.Join(t.TempDir(), "kubelet.kubeconfig")
		if err := srv.WriteNodeKubeconfig(kubeconfig, "node-a"); err != nil {
			t.Fatal(err)
		}
		good, _ := os.ReadFile(l.cfg)
		base := "node: {name: node-a}\n" + string(good) + "kubernetes:\n  kubeconfig: " + kubeconfig + "\n  hold: 0s\n"
		full := base + "  labels: {homelab.example/vpn-ingress: \"true\"}\n"
		l.write(t, full)
		r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = 500 * time.Millisecond })
		labelled := func() bool {
			n, err := srv.Admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			return err == nil && n.Labels["homelab.example/vpn-ingress"] == "true"
		}
		unlabelled := func() bool {
			n, err := srv.Admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			_, has := n.Labels["homelab.example/vpn-ingress"]
			return err == nil && !has
		}
		runWholesale(t, l, r, wholesaleCase{name: "last label", full: full, cut: base, applied: unlabelled, present: labelled})
	})
}

// TestLabelMovesBetweenNodesOnReload is issue 38's item 2: the role's
// label moved from node A to node B the way an operator does it, both
// configs saved and SIGHUP sent at once, 50 times (and back between
// times). Node A's save removes its last label, which the save-guard holds
// until an operator's reload: the SIGHUP that came with it must apply it.
// A client-go watch on both Nodes from before the first move records
// every interval with the label on both: none may last longer than one
// sync's time, and every move ends with the label on B alone.
func TestLabelMovesBetweenNodesOnReload(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no etcd or kube-apiserver")
	}
	keepSIGHUP(t)
	srv := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const key = "homelab.example/vpn-ingress"
	type node struct {
		name       string
		l          *lab
		r          *running
		with, none string
	}
	var nodes []*node
	for _, name := range []string{"node-a", "node-b"} {
		if err := srv.CreateNode(ctx, name, nil); err != nil {
			t.Fatal(err)
		}
		l := newLab(t)
		kubeconfig := filepath.Join(t.TempDir(), "kubelet.kubeconfig")
		if err := srv.WriteNodeKubeconfig(kubeconfig, name); err != nil {
			t.Fatal(err)
		}
		good, _ := os.ReadFile(l.cfg)
		base := "node: {name: " + name + "}\n" + string(good) + "kubernetes:\n  kubeconfig: " + kubeconfig + "\n  hold: 0s\n"
		nodes = append(nodes, &node{name: name, l: l, with: base + "  labels: {" + key + ": \"true\"}\n", none: base})
	}
	a, b := nodes[0], nodes[1]
	a.l.write(t, a.with)
	b.l.write(t, b.none)
	for _, n := range nodes {
		n.r = startDaemon(t, n.l.node, n.l.cfg, nil)
	}

	// The watch: when the label is on each Node, from before the first move.
	type change struct {
		node string
		on   bool
		at   time.Time
	}
	changes := make(chan change, 1024)
	// The admin client's 10 s timeout would end a watch: this one has
	// none, and its end before the test's is a failure.
	wc := rest.CopyConfig(srv.AdminConfig)
	wc.Timeout = 0
	cs, err := kubernetes.NewForConfig(wc)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	watchEnded := make(chan struct{})
	var (
		on       = map[string]bool{}
		bothFrom time.Time
		overlaps []time.Duration
	)
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(interface{ GetLabels() map[string]string })
			m, ok2 := ev.Object.(metav1.Object)
			if !ok || !ok2 {
				continue
			}
			_, has := n.GetLabels()[key]
			changes <- change{m.GetName(), has, time.Now()}
		}
		close(watchEnded)
	}()
	observe := func(c change) {
		before := on["node-a"] && on["node-b"]
		on[c.node] = c.on
		after := on["node-a"] && on["node-b"]
		switch {
		case !before && after:
			bothFrom = c.at
		case before && !after:
			overlaps = append(overlaps, c.at.Sub(bothFrom))
		}
	}
	settle := func(what string, want map[string]bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for on["node-a"] != want["node-a"] || on["node-b"] != want["node-b"] {
			select {
			case c := <-changes:
				observe(c)
			case <-watchEnded:
				t.Fatalf("%s: the watch on the Nodes ended", what)
			case <-deadline:
				t.Fatalf("%s: the label is on A %v, on B %v; want A %v, B %v", what, on["node-a"], on["node-b"], want["node-a"], want["node-b"])
			}
		}
		// Late events of the same move.
		for {
			select {
			case c := <-changes:
				observe(c)
				continue
			case <-time.After(300 * time.Millisecond):
			}
			break
		}
		if on["node-a"] != want["node-a"] || on["node-b"] != want["node-b"] {
			t.Fatalf("%s: the label ended on A %v, on B %v; want A %v, B %v", what, on["node-a"], on["node-b"], want["node-a"], want["node-b"])
		}
	}
	settle("at start", map[string]bool{"node-a": true})

	const moves = 50
	var worst time.Duration
	for i := range moves {
		// A to B: both saved, then one SIGHUP that both daemons hear.
		a.l.write(t, a.none)
		b.l.write(t, b.with)
		sighup(t)
		settle(fmt.Sprintf("move %d to B", i+1), map[string]bool{"node-b": true})
		// And back, for the next move.
		a.l.write(t, a.with)
		b.l.write(t, b.none)
		sighup(t)
		settle(fmt.Sprintf("move %d back to A", i+1), map[string]bool{"node-a": true})
	}
	// One sync's time: the debounce and an apply, on this machine.
	const oneSync = time.Second
	for _, d := range overlaps {
		worst = max(worst, d)
	}
	t.Logf("%d moves each way: %d intervals with the label on both Nodes, the longest %s", moves, len(overlaps), worst.Round(time.Millisecond))
	if worst > oneSync {
		t.Errorf("the label was on both Nodes for %s at once (want at most one sync's time, %s)", worst.Round(time.Millisecond), oneSync)
	}
	for _, n := range nodes {
		s := n.r.d.Status()
		if c := s.Condition(api.CondConfigLoaded); c == nil || c.Status != api.True {
			t.Errorf("%s: ConfigLoaded %+v", n.name, c)
		}
	}
}
