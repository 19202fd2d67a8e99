package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
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
	// A port not delivered degrades the node (status exits 1, /readyz
	// 503, wait --for=healthy waits), and says why.
	if s := r.d.Status(); !s.Degraded || !slices.ContainsFunc(s.Degrading(), func(c api.Condition) bool { return c.Type == api.CondPortDelivered }) {
		t.Errorf("while the hook fails: degraded %v by %+v, want degraded by PortDelivered", s.Degraded, s.Degrading())
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
	waitFor(t, "not degraded once delivered", 10*time.Second, func() bool { return !r.d.Status().Degraded })
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

// TestPortLostAndBack is issue 39's acceptance 4, through the daemon: the
// stub refuses binds for longer than the bound (cut from 15 minutes to
// 6 s by RunOptions.PortLostAfter, a test knob; the product keeps 15
// minutes). A failed bind or two is not a loss: everything stays. Past
// the bound the port is closed everywhere: the DNAT is gone from nft,
// the port file is gone, nodeagent_forwarded_port reads 0 (the series
// kept), GET /v1/portforward answers 0, status says lost and since when,
// and the hook ran once with NODEAGENT_PIA_PORT_LOST=1. Binds accepted
// again: all of it back, and the hook told the port. The series the
// daemon emitted throughout, scraped every second, is then the input of
// promtool tests of the shipped rules (a second a minute):
// NodeagentForwardedPortMissing fires on it 10 minutes into the loss and
// resolves when the port is back.
func TestPortLostAndBack(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no promtool, and nothing here is the kernel's alone (the DNAT's removal is any other sync's)")
	}
	const lostAfter = 6 * time.Second
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	log := filepath.Join(l.Dir, "hook.log")
	hook := filepath.Join(l.Dir, "hook.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\necho \"$NODEAGENT_PIA_PORT $NODEAGENT_PIA_PREVIOUS_PORT $NODEAGENT_PIA_PORT_LOST\" >> "+log+"\n"), 0o755)
	l.PIA = fmt.Sprintf("      portForward:\n        enabled: true\n        to: 10.10.50.20\n        toPort: 8080\n        onChange: [%s]\n        every: 0s\n", hook)
	l.WriteConfig(t, "stub_ams")
	serveVLAN(t, l.LAN, 8080)
	// The daemon listens in its node's namespace: a free port there, and
	// a client that dials there.
	ml, err := l.Node.Host.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ml.Addr().String()
	ml.Close()
	metricsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: l.Node.Host.DialContext}}
	socket := filepath.Join(l.Dir, "run", "nodeagent.sock")
	os.MkdirAll(filepath.Dir(socket), 0o755)
	r := startDaemon(t, l.Node, l.Config, func(o *RunOptions) {
		o.StateDir, o.PIATimers, o.MetricsAddr, o.Socket, o.PortLostAfter = l.StateDir, fastPF, metricsAddr, socket, lostAfter
	})
	r.socket = socket
	file := filepath.Join(filepath.Dir(socket), "pia", l.Dev+".port")
	get := func(path string) string {
		resp, err := metricsClient.Get("http://" + metricsAddr + path)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	endpoint := func() int {
		var b struct{ Port int }
		if json.Unmarshal([]byte(get("/v1/portforward")), &b) != nil {
			return -1
		}
		return b.Port
	}
	seriesRe := regexp.MustCompile(`(?m)^nodeagent_forwarded_port\{device="` + l.Dev + `"\} (\d+)$`)
	metric := func() int {
		m := seriesRe.FindStringSubmatch(get("/metrics"))
		if m == nil {
			return -1 // no series
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	// dnat: the port's DNAT in nodeagent's table (no chain: none).
	dnat := func(port int) bool {
		out, _ := l.Node.TryExec("nft", "list", "chain", "inet", "nodeagent", "prerouting")
		return strings.Contains(out, "dport "+strconv.Itoa(port)+" ") && strings.Contains(out, "dnat")
	}
	fileHas := func() string { b, _ := os.ReadFile(file); return strings.TrimSpace(string(b)) }

	waitFor(t, "the port bound", 60*time.Second, func() bool { return forwardedPort(r) != 0 })
	port := forwardedPort(r)
	published := func(port int) func() bool {
		return func() bool {
			return dnat(port) && fileHas() == strconv.Itoa(port) && metric() == port && endpoint() == port
		}
	}
	if !waitUntil(10*time.Second, published(port)) {
		t.Fatalf("port %d not published: dnat %v, file %q, metric %d, endpoint %d", port, dnat(port), fileHas(), metric(), endpoint())
	}
	waitFor(t, "the hook told the port", 10*time.Second, func() bool { return len(hookLines(log)) == 1 })

	// The series, scraped every second from here on.
	var mu sync.Mutex
	var samples []int
	sampling, stopSampling := context.WithCancel(t.Context())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			v := metric()
			mu.Lock()
			samples = append(samples, v)
			mu.Unlock()
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
			}
		}
	}()
	time.Sleep(3 * time.Second)

	// Binds refused: a failed bind or two is no loss.
	l.Stub.RefuseBinds(true)
	refusedAt := time.Now()
	waitFor(t, "a refused bind", 10*time.Second, func() bool { return tunnel(r).PortError != "" })
	time.Sleep(time.Second)
	if tu := tunnel(r); tu.ForwardedPort != port || tu.PortLost != nil || tu.PortTroubleSince == nil || !dnat(port) || fileHas() != strconv.Itoa(port) || metric() != port || endpoint() != port {
		t.Errorf("%s after the first refused bind: status port %d lost %+v trouble %v, dnat %v, file %q, metric %d, endpoint %d; want all still %d",
			time.Since(refusedAt).Round(100*time.Millisecond), tu.ForwardedPort, tu.PortLost, tu.PortTroubleSince, dnat(port), fileHas(), metric(), endpoint(), port)
	}
	waitFor(t, "the port lost", lostAfter+10*time.Second, func() bool { return tunnel(r).PortLost != nil })
	t.Logf("binds refused -> port %d lost after %s (bound %s)", port, time.Since(refusedAt).Round(100*time.Millisecond), lostAfter)
	waitFor(t, "the lost port closed everywhere", 5*time.Second, func() bool {
		_, err := os.Stat(file)
		return !dnat(port) && os.IsNotExist(err) && metric() == 0 && endpoint() == 0
	})
	tu := tunnel(r)
	if tu.ForwardedPort != 0 || tu.PortLost.Port != port || tu.PortLost.Since.Before(refusedAt) || tu.PortLost.Since.After(time.Now()) {
		t.Errorf("status with the port lost: forwarded %d, lost %+v (refused from %s)", tu.ForwardedPort, tu.PortLost, refusedAt.UTC().Format(time.RFC3339Nano))
	}
	t.Logf("status: port lost %+v, trouble since %v", *tu.PortLost, tu.PortTroubleSince)
	waitFor(t, "the hook told the port is lost", 10*time.Second, func() bool { return len(hookLines(log)) == 2 })
	if got, want := hookLines(log)[1], fmt.Sprintf("0 %d 1", port); got != want {
		t.Errorf("the hook's run for the lost port saw %q, want %q", got, want)
	}
	if !waitUntil(5*time.Second, func() bool { return portDelivered(r).Status == api.True }) || !strings.Contains(portDelivered(r).Message, fmt.Sprintf("port lost (was %d)", port)) {
		t.Errorf("PortDelivered with the port lost and the hook told: %+v", portDelivered(r))
	}
	// Lost long enough for the alert's 10 minutes, a second a minute.
	time.Sleep(13 * time.Second)
	if n := len(hookLines(log)); n != 2 {
		t.Errorf("the hook ran %d times while the port stayed lost, want once", n-1)
	}

	// Binds accepted again: all of it back.
	l.Stub.RefuseBinds(false)
	back := time.Now()
	waitFor(t, "the port bound again", 20*time.Second, func() bool { return tunnel(r).PortLost == nil && forwardedPort(r) != 0 })
	again := forwardedPort(r)
	if !waitUntil(10*time.Second, published(again)) {
		t.Fatalf("port %d not published again: dnat %v, file %q, metric %d, endpoint %d", again, dnat(again), fileHas(), metric(), endpoint())
	}
	t.Logf("binds accepted -> port %d published again after %s", again, time.Since(back).Round(100*time.Millisecond))
	waitFor(t, "the hook told the port", 10*time.Second, func() bool { return len(hookLines(log)) == 3 })
	if got, want := hookLines(log)[2], fmt.Sprintf("%d %d 0", again, port); got != want {
		t.Errorf("the hook's run for the port bound again saw %q, want %q", got, want)
	}
	if !reachTCP(l.Stub.Inet, public(again), time.Second) {
		t.Error("the port bound again does not reach the VLAN host")
	}
	time.Sleep(3 * time.Second)
	stopSampling()
	<-sampled

	// The alert on exactly that series.
	mu.Lock()
	series := slices.Clone(samples)
	mu.Unlock()
	promtoolLostPort(t, l.Dev, series, port, again)
}

