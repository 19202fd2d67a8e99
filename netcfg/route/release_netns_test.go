package route

import (
	"bufio"
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

// TestReleaseRuleAndRoute: release hands nodeagent's rule and route back
// as adoption took them, the other way round. The rule: an unmarked copy
// (protocol 0, as `ip rule add` makes it) is added beside nodeagent's,
// then nodeagent's is deleted by its protocol, so `ip monitor rule` shows
// a rule for 10.10.50.0/24 at every step; a release interrupted after the
// copy (a second run) only deletes nodeagent's. The route: replaced in
// place with protocol boot, never deleted. Afterwards `ip` shows each
// once, neither nodeagent's.
func TestReleaseRuleAndRoute(t *testing.T) {
	ns := testenv.NewNetNS(t)
	ns.Exec(t, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up0p")
	ns.Exec(t, "ip", "link", "set", "up0p", "up")
	ns.Exec(t, "ip", "link", "set", "up0", "up")
	ns.Exec(t, "ip", "addr", "add", "192.0.2.2/24", "dev", "up0")
	rule := Rule{Priority: 1000, Family: unix.AF_INET, From: netip.MustParsePrefix("10.10.50.0/24"), Table: 150, Action: unix.FR_ACT_TO_TBL, Suppress: -1}
	rt := Route{Table: 150, To: netip.MustParsePrefix("0.0.0.0/0"), Type: unix.RTN_UNICAST, Via: netip.MustParseAddr("192.0.2.1"), Dev: "up0"}
	ns.Exec(t, "ip", "rule", "add", "from", "10.10.50.0/24", "table", "150", "priority", "1000", "protocol", "147")
	ns.Exec(t, "ip", "route", "add", "default", "via", "192.0.2.1", "dev", "up0", "table", "150", "proto", "147")
	mon := monitorRules(t, ns)

	idx, err := ns.Host.NL().LinkByName("up0")
	if err != nil {
		t.Fatal(err)
	}
	p := Plan{Ops: []Op{ReleaseRule(rule, ""), ReleaseRoute(rt, "")}, Observed: Observed{Links: map[string]int{"up0": idx.Attrs().Index}}}
	if err := Execute(context.Background(), ns.Host.Snapshot(), p).Err(); err != nil {
		t.Fatal(err)
	}
	record := mon.stop()
	t.Logf("release: ip monitor rule:\n%s", strings.Join(record, "\n"))
	present := 1
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
	if len(record) != 2 || strings.HasPrefix(record[0], "Deleted ") || !strings.HasPrefix(record[1], "Deleted ") {
		t.Errorf("want the copy added, then nodeagent's deleted; ip monitor rule:\n%s", strings.Join(record, "\n"))
	}
	check := func(when string) {
		t.Helper()
		var left []string
		for _, l := range strings.Split(ns.Exec(t, "ip", "rule", "show"), "\n") {
			if strings.Contains(l, "from 10.10.50.0/24") {
				left = append(left, l)
			}
		}
		if len(left) != 1 || strings.Contains(left[0], "proto") {
			t.Errorf("%s: want one unmarked rule at 1000: %q", when, left)
		}
		if got := ns.Exec(t, "ip", "route", "show", "table", "150"); got != "default via 192.0.2.1 dev up0 \n" {
			t.Errorf("%s: table 150 is not its route, protocol boot: %q", when, got)
		}
	}
	check("after release")

	// Interrupted: nodeagent's rule is back beside the copy, as if the
	// delete had not run. A release again deletes only nodeagent's.
	ns.Exec(t, "ip", "rule", "add", "from", "10.10.50.0/24", "table", "150", "priority", "1000", "protocol", "147")
	writes := ns.Host.Writes()
	if err := Execute(context.Background(), ns.Host.Snapshot(), Plan{Ops: []Op{ReleaseRule(rule, "")}}).Err(); err != nil {
		t.Fatal(err)
	}
	if n := ns.Host.Writes() - writes; n != 1 {
		t.Errorf("an interrupted release took %d writes, want the one delete", n)
	}
	check("after an interrupted release")
}

// ruleMonitor is `ip monitor rule` in a namespace, with markers that tell
// when it has printed everything before them.
type ruleMonitor struct {
	t     *testing.T
	ns    *testenv.NetNS
	mu    sync.Mutex
	lines []string
}

// monitorRules starts ip monitor rule in ns and returns once it listens.
func monitorRules(t *testing.T, ns *testenv.NetNS) *ruleMonitor {
	m := &ruleMonitor{t: t, ns: ns}
	cmd := exec.Command("ip", "-n", ns.Name, "monitor", "rule")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			m.mu.Lock()
			m.lines = append(m.lines, sc.Text())
			m.mu.Unlock()
		}
	}()
	m.mark("98")
	return m
}

// mark adds and deletes a marker rule until the monitor has printed it.
func (m *ruleMonitor) mark(table string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.ns.Exec(m.t, "ip", "rule", "add", "priority", "5", "from", "192.0.2.0/24", "table", table)
		m.ns.Exec(m.t, "ip", "rule", "del", "priority", "5", "from", "192.0.2.0/24", "table", table)
		time.Sleep(20 * time.Millisecond)
		m.mu.Lock()
		seen := strings.Contains(strings.Join(m.lines, "\n"), "lookup "+table)
		m.mu.Unlock()
		if seen {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatal("ip monitor rule printed no marker")
		}
	}
}

// stop waits for what the monitor printed so far and returns the lines
// about 10.10.50.0/24 since it started.
func (m *ruleMonitor) stop() []string {
	m.mark("99")
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, l := range m.lines {
		if strings.Contains(l, "10.10.50.0/24") {
			out = append(out, l)
		}
	}
	return out
}
