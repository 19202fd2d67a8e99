package netcfg

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// A sync's changes are logged one line each, except that at info a kind of
// object with more than maxLoggedChanges changes has only its first ones
// listed and the rest counted; at debug every one is listed.
func TestLogReportBounded(t *testing.T) {
	var r plan.Report
	for i := range 50 {
		r = append(r, plan.Entry{Subsystem: plan.WireGuard, Kind: plan.KindWireGuardPeer, Action: plan.Add,
			Text: fmt.Sprintf("+ wireguard wg0 peer %02d", i)})
		if i%20 == 0 {
			r = append(r, plan.Entry{Subsystem: plan.Links, Kind: plan.KindLink, Action: plan.Add, Text: fmt.Sprintf("+ link vlan%d", i)})
		}
	}
	r = append(r, plan.Entry{Subsystem: plan.WireGuard, Kind: plan.KindWireGuardPeer, Action: plan.NotApplied, Text: "! wireguard wg0 peer x: skipped"})
	logAt := func(level slog.Level) []string {
		var buf bytes.Buffer
		c := &Converger{Log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))}
		c.logReport(r)
		return strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	}
	count := func(lines []string, sub string) int {
		n := 0
		for _, l := range lines {
			if strings.Contains(l, sub) {
				n++
			}
		}
		return n
	}

	info := logAt(slog.LevelInfo)
	if got := count(info, "msg=change"); got != maxLoggedChanges+3 {
		t.Errorf("info: %d change lines, want %d (the first %d peers and 3 links):\n%s", got, maxLoggedChanges+3, maxLoggedChanges, strings.Join(info, "\n"))
	}
	for i := range 50 {
		listed := count(info, fmt.Sprintf("peer %02d\"", i)) == 1
		if listed != (i < maxLoggedChanges) {
			t.Errorf("info: peer %02d listed %v", i, listed)
		}
	}
	summary := fmt.Sprintf(`msg="changes not listed" subsystem=wireguard kind=wireguard_peer count=%d of=50`, 50-maxLoggedChanges)
	if count(info, summary) != 1 || count(info, "changes not listed") != 1 {
		t.Errorf("info: want one summary line %q:\n%s", summary, strings.Join(info, "\n"))
	}
	if last := info[len(info)-1]; !strings.Contains(last, "changes not listed") {
		t.Errorf("info: the count comes after the listed changes, not %q", last)
	}
	if count(info, "not applied") != 0 {
		t.Error("info: a change not applied is logged at debug only")
	}

	debug := logAt(slog.LevelDebug)
	if got := count(debug, "msg=change"); got != 53 {
		t.Errorf("debug: %d change lines, want all 53", got)
	}
	if count(debug, "changes not listed") != 0 || count(debug, `msg="not applied"`) != 1 {
		t.Errorf("debug: every change listed, no count, the op not applied once:\n%s", strings.Join(debug, "\n"))
	}
}