// promtoolLostPort runs promtool's rule tests of the shipped rules on the
// series the daemon emitted (one sample a minute): the alert on a port
// that is on but not bound fires 10 minutes into the run of zeros and is
// gone at its first sample after it.
func promtoolLostPort(t *testing.T, dev string, series []int, port, again int) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is missing (make test installs Debian's prometheus package)")
	}
	rules, err := filepath.Abs("../packaging/monitoring/nodeagent-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	z, b := -1, -1
	for i, v := range series {
		if v < 0 {
			values = append(values, "_") // no series in that scrape
			continue
		}
		values = append(values, strconv.Itoa(v))
		if v == 0 && z < 0 {
			z = i
		}
		if v != 0 && z >= 0 && b < 0 {
			b = i
		}
	}
	t.Logf("nodeagent_forwarded_port{device=%q} as scraped each second: %s", dev, strings.Join(values, " "))
	if z < 0 || b < 0 || b-z < 11 || series[0] != port || series[len(series)-1] != again {
		t.Fatalf("the series has no run of 11 zeros between the port and the port bound again (zeros from %d, back at %d)", z, b)
	}
	for _, v := range series[z:b] {
		if v != 0 {
			t.Fatalf("the run of zeros is broken: %v", series[z:b])
		}
	}
	summary, runbook := alertAnnotations(t, rules, "NodeagentForwardedPortMissing")
	summary = strings.NewReplacer("{{ $labels.device }}", dev, "{{ $labels.instance }}", "n1").Replace(summary)
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	firing := fmt.Sprintf(`[{exp_labels: {severity: warning, device: %s, instance: n1}, exp_annotations: {summary: %s, runbook: %s}}]`, dev, q(summary), q(runbook))
	test := fmt.Sprintf(`rule_files: [%s]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'nodeagent_forwarded_port{device="%s",instance="n1"}', values: '%s'}
    alert_rule_test:
      - {eval_time: %dm, alertname: NodeagentForwardedPortMissing, exp_alerts: []}
      - {eval_time: %dm, alertname: NodeagentForwardedPortMissing, exp_alerts: []}
      - {eval_time: %dm, alertname: NodeagentForwardedPortMissing, exp_alerts: %s}
      - {eval_time: %dm, alertname: NodeagentForwardedPortMissing, exp_alerts: %s}
      - {eval_time: %dm, alertname: NodeagentForwardedPortMissing, exp_alerts: []}
      - {eval_time: %dm, alertname: NodeagentForwardedPortMissing, exp_alerts: []}
`, rules, dev, strings.Join(values, " "), z, z+9, z+10, firing, b-1, firing, b, len(series)-1)
	f := filepath.Join(t.TempDir(), "lost.test.yml")
	os.WriteFile(f, []byte(test), 0o644)
	out, err := exec.Command(promtool, "test", "rules", f).CombinedOutput()
	t.Logf("promtool test rules on the daemon's series (zeros from minute %d, the port back at minute %d): firing at %dm, resolved at %dm:\n%s", z, b, z+10, b, strings.TrimSpace(string(out)))
	if err != nil {
		t.Errorf("promtool: %v\n%s", err, test)
	}
}

