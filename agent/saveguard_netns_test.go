package agent

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
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
