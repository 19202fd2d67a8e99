package waiting

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

func pending(object, missing string) plan.Entry {
	return plan.Entry{Object: object, Action: plan.NotApplied, Err: fmt.Errorf("%s: %w", object, &host.PendingError{Reason: missing + " does not exist", Missing: missing})}
}

// A VLAN on a mistyped parent and the route through that VLAN: only the
// parent, which the config does not create, is a wait; it goes over the
// bound once, with a suggestion from the node's links, and is forgotten
// when it ends.
func TestTrackerBoundAndSuggestion(t *testing.T) {
	rep := plan.Report{
		pending("link enp1s0.50", "trnuk0"),
		pending("route 10.70.0.0/24 dev enp1s0.50 table 150", "enp1s0.50"),
		{Object: "link shim0", Action: plan.Add},
	}
	creates := func(n string) bool { return n == "enp1s0.50" }
	listed := 0
	links := func() []string { listed++; return []string{"lo", "trunk0", "eth1"} }
	tr := Tracker{Bound: 30 * time.Second}
	t0 := time.Unix(1000, 0)

	waits, over := tr.Update(t0, rep, creates, links)
	if len(waits) != 1 || waits[0].Missing != "trnuk0" || waits[0].Over || len(over) != 0 || listed != 0 {
		t.Fatalf("at once: waits %+v, over %+v, links listed %d; want one wait for trnuk0, not over, no listing", waits, over, listed)
	}
	if left, ok := tr.Due(t0.Add(10 * time.Second)); !ok || left != 20*time.Second {
		t.Errorf("Due 10 s in: %s %v, want 20s true", left, ok)
	}
	waits, over = tr.Update(t0.Add(30*time.Second), rep, creates, links)
	if len(over) != 1 || !waits[0].Over || waits[0].Suggest != "trunk0" {
		t.Fatalf("at the bound: waits %+v, over %+v; want it over, suggesting trunk0", waits, over)
	}
	if s := waits[0].String(); !strings.Contains(s, "link enp1s0.50 wait(s) for trnuk0") || !strings.Contains(s, "did you mean trunk0?") {
		t.Errorf("text: %q", s)
	}
	if _, ok := tr.Due(t0.Add(31 * time.Second)); ok {
		t.Error("Due after the only wait went over: still due")
	}
	if _, over = tr.Update(t0.Add(60*time.Second), rep, creates, links); len(over) != 0 {
		t.Errorf("a wait already over reported again: %+v", over)
	}
	// The parent appears: the wait ends; a later one starts afresh.
	if waits, _ = tr.Update(t0.Add(61*time.Second), plan.Report{{Object: "link enp1s0.50", Action: plan.Add}}, creates, links); len(waits) != 0 {
		t.Errorf("after the parent appeared: %+v", waits)
	}
	if waits, over = tr.Update(t0.Add(62*time.Second), rep, creates, links); len(waits) != 1 || waits[0].Over || len(over) != 0 {
		t.Errorf("a new wait: %+v %+v, want one, under the bound", waits, over)
	}
}

// Find, for apply --once, reports every such wait at once; a link the
// config makes is not one.
func TestFind(t *testing.T) {
	rep := plan.Report{pending("link a.5", "enp9s0"), pending("link b", "enp9s0"), pending("route x", "a.5")}
	got := Find(rep, func(n string) bool { return n == "a.5" }, func() []string { return []string{"enp8s0"} })
	if len(got) != 1 || got[0].Missing != "enp9s0" || len(got[0].Objects) != 2 || got[0].Suggest != "enp8s0" {
		t.Fatalf("Find: %+v", got)
	}
	if got := Find(plan.Report{pending("route x", "a.5")}, func(n string) bool { return n == "a.5" }, nil); got != nil {
		t.Errorf("a wait for a link the config makes: %+v", got)
	}
}
