package route

import (
	"context"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

// TestAdoptNeverWidensOrMisdeletes: on a real kernel, a rule marked adopt
// is not taken over where that could change another rule.
//   - A foreign rule that also matches on a selector nodeagent's rules do
//     not have (uidrange) is not the config's "priority 2000 lookup 150",
//     though it looks like it without that selector: it is not adopted
//     (nodeagent's rule is added beside it) and stays as it is.
//   - A foreign "priority 1000 lookup 150" behind a foreign
//     "priority 1000 uidrange 1000-1000 lookup 150": a delete made from
//     the first one's fields (no uidrange) matches the one before it in
//     the list, which the kernel would delete instead, so the plan names
//     a conflict and both stay.
func TestAdoptNeverWidensOrMisdeletes(t *testing.T) {
	ns := testenv.NewNetNS(t)
	ns.Exec(t, "ip", "rule", "add", "priority", "2000", "uidrange", "1000-1000", "table", "150")
	ns.Exec(t, "ip", "rule", "add", "priority", "1000", "uidrange", "1000-1000", "table", "150")
	ns.Exec(t, "ip", "rule", "add", "priority", "1000", "table", "150")
	before := ns.Exec(t, "ip", "rule", "show")

	narrow := Rule{Priority: 2000, Family: unix.AF_INET, Table: 150, Action: unix.FR_ACT_TO_TBL, Suppress: -1}
	shadowed := Rule{Priority: 1000, Family: unix.AF_INET, Table: 150, Action: unix.FR_ACT_TO_TBL, Suppress: -1}
	d := Desired{Rules: []Rule{narrow, shadowed}, AdoptRules: map[Rule]bool{narrow: true, shadowed: true}}
	ctx := context.Background()
	o, err := Observe(ctx, ns.Host.Snapshot(), d)
	if err != nil {
		t.Fatal(err)
	}
	p := MakePlan(d, o)
	got := p.String()
	t.Logf("plan:\n%s", got)
	want := "+ rule 2000: from all lookup 150\n! rule 1000: from all lookup 150: another rule at this priority comes before it"
	if !strings.HasPrefix(got, want) {
		t.Fatalf("plan:\n%s\nwant it to begin:\n%s", got, want)
	}
	// The conflict is the sync's one error; the add is applied.
	_, r := Apply(ctx, ns.Host.Snapshot(), p)
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "rule 1000") || strings.Contains(err.Error(), "rule 2000") {
		t.Errorf("apply: %v; want the conflict on rule 1000 only", err)
	}
	after := ns.Exec(t, "ip", "rule", "show")
	t.Logf("after:\n%s", after)
	for _, line := range strings.Split(strings.TrimSpace(before), "\n") {
		if !strings.Contains(after, line) {
			t.Errorf("rule %q is gone", line)
		}
	}
	if !strings.Contains(after, "2000:\tfrom all lookup 150 proto 147") {
		t.Error("nodeagent's rule 2000 was not added beside the uidrange one")
	}
}
