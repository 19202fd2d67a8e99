package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// TestWaitHealthyThroughPIARegistration is the README's post-start step
// (issue 45): right after the daemon starts, a PIA tunnel still registers
// (the stub answers each request 1 s late), so status exits 1; `wait
// --for=healthy` waits that out, through the token, the list, addKey, the
// handshake (a port still binding is PortDelivered Unknown, not False: no
// fault), and exits 0 once status does; `wait
// --for=condition/PortDelivered` then waits for the port's delivery. With the
// port hook failing, the node is degraded (PortDelivered=False) and the
// wait ends at its --timeout with exit 1, naming the condition.
func TestWaitHealthyThroughPIARegistration(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this")
	}
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	fail := filepath.Join(l.Dir, "fail")
	delivered := filepath.Join(l.Dir, "delivered")
	hook := filepath.Join(l.Dir, "hook.sh")
	os.WriteFile(hook, []byte(`#!/bin/sh
if [ -e `+fail+` ]; then echo "qbittorrent-port: no answer from the WebUI"; exit 1; fi
echo "$NODEAGENT_PIA_PORT" > `+delivered+`
`), 0o755)
	l.PIA = fmt.Sprintf("      portForward:\n        enabled: true\n        onChange: [%s]\n        hookTimeout: 10s\n", hook)
	l.WriteConfig(t, "stub_ams")
	l.Stub.Slow(time.Second)

	start := time.Now()
	d, socket := runPIADaemon(t, l)
	ctl := ctlAt(socket)
	waitUntil(t, "the socket", 10*time.Second, func() bool { _, err := os.Stat(socket); return err == nil })

	// Right after the start: not healthy, since the tunnel registers.
	code, out := ctl("status")
	s := d.Status()
	tunnel := s.Condition(api.CondTunnelHealthy)
	t.Logf("status %s after the start: exit %d; TunnelHealthy %+v", time.Since(start).Round(time.Millisecond), code, tunnel)
	if code != 1 {
		t.Fatalf("status right after the start: exit %d, want 1 while PIA registers:\n%s", code, out)
	}
	if c := s.Condition(api.CondPortDelivered); c != nil && c.Status == api.False {
		t.Errorf("PortDelivered False before a port was bound: %+v", c)
	}

	// The README's step.
	waited := time.Now()
	code, out = ctl("wait", "--for=healthy", "--timeout=90s")
	took := time.Since(waited)
	t.Logf("wait --for=healthy: exit %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
	if code != 0 || strings.TrimSpace(out) != "healthy" {
		t.Fatalf("wait --for=healthy: exit %d\n%s\n%s", code, out, statusOf(ctl))
	}
	if code, out := ctl("status"); code != 0 {
		t.Errorf("status after wait --for=healthy: exit %d\n%s", code, out)
	}
	s = d.Status()
	if c := s.Condition(api.CondTunnelHealthy); c == nil || c.Status != api.True {
		t.Errorf("after wait --for=healthy, TunnelHealthy: %+v", c)
	}
	// The port may still be binding then (Unknown, no fault): the wait
	// for its delivery is its condition's.
	if c := s.Condition(api.CondPortDelivered); c == nil || c.Status == api.False {
		t.Errorf("after wait --for=healthy, PortDelivered: %+v", c)
	}
	if code, out := ctl("wait", "--for=condition/PortDelivered", "--timeout=60s"); code != 0 || !strings.HasPrefix(out, "PortDelivered=True (Delivered: ") {
		t.Fatalf("wait --for=condition/PortDelivered: exit %d\n%s", code, out)
	}
	if code, out := ctl("status"); code != 0 {
		t.Errorf("status once the port is delivered: exit %d\n%s", code, out)
	}
	if b, err := os.ReadFile(delivered); err != nil || strings.TrimSpace(string(b)) == "" {
		t.Errorf("the hook delivered no port: %q %v", b, err)
	}

	// A port not delivered: degraded, and the wait ends at its timeout.
	os.WriteFile(fail, nil, 0o644)
	if code, out := ctl("port", "--retry"); code != 0 {
		t.Fatalf("port --retry: exit %d\n%s", code, out)
	}
	waitUntil(t, "PortDelivered=False", 20*time.Second, func() bool {
		s := d.Status()
		c := s.Condition(api.CondPortDelivered)
		return c != nil && c.Status == api.False
	})
	if code, out := ctl("status"); code != 1 || !strings.Contains(out, "degraded") {
		t.Errorf("status with the port not delivered: exit %d\n%s", code, out)
	}
	waited = time.Now()
	code, out = ctl("wait", "--for=healthy", "--timeout=2s")
	took = time.Since(waited)
	if code != 1 || !strings.Contains(out, "timed out after 2s waiting for healthy: PortDelivered=False (HookFailed: ") || !strings.Contains(out, "no answer from the WebUI") {
		t.Errorf("wait --for=healthy with the hook failing: exit %d after %s\n%s", code, took, out)
	}
	if took < 2*time.Second || took > 2*time.Second+pollTimeout {
		t.Errorf("wait --for=healthy --timeout=2s took %s", took)
	}
	// ready is not healthy: a degraded node is ready.
	if code, out := ctl("wait", "--for=ready", "--timeout=2s"); code != 0 || !strings.Contains(out, "ready (degraded: PortDelivered=False") {
		t.Errorf("wait --for=ready while degraded: exit %d\n%s", code, out)
	}
}

// statusOf is nodeagentctl status's output, for a failure's message.
func statusOf(ctl func(args ...string) (int, string)) string {
	_, out := ctl("status")
	return out
}
