package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// portHookLab is a PIA lab whose onChange logs each run's environment and
// fails (exit 1, "qbittorrent refused the port") while the file fail
// exists; a run that finds another under way logs an overlap.
func portHookLab(t *testing.T, extra string) (l *piastub.Lab, hook, fail, log, overlaps string) {
	l = piastub.NewLab(t, piastub.Options{}, "stub_ams")
	fail, log, overlaps = filepath.Join(l.Dir, "fail"), filepath.Join(l.Dir, "hook.log"), filepath.Join(l.Dir, "overlaps")
	lock := filepath.Join(l.Dir, "lock")
	hook = filepath.Join(l.Dir, "hook.sh")
	os.WriteFile(hook, []byte(`#!/bin/sh
mkdir `+lock+` 2>/dev/null || echo overlap >> `+overlaps+`
echo "$NODEAGENT_PIA_PORT $NODEAGENT_PIA_PREVIOUS_PORT $NODEAGENT_PIA_PORT_LOST $NODEAGENT_PIA_DEVICE ${NOTIFY_SOCKET:-none}" >> `+log+`
sleep 0.2
rmdir `+lock+`
if [ -e `+fail+` ]; then echo "qbittorrent refused the port"; exit 1; fi
`), 0o755)
	os.WriteFile(fail, nil, 0o644)
	l.PIA = fmt.Sprintf("      portForward:\n        enabled: true\n        onChange: [%s]\n        hookTimeout: 10s\n%s", hook, extra)
	l.WriteConfig(t, "stub_ams")
	return l, hook, fail, log, overlaps
}

func hookLines(log string) []string {
	b, _ := os.ReadFile(log)
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func portDelivered(r *running) api.Condition {
	s := r.d.Status()
	if c := s.Condition(api.CondPortDelivered); c != nil {
		return *c
	}
	return api.Condition{}
}

// gauge reads a gauge or counter of the daemon's with the given labels.
func gauge(t *testing.T, r *running, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.d.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !labelIs(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestPortHookRetriesUntilDelivered: a failing onChange is retried with
// backoff, reported as HookFailed (status, condition, metrics) meanwhile,
// and PortDelivered once it exits 0; its environment is the documented
// one; a reload that keeps the hook keeps its scheduler (no second run
// for the delivered port, no overlap), and every re-runs it with the same
// port.
func TestPortHookRetriesUntilDelivered(t *testing.T) {
	l, hook, fail, log, overlaps := portHookLab(t, "        every: 0s\n")
	r := startPIA(t, l, fastPF)
	waitFor(t, "the port bound", 60*time.Second, func() bool { return forwardedPort(r) != 0 })
	port := forwardedPort(r)
	waitFor(t, "PortDelivered HookFailed", 20*time.Second, func() bool { return portDelivered(r).Reason == "HookFailed" })
	if c := portDelivered(r); c.Status != api.False || !strings.Contains(c.Message, "qbittorrent refused the port") {
		t.Errorf("PortDelivered while the hook fails: %+v", c)
	}
	h := tunnel(r).PortHook
	if h == nil || h.Delivered || h.Port != port || h.Attempts < 1 || h.LastExit != "exit 1" || h.LastRun == nil || h.NextRun == nil ||
		h.LastError != "exit status 1: qbittorrent refused the port" {
		t.Errorf("status port hook while it fails: %+v", h)
	}
	if v := gauge(t, r, "nodeagent_port_delivered", "device", l.Dev); v != 0 {
		t.Errorf("nodeagent_port_delivered %v, want 0", v)
	}
	// The second attempt comes 5 s after the first: a retry, not a one-off.
	waitFor(t, "a second failed attempt counted", 20*time.Second, func() bool {
		return gauge(t, r, "nodeagent_port_hook_runs_total", "device", l.Dev, "result", "failure") >= 2
	})
	if h := tunnel(r).PortHook; h == nil || h.Attempts < 2 {
		t.Errorf("status port hook after two failures: %+v", h)
	}
	os.Remove(fail)
	waitFor(t, "PortDelivered True", 40*time.Second, func() bool { return portDelivered(r).Status == api.True })
	if c := portDelivered(r); c.Reason != "Delivered" || !strings.Contains(c.Message, fmt.Sprint(port)) {
		t.Errorf("PortDelivered: %+v", c)
	}
	if v := gauge(t, r, "nodeagent_port_delivered", "device", l.Dev); v != 1 {
		t.Errorf("nodeagent_port_delivered %v, want 1", v)
	}
	if v := gauge(t, r, "nodeagent_port_hook_runs_total", "device", l.Dev, "result", "success"); v != 1 {
		t.Errorf("port_hook_runs_total{result=success} %v, want 1", v)
	}
	if h := tunnel(r).PortHook; h == nil || !h.Delivered || h.Attempts != 0 || h.LastExit != "exit 0" || h.NextRun != nil {
		t.Errorf("status port hook once delivered (every 0s): %+v", h)
	}
	lines := hookLines(log)
	// port, previous, lost, device, NOTIFY_SOCKET (the daemon's is not
	// passed on; hookrun's tests check the whole environment).
	want := fmt.Sprintf("%d 0 0 %s none", port, l.Dev)
	for _, line := range lines {
		if line != want {
			t.Errorf("a run saw %q, want %q", line, want)
		}
	}
	t.Logf("%d runs until delivered: %q", len(lines), lines)

	// A reload with the same hook and every 5s: no run for the reload
	// itself, then one every 5 s, none overlapping.
	n := len(lines)
	l.PIA = fmt.Sprintf("      portForward:\n        enabled: true\n        onChange: [%s]\n        hookTimeout: 10s\n        every: 5s\n", hook)
	l.WriteConfig(t, "stub_ams")
	if res := r.d.Reload(t.Context()); !res.Applied {
		t.Fatalf("reload: %+v", res)
	}
	time.Sleep(2 * time.Second)
	if m := len(hookLines(log)); m != n {
		t.Errorf("the reload ran the hook %d times for a port it had delivered", m-n)
	}
	waitFor(t, "two periodic runs", 30*time.Second, func() bool { return len(hookLines(log)) >= n+2 })
	if c := portDelivered(r); c.Status != api.True {
		t.Errorf("PortDelivered after periodic runs: %+v", c)
	}
	if b, err := os.ReadFile(overlaps); err == nil {
		t.Errorf("hook runs overlapped: %s", b)
	}
	if p := forwardedPort(r); p != port {
		t.Errorf("the port moved during the test (%d, then %d)", port, p)
	}
}