// alertAnnotations reads an alert's summary and runbook from the rules.
func alertAnnotations(t *testing.T, rules, name string) (summary, runbook string) {
	b, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r.Annotations["summary"], r.Annotations["runbook"]
			}
		}
	}
	t.Fatalf("no alert %s in %s", name, rules)
	return "", ""
}

// TestReloadNewHookDuringSlowRun is issue 39's acceptance 5 (first part),
// through the daemon: a reload that changes onChange while the old
// command runs (3 s): the new command runs within 1 s of the old run's
// end, although the old one succeeded and every is 5 minutes.
func TestReloadNewHookDuringSlowRun(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: it times the hook scheduler, not the kernel")
	}
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	log := filepath.Join(l.Dir, "hook.log")
	old := filepath.Join(l.Dir, "old.sh")
	neu := filepath.Join(l.Dir, "new.sh")
	os.WriteFile(old, []byte("#!/bin/sh\necho old start $(date +%s.%N) >> "+log+"\nsleep 3\necho old end $(date +%s.%N) >> "+log+"\n"), 0o755)
	os.WriteFile(neu, []byte("#!/bin/sh\necho new start $(date +%s.%N) >> "+log+"\n"), 0o755)
	cfg := func(hook string) {
		l.PIA = fmt.Sprintf("      portForward:\n        enabled: true\n        onChange: [%s]\n        every: 5m\n", hook)
		l.WriteConfig(t, "stub_ams")
	}
	cfg(old)
	r := startPIA(t, l, fastPF)
	waitFor(t, "the old command running", 60*time.Second, func() bool { h := tunnel(r).PortHook; return h != nil && h.Running })
	cfg(neu)
	if res := r.d.Reload(t.Context()); !res.Applied {
		t.Fatalf("reload: %+v", res)
	}
	waitFor(t, "the new command's run", 15*time.Second, func() bool { return strings.Contains(qbtReadFile(log), "new start") })
	at := map[string]float64{}
	for _, line := range hookLines(log) {
		f := strings.Fields(line)
		if len(f) == 3 {
			at[f[0]+" "+f[1]], _ = strconv.ParseFloat(f[2], 64)
		}
	}
	gap := time.Duration((at["new start"] - at["old end"]) * float64(time.Second))
	t.Logf("reload during the old command's run -> the new command ran %s after the old run ended (every 5m)", gap.Round(time.Millisecond))
	if at["old end"] == 0 || gap < 0 || gap > time.Second {
		t.Errorf("the new command ran %s after the old run's end, want within 1s:\n%s", gap, qbtReadFile(log))
	}
	waitFor(t, "PortDelivered by the new command", 10*time.Second, func() bool { return portDelivered(r).Status == api.True })
}

// waitUntil polls ok until it holds or d passed; it reports whether it
// held.
func waitUntil(d time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(d); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
