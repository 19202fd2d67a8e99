package portfwd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/hookrun"
	"github.com/nodeagent/nodeagent/agent/metrics"
	dto "github.com/prometheus/client_model/go"
)

// TestHookWant: what the hook is told as the port comes, moves, is lost
// and comes back.
func TestHookWant(t *testing.T) {
	h := &hook{s: hookrun.Start(t.Context(), hookrun.Config{Device: "wg-pia", Argv: []string{"/bin/true"}, Timeout: time.Second}, nil, nil)}
	defer h.s.Stop()
	for _, step := range []struct {
		port int
		lost bool
		want hookrun.State
	}{
		{47000, false, hookrun.State{Port: 47000}},
		{47000, false, hookrun.State{Port: 47000}},
		{51000, false, hookrun.State{Port: 51000, Previous: 47000}},
		{51000, true, hookrun.State{Port: 0, Previous: 51000, Lost: true}},
		{51000, true, hookrun.State{Port: 0, Previous: 51000, Lost: true}},
		{51000, false, hookrun.State{Port: 51000, Previous: 51000}},
		{52000, true, hookrun.State{Port: 0, Previous: 52000, Lost: true}},
		{53000, false, hookrun.State{Port: 53000, Previous: 52000}},
	} {
		h.want(step.port, step.lost)
		if h.st != step.want {
			t.Errorf("port %d lost %v: told %+v, want %+v", step.port, step.lost, h.st, step.want)
		}
		if got := h.s.Status().Want; got != step.want {
			t.Errorf("port %d lost %v: the scheduler has %+v", step.port, step.lost, got)
		}
	}
}

