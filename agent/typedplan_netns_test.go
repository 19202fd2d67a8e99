package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/testenv"
)

// writes are a report's changes, as plan text.
func writes(r plan.Report) []string {
	var out []string
	for _, e := range r {
		if e.Writes() {
			out = append(out, e.Text)
		}
	}
	return out
}

// TestSafeApplyAppliesTheCheckedPlan: between a sync's plan (which safe
// apply decides on) and its apply, an object the plan does not touch is
// changed by hand. The sync applies exactly the plan it checked; the
// change by hand is repaired by the next sync, planned and checked on its
// own.
func TestSafeApplyAppliesTheCheckedPlan(t *testing.T) {
	l := newLab(t)
	// Safe apply guards the change: an "API server" probe that passes.
	l.node.Exec(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "enp1s0")
	l.peer.Exec(t, "ip", "addr", "add", "192.0.2.10/24", "dev", "eth0")
	var probed atomic.Int64
	var ln net.Listener
	if err := l.peer.Host.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", "192.0.2.10:6443")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			probed.Add(1)
			c.Close()
		}
	}()
	base, _ := os.ReadFile(l.cfg)
	l.write(t, strings.Replace(string(base), "checks:\n  gatewayARP: false\n", "checks:\n  gatewayARP: false\n  apiServer: 192.0.2.10:6443\n", 1))
	var armed atomic.Bool
	// rule is whether rule 1000 was in the kernel as the sync ended:
	// looked at in afterApply, before the next sync (the deletion's own
	// event brings one) can repair it.
	type sync struct {
		checked, applied []string
		rule             bool
	}
	syncs := make(chan sync, 8)
	r := launch(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = time.Hour }, func(d *Daemon) {
		var checked []string
		d.beforeApply = func(p netcfg.Plans) {
			checked = writes(p.Report())
			if armed.Load() && slices.Contains(checked, "+ address 10.10.50.4/24 on shim0") {
				armed.Store(false)
				l.node.Exec(t, "ip", "rule", "del", "priority", "1000")
			}
		}
		d.afterApply = func(_ netcfg.Plans, res netcfg.Result) {
			out, _ := l.node.TryExec("ip", "rule", "show", "priority", "1000")
			syncs <- sync{checked, writes(res.Report), strings.Contains(out, "lookup 150")}
		}
	})
	// A second sync, so there is a last good state and safe apply is on.
	good, _ := os.ReadFile(l.cfg)
	l.write(t, strings.Replace(string(good), "10.70.0.0/24", "10.71.0.0/24", 1))
	waitFor(t, "the second config", 10*time.Second, func() bool {
		out, _ := l.node.TryExec("ip", "route", "show", "table", "150")
		return strings.Contains(out, "10.71.0.0/24")
	})
	time.Sleep(300 * time.Millisecond)
	for len(syncs) > 0 {
		<-syncs
	}
	armed.Store(true)
	good, _ = os.ReadFile(l.cfg)
	probesBefore := probed.Load()
	l.write(t, strings.Replace(string(good), "addresses: [10.10.50.3/24]", "addresses: [10.10.50.3/24, 10.10.50.4/24]", 1))
	// The first sync that plans anything: a no-op sync the kernel events
	// of the last change's own writes bring may still come first (the VM
	// is slow enough for one to land after the drain above).
	var changed sync
	for changed.checked == nil {
		select {
		case changed = <-syncs:
			if len(changed.checked) == 0 {
				changed.checked = nil
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no sync after the config change")
		}
	}
	if armed.Load() {
		t.Fatalf("the sync's plan did not add the address: %q", changed.checked)
	}
	if !slices.Equal(changed.checked, changed.applied) {
		t.Errorf("applied %q; the plan checked was %q", changed.applied, changed.checked)
	}
	// The probe's connect completes in the kernel; the listener's Accept,
	// which counts it, may run a moment after the sync is done.
	for deadline := time.Now().Add(5 * time.Second); probed.Load()-probesBefore < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := probed.Load() - probesBefore; n < 2 {
		t.Errorf("the API server was probed %d times around the change; want before and after", n)
	}
	if slices.ContainsFunc(changed.applied, func(s string) bool { return strings.Contains(s, "rule 1000") }) {
		t.Errorf("the sync re-added the rule deleted after its plan: %q", changed.applied)
	}
	if changed.rule {
		t.Error("the rule deleted between plan and apply came back in the same sync")
	}
	// The deletion's own event brings a sync that plans and repairs it.
	for repaired := false; !repaired; {
		select {
		case repair := <-syncs:
			if len(repair.checked) == 0 {
				continue // a no-op sync
			}
			repaired = true
			if !slices.Contains(repair.checked, "+ rule 1000: from 10.10.50.0/24 lookup 150") || !slices.Equal(repair.checked, repair.applied) {
				t.Errorf("repair sync: checked %q, applied %q", repair.checked, repair.applied)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the deleted rule was not repaired")
		}
	}
	waitFor(t, "the rule back", 5*time.Second, func() bool {
		out, _ := l.node.TryExec("ip", "rule", "show", "priority", "1000")
		return strings.Contains(out, "lookup 150")
	})
	_ = r
}

// TestWireGuardAddressFailureIsWireGuards: an address of a WireGuard
// device that cannot be added is reported under wireguard (it was filed
// under links by a guess from the error's first word).
func TestWireGuardAddressFailureIsWireGuards(t *testing.T) {
	l := newLab(t)
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = time.Hour })
	// IPv6 off on the device: adding an IPv6 address to it fails.
	l.node.Exec(t, "sysctl", "-w", "net.ipv6.conf."+l.wg+".disable_ipv6=1")
	good, _ := os.ReadFile(l.cfg)
	l.write(t, strings.Replace(string(good), "addresses: [10.90.0.1/24]", `addresses: [10.90.0.1/24, "fd00:90::1/64"]`, 1))
	var s api.Status
	waitFor(t, "the failed address reported", 20*time.Second, func() bool {
		s = r.d.Status()
		return len(s.Failed) > 0
	})
	want := fmt.Sprintf("address fd00:90::1/64 on %s: ", l.wg)
	if len(s.Failed) != 1 || s.Failed[0].Subsystem != "wireguard" || !strings.HasPrefix(s.Failed[0].Message, want) {
		t.Errorf("failed %+v; want one wireguard object %q...", s.Failed, want)
	}
	for _, sub := range s.Subsystems {
		switch {
		case sub.Name == "wireguard" && !strings.HasPrefix(sub.Error, want):
			t.Errorf("subsystem wireguard error %q", sub.Error)
		case sub.Name != "wireguard" && sub.Error != "":
			t.Errorf("subsystem %s error %q; the failure is wireguard's", sub.Name, sub.Error)
		}
	}
}

