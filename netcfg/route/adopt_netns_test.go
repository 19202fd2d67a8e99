package route

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

// TestAdoptRuleBridge drives the rule adoption's fallback on a real
// kernel: where the kernel refuses nodeagent's rule beside the old one
// (EEXIST), the adoption bridges by a rule one priority ahead. The
// kernels tested take the two side by side, so the refusal is made here
// with a rule of nodeagent's already standing behind the old one (the
// plan being stale); the bridge then runs every step, and the old rule,
// first in the list, is the one deleted. `ip monitor rule` shows a rule
// sending 10.10.50.0/24 to table 150 at every step, and `ip rule` ends
// with nodeagent's alone.
func TestAdoptRuleBridge(t *testing.T) {
	ns := testenv.NewNetNS(t)
	ns.Exec(t, "ip", "rule", "add", "from", "10.10.50.0/24", "table", "150", "priority", "1000")
	ns.Exec(t, "ip", "rule", "add", "from", "10.10.50.0/24", "table", "150", "priority", "1000", "protocol", "147")
	rule := Rule{Priority: 1000, Family: unix.AF_INET, From: netip.MustParsePrefix("10.10.50.0/24"), Table: 150, Action: unix.FR_ACT_TO_TBL, Suppress: -1}
	op := Op{Kind: OpAdoptRule, Rule: rule, OldRule: ObservedRule{Rule: rule}}

	mon := monitorRules(t, ns)

	writes := ns.Host.Writes()
	if err := Execute(context.Background(), ns.Host.Snapshot(), Plan{Ops: []Op{op}}).Err(); err != nil {
		t.Fatal(err)
	}
	n := ns.Host.Writes() - writes
	record := mon.stop()
	t.Logf("bridged adoption: %d netlink writes; ip monitor rule:\n%s", n, strings.Join(record, "\n"))
	if n != 5 {
		t.Errorf("%d writes: want the bridge's five (ours refused, bridge added, old deleted, ours added, bridge deleted)", n)
	}
	present := 2 // the old rule and the stale one of nodeagent's
	for _, l := range record {
		if strings.HasPrefix(l, "Deleted ") {
			present--
		} else {
			present++
		}
		if present == 0 {
			t.Errorf("no rule for 10.10.50.0/24 after: %s", l)
		}
	}
	if len(record) != 3 || !strings.HasPrefix(record[0], "999:") {
		t.Errorf("want the bridge added at 999, the old rule deleted, the bridge deleted; ip monitor rule:\n%s", strings.Join(record, "\n"))
	}
	out := ns.Exec(t, "ip", "rule", "show")
	var left []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "from 10.10.50.0/24") {
			left = append(left, l)
		}
	}
	if len(left) != 1 || !strings.HasPrefix(left[0], "1000:") || !strings.Contains(left[0], "proto 147") && !strings.Contains(left[0], "proto nodeagent") {
		t.Errorf("after the bridged adoption, want nodeagent's rule alone at 1000:\n%s", out)
	}
}