// TestJudge: a port is lost once its trouble lasted LostAfter, not
// before (a single failed bind is no loss); a device with port
// forwarding off, or unknown, has no port.
func TestJudge(t *testing.T) {
	m := New(Options{})
	m.Configure(map[string]Device{"wg-pia": {Enabled: true}, "wg-off": {}})
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		dev  string
		b    Bind
		now  time.Time
		want State
	}{
		{"bound", "wg-pia", Bind{Port: 47000}, t0, State{Port: 47000}},
		{"a failed re-bind a minute ago", "wg-pia", Bind{Port: 47000, TroubleSince: t0}, t0.Add(time.Minute), State{Port: 47000, TroubleSince: t0}},
		{"just short of the bound", "wg-pia", Bind{Port: 47000, TroubleSince: t0}, t0.Add(DefaultLostAfter - time.Second), State{Port: 47000, TroubleSince: t0}},
		{"at the bound", "wg-pia", Bind{Port: 47000, TroubleSince: t0}, t0.Add(DefaultLostAfter), State{LostPort: 47000, LostSince: t0.Add(DefaultLostAfter), TroubleSince: t0}},
		{"no port yet", "wg-pia", Bind{}, t0, State{}},
		{"port forwarding off", "wg-off", Bind{Port: 47000}, t0, State{}},
		{"not a PIA device", "wg0", Bind{Port: 47000}, t0, State{}},
	} {
		if diff := cmp.Diff(c.want, m.Judge(c.dev, c.b, c.now)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
}

func gauge(t *testing.T, m *metrics.Metrics, name, device string) (float64, bool) {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, x := range mf.GetMetric() {
			if labelIs(x, "device", device) {
				return x.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func labelIs(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// TestPublishLostAndBack: a port lost goes from the file, the metric (0,
// the series kept) and the endpoint; bound again, all of it comes back;
// port forwarding turned off removes the series and the file; a device
// gone from the config loses its file; another device's left-over file
// goes at the first publication.
func TestPublishLostAndBack(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "wgold.port"), []byte("41000\n"), 0o644)
	met := metrics.New()
	m := New(Options{Dir: dir, Metrics: met, LostAfter: time.Minute})
	m.Configure(map[string]Device{"wg-pia": {Enabled: true}})
	t0 := time.Now()
	file := filepath.Join(dir, "wg-pia.port")
	read := func() string { b, _ := os.ReadFile(file); return strings.TrimSpace(string(b)) }
	endpoint := func() int { return met.ForwardedPort() }

	if !m.Publish(map[string]Bind{"wg-pia": {Port: 47000}}, t0) {
		t.Error("the first port is no change")
	}
	if read() != "47000" || endpoint() != 47000 {
		t.Errorf("bound: file %q, endpoint %d", read(), endpoint())
	}
	if _, err := os.Stat(filepath.Join(dir, "wgold.port")); !os.IsNotExist(err) {
		t.Error("a left-over port file of another device stayed")
	}
	// Trouble, not yet lost.
	if m.Publish(map[string]Bind{"wg-pia": {Port: 47000, TroubleSince: t0}}, t0.Add(30*time.Second)) {
		t.Error("trouble under the bound changed the port")
	}
	// Lost.
	if !m.Publish(map[string]Bind{"wg-pia": {Port: 47000, TroubleSince: t0}}, t0.Add(time.Minute)) {
		t.Error("a lost port is no change")
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the port file stayed with the port lost: %q", read())
	}
	if v, ok := gauge(t, met, "nodeagent_forwarded_port", "wg-pia"); !ok || v != 0 {
		t.Errorf("nodeagent_forwarded_port with the port lost: %v (series %v), want 0 and the series kept", v, ok)
	}
	if endpoint() != 0 || m.Port("wg-pia") != 0 || !m.State("wg-pia").Lost() {
		t.Errorf("lost: endpoint %d, port %d, state %+v", endpoint(), m.Port("wg-pia"), m.State("wg-pia"))
	}
	// Bound again (another port).
	if !m.Publish(map[string]Bind{"wg-pia": {Port: 51000}}, t0.Add(2*time.Minute)) {
		t.Error("a port bound again is no change")
	}
	if read() != "51000" || endpoint() != 51000 || m.State("wg-pia").Lost() {
		t.Errorf("bound again: file %q, endpoint %d, state %+v", read(), endpoint(), m.State("wg-pia"))
	}
	// Port forwarding off: no series, no file.
	m.Configure(map[string]Device{"wg-pia": {}})
	m.Publish(map[string]Bind{"wg-pia": {Port: 51000}}, t0.Add(3*time.Minute))
	if _, ok := gauge(t, met, "nodeagent_forwarded_port", "wg-pia"); ok {
		t.Error("the series stayed with port forwarding off")
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) || endpoint() != 0 {
		t.Errorf("port forwarding off: file %q, endpoint %d", read(), endpoint())
	}
	// On again, then the device gone.
	m.Configure(map[string]Device{"wg-pia": {Enabled: true}})
	m.Publish(map[string]Bind{"wg-pia": {Port: 51000}}, t0.Add(4*time.Minute))
	m.Configure(nil)
	m.Publish(nil, t0.Add(5*time.Minute))
	if _, err := os.Stat(file); !os.IsNotExist(err) || endpoint() != 0 {
		t.Errorf("device gone: file %q, endpoint %d", read(), endpoint())
	}
	if _, ok := gauge(t, met, "nodeagent_forwarded_port", "wg-pia"); ok {
		t.Error("the series stayed with the device gone")
	}
}

// TestFilesPlan: the port files' plan, as its text.
func TestFilesPlan(t *testing.T) {
	for _, c := range []struct {
		want, have Files
		plan       string
	}{
		{Files{"wg-pia": 47000}, Files{}, "+ port file wg-pia.port: 47000"},
		{Files{"wg-pia": 47000}, Files{"wg-pia": 47000}, ""},
		{Files{"wg-pia": 51000}, Files{"wg-pia": 47000, "wg-b": 1}, "+ port file wg-pia.port: 51000\n- port file wg-b.port"},
		{Files{}, Files{"wg-pia": 0}, "- port file wg-pia.port"},
	} {
		var lines []string
		for _, op := range MakeFilesPlan(c.want, c.have) {
			lines = append(lines, op.String())
		}
		if got := strings.Join(lines, "\n"); got != c.plan {
			t.Errorf("want %v have %v: plan\n%s\nwant\n%s", c.want, c.have, got, c.plan)
		}
	}
}

// TestConditionRefused: a hook that exits 77 makes PortDelivered say the
// credentials were refused, with the hook's own line and when the next
// attempt is; held, it says what to do.
func TestConditionRefused(t *testing.T) {
	hookPath := filepath.Join(t.TempDir(), "hook")
	os.WriteFile(hookPath, []byte("#!/bin/sh\necho 'qbittorrent-port: login to http://10.10.50.10:8080 refused (HTTP 401)'\nexit 77\n"), 0o755)
	met := metrics.New()
	ran := make(chan string, 16)
	m := New(Options{Metrics: met, Hooks: HookTimers{RefusedWait: 300 * time.Millisecond, RefusedMax: 2}, Ran: func(d string) { ran <- d }})
	m.Start(t.Context())
	m.Configure(map[string]Device{"wg-pia": {Enabled: true, Argv: []string{hookPath}, Timeout: 5 * time.Second}})
	defer func() { m.Stop(); m.Wait(10 * time.Second) }()
	m.Publish(map[string]Bind{"wg-pia": {Port: 47000}}, time.Now())
	<-ran
	c, ok := m.Condition(time.Now())
	if !ok || c.Status != api.False || c.Reason != "CredentialsRefused" || !strings.Contains(c.Message, "credentials refused (exit status 77: qbittorrent-port: login to http://10.10.50.10:8080 refused (HTTP 401)); next attempt in") {
		t.Errorf("after a refusal: %+v", c)
	}
	<-ran
	c, _ = m.Condition(time.Now())
	if c.Reason != "CredentialsRefused" || !strings.Contains(c.Message, "refused 2 times in a row") || !strings.Contains(c.Message, "nodeagentctl port --retry") {
		t.Errorf("held: %+v", c)
	}
	if h := m.Hook("wg-pia"); h == nil || !h.Held || h.Refused != 2 || h.NextRun != nil || h.LastTookSeconds == nil {
		t.Errorf("hook status held: %+v", h)
	}
	if devs, err := m.Retry("wg-pia"); err != nil || len(devs) != 1 {
		t.Errorf("Retry: %v %v", devs, err)
	}
	<-ran
	if _, err := m.Retry("wg0"); err == nil {
		t.Error("Retry of a device that is not a PIA device")
	}
}

// TestConditionDegradesOnlyOnFailure: PortDelivered is Unknown (Pending)
// while there is nothing to deliver yet, a port not bound (PIA still
// registering) or its first run due, so it does not degrade the node; it
// is False, which degrades it, once a delivery failed: the hook exited
// non-zero, or a port file could not be written, even on a device with
// no hook; and absent again once the files are written and no device
// has a hook.
func TestConditionDegradesOnlyOnFailure(t *testing.T) {
	dir := t.TempDir()
	fail := filepath.Join(t.TempDir(), "fail")
	os.WriteFile(fail, nil, 0o644)
	hookPath := filepath.Join(dir, "hook")
	os.WriteFile(hookPath, []byte("#!/bin/sh\n[ -e "+fail+" ] && { echo 'qbittorrent-port: no answer'; exit 1; }\nexit 0\n"), 0o755)
	ran := make(chan string, 16)
	m := New(Options{Ran: func(d string) { ran <- d }, Hooks: HookTimers{BackoffMin: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
	m.Start(t.Context())
	m.Configure(map[string]Device{"wg-pia": {Enabled: true, Argv: []string{hookPath}, Timeout: 5 * time.Second}})
	defer func() { m.Stop(); m.Wait(10 * time.Second) }()
	degrades := func(c api.Condition) bool {
		s := api.Status{Conditions: []api.Condition{c}}
		return len(s.Degrading()) > 0
	}

	// PIA still registering: no port.
	m.Publish(map[string]Bind{}, time.Now())
	c, ok := m.Condition(time.Now())
	if !ok || c.Status != api.Unknown || c.Reason != "Pending" || !strings.Contains(c.Message, "no port bound yet") || degrades(c) {
		t.Errorf("no port yet: %+v (degrades %v)", c, degrades(c))
	}
	// A port, and a hook that fails: False, degraded.
	m.Publish(map[string]Bind{"wg-pia": {Port: 47000}}, time.Now())
	<-ran
	c, _ = m.Condition(time.Now())
	if c.Status != api.False || c.Reason != "HookFailed" || !strings.Contains(c.Message, "qbittorrent-port: no answer") || !degrades(c) {
		t.Errorf("hook failed: %+v (degrades %v)", c, degrades(c))
	}
	// The hook succeeds: True.
	os.Remove(fail)
	for {
		<-ran
		if c, _ = m.Condition(time.Now()); c.Status == api.True {
			break
		}
	}
	if c.Reason != "Delivered" || degrades(c) {
		t.Errorf("delivered: %+v", c)
	}

	// A device without a hook whose port file cannot be written: its
	// directory is a file, then the file's name is a directory. False,
	// PortFileFailed, naming the path.
	blocked := filepath.Join(t.TempDir(), "run")
	os.WriteFile(blocked, nil, 0o644)
	pdir := filepath.Join(blocked, "pia")
	f := New(Options{Dir: pdir})
	f.Configure(map[string]Device{"wg-pia": {Enabled: true}})
	f.Publish(map[string]Bind{"wg-pia": {Port: 47000}}, time.Now())
	c, ok = f.Condition(time.Now())
	if !ok || c.Status != api.False || c.Reason != "PortFileFailed" || !strings.Contains(c.Message, "reading the port files in "+pdir) || !degrades(c) {
		t.Errorf("port files' directory a file: %+v %v", c, ok)
	}
	os.Remove(blocked)
	os.MkdirAll(filepath.Join(pdir, "wg-pia.port", "x"), 0o755)
	f.Publish(map[string]Bind{"wg-pia": {Port: 47000}}, time.Now())
	c, ok = f.Condition(time.Now())
	if !ok || c.Status != api.False || c.Reason != "PortFileFailed" || !strings.Contains(c.Message, "port file "+filepath.Join(pdir, "wg-pia.port")) || !degrades(c) {
		t.Errorf("port file a directory: %+v %v", c, ok)
	}
	// Fixed: written, and no hook, so absent.
	os.RemoveAll(filepath.Join(pdir, "wg-pia.port"))
	f.Publish(map[string]Bind{"wg-pia": {Port: 47000}}, time.Now())
	if c, ok := f.Condition(time.Now()); ok {
		t.Errorf("port file written, no hook: %+v", c)
	}
	if b, err := os.ReadFile(filepath.Join(pdir, "wg-pia.port")); err != nil || string(b) != "47000\n" {
		t.Errorf("port file: %q %v", b, err)
	}
}