// TestNoPlanTextIsParsed: nothing in agent/ or cmd/ takes plan text (or
// error text) apart to find what a sync did: logs, status, metrics, plan
// and apply --once read the typed report. The patterns are checked against
// the lines that used to do it.
func TestNoPlanTextIsParsed(t *testing.T) {
	if testenv.InVM() {
		t.Skip("reads the source tree, which the VM does not carry; the host tier runs it")
	}
	bad := []*regexp.Regexp{
		regexp.MustCompile(`strings\.(Split|SplitN|SplitAfter|Fields|Count)\([^)]*\.String\(\)`),
		regexp.MustCompile(`strings\.(Split|SplitN|Fields)\([^)]*[pP]lan`),
		regexp.MustCompile(`strings\.HasPrefix\((msg|[a-z]+\.Error\(\)|[a-z]+\.Message), "`),
		regexp.MustCompile(`l\[0\] != '!'|line\[0\] == '!'`),
		regexp.MustCompile(`subsystemOf\(`),
	}
	// Control: the lines this replaced are caught.
	for _, old := range []string{
		`for _, l := range strings.Split(strings.TrimSpace(p.String()), "\n") {`,
		`case strings.HasPrefix(msg, "wireguard"):`,
		`if l != "" && l[0] != '!' {`,
		`sub := subsystemOf(e.Error())`,
	} {
		if !slices.ContainsFunc(bad, func(re *regexp.Regexp) bool { return re.MatchString(old) }) {
			t.Fatalf("control: %q is not caught", old)
		}
	}
	var files []string
	for _, glob := range []string{"*.go", "*/*.go", "../cmd/*/*.go"} {
		m, _ := filepath.Glob(glob)
		files = append(files, m...)
	}
	if len(files) < 10 {
		t.Fatalf("found %d files to check", len(files))
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, re := range bad {
				if re.MatchString(line) {
					t.Errorf("%s:%d parses plan or error text: %s", f, i+1, strings.TrimSpace(line))
				}
			}
		}
	}
}
