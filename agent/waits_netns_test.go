package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestMistypedParentIsNotReady is issue 30's item 2 in the running daemon:
// a macvlan on `trnuk0` where the node has trunk0. The node never reads as
// ready; past the bound it is degraded (what makes `nodeagentctl status`
// exit 1) with one WARN line that suggests trunk0, and the pending-objects
// gauge counts the shim. When a link of that name appears, it converges.
func TestMistypedParentIsNotReady(t *testing.T) {
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "eth0")
	cfg := filepath.Join(t.TempDir(), "nodeagent.yaml")
	if err := os.WriteFile(cfg, []byte(`dad: {disabled: true}
macvlans:
  - {name: shim0, parent: trnuk0, addresses: [10.10.50.3/24]}
routing:
  tables:
    - id: 150
      routes: [{to: 10.70.0.0/24, dev: shim0}]
checks:
  gatewayARP: false
`), 0o600); err != nil {
		t.Fatal(err)
	}
	const bound = 2 * time.Second
	r := launchUntil(t, node, cfg, func(o *RunOptions) { o.PendingBound = bound; o.Resync = 300 * time.Millisecond }, nil,
		"the first sync", func(s api.Status) bool { return s.LastSync != nil })
	if s := r.d.Status(); s.Ready {
		t.Errorf("ready while shim0 waits for trnuk0: %+v", s.Condition(api.CondReady))
	}
	waitFor(t, "degraded", bound+10*time.Second, func() bool { return r.d.Status().Degraded })
	s := r.d.Status()
	conv, ready := s.Condition(api.CondConverged), s.Condition(api.CondReady)
	if s.Ready || conv == nil || conv.Reason != "LinkMissing" || !strings.Contains(conv.Message, "link shim0 wait(s) for trnuk0") || !strings.Contains(conv.Message, "did you mean trunk0?") {
		t.Errorf("status: ready %v, Converged %+v, Ready %+v", s.Ready, conv, ready)
	}
	if got := gaugeValue(t, r, "nodeagent_pending_objects"); got != 1 {
		t.Errorf("nodeagent_pending_objects = %v, want 1 (shim0; the route waits for shim0, which the config makes)", got)
	}
	time.Sleep(4 * 300 * time.Millisecond) // a few resyncs more
	if n := strings.Count(r.log.String(), "objects wait for a link that does not exist"); n != 1 {
		t.Errorf("%d WARN lines for the wait, want 1:\n%s", n, r.log.String())
	}

	// The NIC appears (a late driver; here: a link of that name).
	node.Veth(t, "trnuk0", peer, "eth1")
	waitFor(t, "ready and not degraded once trnuk0 exists", 10*time.Second, func() bool { s := r.d.Status(); return s.Ready && !s.Degraded })
	if got := gaugeValue(t, r, "nodeagent_pending_objects"); got != 0 {
		t.Errorf("nodeagent_pending_objects = %v after trnuk0 appeared", got)
	}
	if out := node.Exec(t, "ip", "-d", "link", "show", "shim0"); !strings.Contains(out, "@trnuk0") {
		t.Errorf("shim0 after trnuk0 appeared: %s", out)
	}
}

// gaugeValue reads one unlabelled gauge of the daemon's.
func gaugeValue(t *testing.T, r *running, name string) float64 {
	t.Helper()
	mfs, err := r.d.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// TestPendingRouteFollowsLinkEvent is issue 38's item 3: a route in a
// kill-switch table that names a device the config does not create
// (`default dev tun9`: an OpenVPN tun, a wg-quick device during a
// take-over) is put in the kernel from the kernel's event for the
// device's creation, not from a timer (the bound's sync, or the 30 s
// resync). tun9 is made 5 s after the daemon has seen it missing; the
// route must be there within 1 s of the creation, 20 times over. The
// timers keep their defaults, so only the event can explain a fast answer.
func TestPendingRouteFollowsLinkEvent(t *testing.T) {
	if testenv.InVM() {
		// 20 trials of 5 s each: under TCG that is minutes of the VM
		// tier's budget for what the host's kernel shows as well.
		t.Skip("the host tier runs this: it needs only TUN, and its 20 trials wait 5 s each")
	}
	node, r := launchWaitingForTun9(t)
	routed := func() bool {
		out, _ := node.TryExec("ip", "route", "show", "table", "150", "dev", "tun9")
		return strings.Contains(out, "default")
	}
	const trials = 20
	var worst time.Duration
	for i := range trials {
		// The daemon has seen tun9 missing (the wait is tracked), and
		// 5 s pass before it appears.
		waitFor(t, fmt.Sprintf("trial %d: the route waiting for tun9", i+1), 10*time.Second, func() bool {
			return !routed() && gaugeValue(t, r, "nodeagent_pending_objects") == 1
		})
		time.Sleep(5 * time.Second)
		made := time.Now()
		node.Exec(t, "ip", "tuntap", "add", "dev", "tun9", "mode", "tun")
		node.Exec(t, "ip", "link", "set", "tun9", "up")
		for !routed() && time.Since(made) < 40*time.Second {
			time.Sleep(5 * time.Millisecond)
		}
		took := time.Since(made)
		worst = max(worst, took)
		if took > time.Second {
			t.Fatalf("trial %d: the route followed tun9's creation after %s (want within 1s; a timer, not the event)", i+1, took.Round(time.Millisecond))
		}
		node.Exec(t, "ip", "link", "del", "tun9")
	}
	t.Logf("route default dev tun9 in the kernel after tun9 appeared: worst of %d trials %s", trials, worst.Round(time.Millisecond))
}

// TestJournalSaysReadyAsStatusDoes is issue 45's "the journal and status
// disagree on the word ready": a route in a kill-switch table names a
// device the config does not create (tun9, an OpenVPN tun that comes
// later). The first sync logs that it is done and the node is not ready,
// with the reason status gives, never "node ready"; once tun9 appears
// and the node is ready, "node ready" is logged, once, with a status
// that says ready.
func TestJournalSaysReadyAsStatusDoes(t *testing.T) {
	node, r := launchWaitingForTun9(t)
	const notReady = `level=WARN msg="first sync done; the node is not ready" reason=WaitingForLink why="route default dev tun9 table 150`
	waitFor(t, "the first sync's log line", 10*time.Second, func() bool { return strings.Contains(r.log.String(), notReady) })
	line := ""
	for _, l := range strings.Split(r.log.String(), "\n") {
		if strings.Contains(l, "first sync done") {
			line = l
		}
	}
	t.Logf("the first sync's line: %s", line)
	if !strings.Contains(line, `status="not ready; `) || !strings.Contains(line, "1 pending") {
		t.Errorf("the first sync's line: %s", line)
	}
	s := r.d.Status()
	if c := s.Condition(api.CondReady); s.Ready || c == nil || c.Reason != "WaitingForLink" || !strings.Contains(line, c.Message) {
		t.Errorf("status: ready %v, Ready %+v; the log line: %s", s.Ready, c, line)
	}
	if strings.Contains(r.log.String(), `msg="node ready"`) {
		t.Errorf(`"node ready" logged while the node is not ready:\n%s`, r.log.String())
	}

	node.Exec(t, "ip", "tuntap", "add", "dev", "tun9", "mode", "tun")
	node.Exec(t, "ip", "link", "set", "tun9", "up")
	waitFor(t, "ready once tun9 exists", 10*time.Second, func() bool { return r.d.Status().Ready })
	waitFor(t, `"node ready" logged`, 10*time.Second, func() bool { return strings.Contains(r.log.String(), `msg="node ready"`) })
	time.Sleep(time.Second) // a sync or two more
	if n := strings.Count(r.log.String(), `msg="node ready"`); n != 1 {
		t.Errorf(`%d "node ready" lines, want 1:\n%s`, n, r.log.String())
	}
	if !strings.Contains(r.log.String(), `level=INFO msg="node ready" status="ready; `) {
		t.Errorf(`"node ready" without a status that says ready:\n%s`, r.log.String())
	}
}

// launchWaitingForTun9 runs the daemon, up to its first sync, on a node
// with a trunk and a config whose kill-switch table routes by tun9, a
// device the config does not create (an OpenVPN tun that comes later).
func launchWaitingForTun9(t *testing.T) (*testenv.NetNS, *running) {
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "eth0")
	cfg := filepath.Join(t.TempDir(), "nodeagent.yaml")
	if err := os.WriteFile(cfg, []byte(`dad: {disabled: true}
macvlans:
  - {name: shim0, parent: trunk0, addresses: [10.10.50.3/24]}
routing:
  tables:
    - id: 150
      killSwitch: true
      routes: [{to: default, dev: tun9}]
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
checks:
  gatewayARP: false
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return node, launchUntil(t, node, cfg, nil, nil, "the first sync", func(s api.Status) bool { return s.LastSync != nil })
}
