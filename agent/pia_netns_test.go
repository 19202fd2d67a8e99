package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The PIA tunnel against the stub (testenv/piastub): on the host kernel
// with userspace WireGuard, in the VM with the kernel's, on both sides.

// fastPIA are timers that keep the fault tests short; the bring-up and
// outage figures use the defaults.
var fastPIA = pia.Timers{HandshakeWait: 4 * time.Second, BackoffMin: 300 * time.Millisecond, BackoffMax: 3 * time.Second}

// startPIA runs the daemon on the lab with timers (zero: the defaults).
func startPIA(t testing.TB, l *piastub.Lab, timers pia.Timers) *running {
	t.Helper()
	return startDaemon(t, l.Node, l.Config, func(o *RunOptions) {
		o.StateDir = l.StateDir
		o.PIATimers = timers
	})
}

// tunnel is the lab device's provider state.
func tunnel(r *running) api.PIATunnel {
	for _, p := range r.d.Status().PIA {
		return p
	}
	return api.PIATunnel{}
}

func tunnelCondition(r *running) api.Condition {
	s := r.d.Status()
	if c := s.Condition(api.CondTunnelHealthy); c != nil {
		return *c
	}
	return api.Condition{}
}

func waitHealthy(t testing.TB, r *running, within time.Duration) time.Duration {
	t.Helper()
	return waitFor(t, "TunnelHealthy", within, func() bool { return tunnelCondition(r).Status == api.True })
}

// piaCounter reads a nodeagent_pia_* counter of the daemon's.
func piaCounter(t *testing.T, r *running, name, result string) float64 {
	t.Helper()
	mfs, err := r.d.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelIs(m, "result", result) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func labelIs(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// TestPIATunnel: from an empty node the daemon registers, the tunnel
// handshakes, the VLAN reaches the internet through it (the far side sees
// the stub's exit address only); a server restart at PIA is noticed and
// re-registered; nothing from the VLAN reaches the WAN outside the tunnel
// at any point, IPv4 or IPv6.
func TestPIATunnel(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	start := time.Now()
	r := startPIA(t, l, pia.Timers{})
	up := waitHealthy(t, r, 60*time.Second)
	t.Logf("nodeagent run start -> TunnelHealthy: %s (default timers; %s after the first convergence)", time.Since(start).Round(time.Millisecond), up.Round(time.Millisecond))
	if os.Getenv("PIA_DEBUG") != "" {
		t.Log(r.log.String())
	}
	tu := tunnel(r)
	if tu.ServerCN != "amsterdam401" || tu.Region != "stub_ams" || tu.PeerIP == "" || tu.Phase != "healthy" || tu.HandshakeAgeSeconds < 0 || tu.RegisteredSince == nil || tu.NextTokenRefresh == nil {
		t.Fatalf("tunnel status: %+v", tu)
	}
	if got := l.Stub.AddKeys(); got != 1 {
		t.Errorf("addKey requests: %d, want 1", got)
	}
	// The list first, then the token from the region's meta server (no
	// DNS needed), not the www host.
	if m, w := l.Stub.Count("token:meta:amsterdam401"), l.Stub.Count("token:www"); m != 1 || w != 0 {
		t.Errorf("token requests: %d at the meta server, %d at the www host; want 1 and 0", m, w)
	}
	// IPv6 from the VLAN has no tunnel (PIA is IPv4 only): it must fail
	// closed, not leave by the main table.
	if _, err := l.LAN.TryExec("ping", "-6", "-c", "2", "-i", "0.2", "-W", "1", "2001:db8:1::2"); err == nil {
		t.Error("the VLAN reached the WAN over IPv6")
	}
	waitFor(t, "the VLAN reaching the far side through the tunnel", 10*time.Second, l.PingFar)
	if exit, other := l.FarSaw(t); exit == 0 || other != 0 {
		t.Errorf("the far side saw %d packet(s) from the stub's exit address and %d from others; want some and none", exit, other)
	}
	l.NoLeaks(t, "bring-up")

	// A server restart: new key, peers gone. The VLAN pings all along.
	type result struct {
		at time.Time
		ok bool
	}
	stop := make(chan struct{})
	results := make(chan result, 1000)
	go func() {
		defer close(results)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ok := l.PingFar()
			results <- result{time.Now(), ok}
			if ok {
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()
	time.Sleep(time.Second)
	restart := time.Now()
	l.Stub.Servers[0].Restart()
	waitFor(t, "a new registration after the server restart", 60*time.Second, func() bool { return l.Stub.AddKeys() >= 2 })
	waitFor(t, "traffic again after the server restart", 30*time.Second, l.PingFar)
	time.Sleep(time.Second)
	close(stop)
	var after []result
	var lastFail time.Time
	for res := range results {
		if res.at.After(restart) {
			after = append(after, res)
			if !res.ok {
				lastFail = res.at
			}
		}
	}
	for _, res := range after {
		if res.ok && res.at.After(lastFail) {
			t.Logf("server restart -> traffic flowing again: %s (default timers; target < 15 s)", res.at.Sub(restart).Round(100*time.Millisecond))
			break
		}
	}
	waitHealthy(t, r, 30*time.Second)
	tu = tunnel(r)
	if tu.ServerCN != "amsterdam401" || !strings.Contains(tu.LastError, "probes of") {
		t.Errorf("after the restart: %+v (want the same server, and the unanswered probes as the reason it registered again)", tu)
	}
	if got := piaCounter(t, r, "nodeagent_pia_registrations_total", "ok"); got != 2 {
		t.Errorf("nodeagent_pia_registrations_total{result=ok} = %v, want 2", got)
	}
	l.NoLeaks(t, "the whole test")
	st, _ := json.Marshal(r.d.Status())
	if !strings.Contains(string(st), `"pia":[{"device":"`+l.Dev) {
		t.Errorf("status JSON has no pia section: %s", st)
	}
}

// TestPIAServerFailover: a server that stops answering UDP is given up
// after three failures and the region's next one is used; with every
// server down the provider keeps trying with backoff, the kill switch
// holds, and status says why; when they come back, so does the tunnel.
func TestPIAServerFailover(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	r := startPIA(t, l, fastPIA)
	waitHealthy(t, r, 60*time.Second)
	if cn := tunnel(r).ServerCN; cn != "amsterdam401" {
		t.Fatalf("registered with %s, want amsterdam401", cn)
	}
	l.Stub.Servers[0].StopUDP()
	moved := waitFor(t, "the move to amsterdam402", 90*time.Second, func() bool {
		tu := tunnel(r)
		return tu.ServerCN == "amsterdam402" && tu.Healthy
	})
	t.Logf("amsterdam401 stops answering UDP -> healthy on amsterdam402: %s (handshake wait 4s, backoff 0.3-3s)", moved.Round(100*time.Millisecond))
	if n := l.Stub.Count("addKey:amsterdam401"); n != 3 {
		t.Errorf("addKey requests at amsterdam401: %d, want 3 (the first registration and two retries)", n)
	}
	waitFor(t, "traffic through amsterdam402", 10*time.Second, l.PingFar)

	// Every server down, API and all.
	for _, s := range l.Stub.Servers {
		s.Down()
	}
	waitFor(t, "the tunnel given up", 60*time.Second, func() bool { return !tunnel(r).Healthy })
	before := piaCounter(t, r, "nodeagent_pia_registrations_total", "error")
	window := 20 * time.Second
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		if l.PingFar() {
			t.Fatal("the VLAN reached the far side with every server down")
		}
	}
	attempts := piaCounter(t, r, "nodeagent_pia_registrations_total", "error") - before
	c := tunnelCondition(r)
	tu := tunnel(r)
	t.Logf("all servers down for %s: %v failed registrations; condition %s: %s", window, attempts, c.Reason, c.Message)
	if attempts < 1 || attempts > 6 {
		t.Errorf("%v failed registrations in %s: want a few (backoff), not none and not a storm", attempts, window)
	}
	if c.Status != api.False || tu.LastError == "" || !strings.Contains(c.Message, tu.LastError) {
		t.Errorf("status does not say why: condition %+v, tunnel %+v", c, tu)
	}
	if s := r.d.Status(); !s.Ready || !s.Degraded {
		t.Errorf("with the tunnel down the node is ready %v, degraded %v; want ready and degraded", s.Ready, s.Degraded)
	}
	l.NoLeaks(t, "all servers down")
	for _, s := range l.Stub.Servers {
		s.Up()
	}
	back := waitHealthy(t, r, 90*time.Second)
	t.Logf("servers back -> healthy: %s", back.Round(100*time.Millisecond))
	waitFor(t, "traffic again", 10*time.Second, l.PingFar)
	l.NoLeaks(t, "the whole test")
}

// TestPIATokenRefresh: a token is replaced before it expires without
// touching the tunnel; an addKey that says "Login failed" gets a new
// token at once.
func TestPIATokenRefresh(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.Stub.TokenTTL(6 * time.Second)
	timers := fastPIA
	timers.TokenRefresh = 3 * time.Second
	r := startPIA(t, l, timers)
	waitHealthy(t, r, 60*time.Second)
	reg := tunnel(r).RegisteredSince
	deadline := time.Now().Add(10 * time.Second)
	failed := 0
	for time.Now().Before(deadline) {
		if !l.PingFar() {
			failed++
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := piaCounter(t, r, "nodeagent_pia_tokens_total", "refreshed"); got < 2 {
		t.Errorf("tokens refreshed in 10s with a 3s refresh: %v, want >= 2", got)
	}
	if n := l.Stub.AddKeys(); n != 1 || failed > 0 || !tunnel(r).RegisteredSince.Equal(*reg) {
		t.Errorf("the refresh touched the tunnel: %d addKey requests, %d pings lost, registered %v then %v", n, failed, reg, tunnel(r).RegisteredSince)
	}

	// The token is refused at the next registration: a new one at once.
	l.Stub.LoginFailed(1)
	tokens := l.Stub.Tokens()
	l.Stub.Servers[0].Restart()
	waitFor(t, "registered again", 60*time.Second, func() bool { return l.Stub.AddKeys() >= 3 && tunnel(r).Healthy })
	if got := piaCounter(t, r, "nodeagent_pia_registrations_total", "login_failed"); got != 1 {
		t.Errorf("registrations login_failed: %v, want 1", got)
	}
	if l.Stub.Tokens() <= tokens {
		t.Error("no new token after Login failed")
	}
}

// TestPIACredentialsRejected: a 401 is "credentials rejected" in status,
// asked once (no retry storm), and a reload retries at once.
func TestPIACredentialsRejected(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.Stub.TokenStatus(http.StatusUnauthorized, "")
	r := startPIA(t, l, fastPIA)
	waitFor(t, "credentials rejected in status", 30*time.Second, func() bool {
		return strings.Contains(tunnelCondition(r).Message, "credentials rejected")
	})
	time.Sleep(6 * time.Second)
	if n := l.Stub.Tokens(); n != 1 {
		t.Errorf("token requests after a 401, over 6s: %d, want 1", n)
	}
	if tu := tunnel(r); tu.Phase != "token" || tu.RetryAt == nil || time.Until(*tu.RetryAt) < 5*time.Minute {
		t.Errorf("after a 401: %+v (want phase token and a retry minutes away)", tu)
	}
	if got := piaCounter(t, r, "nodeagent_pia_tokens_total", "rejected"); got != 1 {
		t.Errorf("tokens rejected: %v, want 1", got)
	}
	if s := r.d.Status(); !s.Ready || !s.Degraded {
		t.Errorf("ready %v degraded %v, want ready and degraded", s.Ready, s.Degraded)
	}
	// The operator fixes the account and reloads: tried again at once.
	l.Stub.TokenStatus(0, "")
	if res := r.d.Reload(t.Context()); !res.Applied {
		t.Fatalf("reload: %+v", res)
	}
	waitHealthy(t, r, 30*time.Second)
}

// TestPIARetryAfter: a 429 is retried no sooner than its Retry-After.
func TestPIARetryAfter(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.Stub.TokenStatus(http.StatusTooManyRequests, "3")
	r := startPIA(t, l, fastPIA)
	waitFor(t, "the first token request", 30*time.Second, func() bool { return l.Stub.Tokens() >= 1 })
	l.Stub.TokenStatus(0, "")
	waitHealthy(t, r, 30*time.Second)
	ts := l.Stub.TokenTimes()
	if len(ts) != 2 {
		t.Fatalf("token requests: %d, want 2 (the 429, then the retry)", len(ts))
	}
	if gap := ts[1].Sub(ts[0]); gap < 3*time.Second {
		t.Errorf("retried %s after a 429 with Retry-After: 3", gap)
	} else {
		t.Logf("429 with Retry-After: 3 -> retried after %s", gap.Round(100*time.Millisecond))
	}
	if !strings.Contains(tunnel(r).LastError, "HTTP 429") {
		t.Errorf("last error %q does not name the 429", tunnel(r).LastError)
	}
}

// TestPIAServerList: a tampered list is refused; with a cached list the
// provider keeps using it and says so, without one it does not register.
func TestPIAServerList(t *testing.T) {
	t.Run("cached", func(t *testing.T) {
		l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
		r := startPIA(t, l, fastPIA)
		waitHealthy(t, r, 60*time.Second)
		r.stop(t)
		l.Stub.TamperList(true)
		lists := l.Stub.Count("list")
		timers := fastPIA
		timers.ListRefresh = time.Millisecond // fetch at once
		r = startPIA(t, l, timers)
		waitFor(t, "the tampered list refused", 30*time.Second, func() bool {
			return strings.Contains(tunnel(r).ServerList, "does not verify") && strings.Contains(tunnel(r).ServerList, "using the cached list")
		})
		waitHealthy(t, r, 30*time.Second)
		if l.Stub.Count("list") <= lists {
			t.Error("the list was not fetched again")
		}
		if n := l.Stub.AddKeys(); n != 1 {
			t.Errorf("addKey requests: %d, want 1 (the saved registration re-adopted)", n)
		}
	})
	t.Run("no cache", func(t *testing.T) {
		l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
		l.Stub.TamperList(true)
		r := startPIA(t, l, fastPIA)
		waitFor(t, "the tampered list refused", 30*time.Second, func() bool {
			return strings.Contains(tunnelCondition(r).Message, "does not verify")
		})
		time.Sleep(2 * time.Second)
		if n := l.Stub.AddKeys(); n != 0 || tunnel(r).Healthy {
			t.Errorf("registered from a tampered list: %d addKey requests, %+v", n, tunnel(r))
		}
	})
}

// TestPIACertificates: a leaf naming another cn, or signed by another CA,
// is refused and nothing but the TLS handshake reaches that server; a
// leaf naming the cn in its subject CN only (no SAN) is accepted.
func TestPIACertificates(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{Regions: []piastub.RegionSpec{{ID: "stub_pki", Servers: []piastub.ServerSpec{
		{CN: "wrongcn501", WrongCN: true}, {CN: "otherca502", OtherCA: true}, {CN: "cnonly503", CNOnly: true},
	}}}}, "stub_pki")
	r := startPIA(t, l, fastPIA)
	waitHealthy(t, r, 90*time.Second)
	if cn := tunnel(r).ServerCN; cn != "cnonly503" {
		t.Errorf("registered with %s, want cnonly503", cn)
	}
	for _, cn := range []string{"wrongcn501", "otherca502"} {
		if n := l.Stub.Count("http:" + cn); n != 0 {
			t.Errorf("%s (bad certificate) got %d HTTP request(s), want none", cn, n)
		}
		if n := l.Stub.Count("tls:" + cn); n == 0 {
			t.Errorf("%s: no TLS handshake was even tried", cn)
		}
	}
	if n := l.Stub.Count("addKey:cnonly503"); n != 1 {
		t.Errorf("addKey at cnonly503: %d, want 1", n)
	}
	if n := l.Stub.Count("token:www"); n == 0 {
		t.Error("with both meta servers' certificates bad, the token did not come from the www host")
	}
	waitFor(t, "traffic", 10*time.Second, l.PingFar)
}

// TestPIARestart: a clean stop and a new daemon re-adopt the running
// registration: no new addKey, and with the kernel's WireGuard the device
// keeps its ifindex and its session.
func TestPIARestart(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	r := startPIA(t, l, fastPIA)
	waitHealthy(t, r, 60*time.Second)
	link, err := l.Node.NL.LinkByName(l.Dev)
	if err != nil {
		t.Fatal(err)
	}
	before := tunnel(r)
	kernel := r.d.Status().WireGuard[0].Implementation == "kernel"
	r.stop(t)
	if kernel {
		// The tunnel carries traffic while no daemon runs.
		waitFor(t, "traffic with the daemon stopped", 10*time.Second, l.PingFar)
	}
	start := time.Now()
	r = startPIA(t, l, fastPIA)
	waitHealthy(t, r, 60*time.Second)
	t.Logf("restart -> TunnelHealthy: %s (kernel %v)", time.Since(start).Round(time.Millisecond), kernel)
	after := tunnel(r)
	if n := l.Stub.AddKeys(); n != 1 {
		t.Errorf("addKey requests: %d, want 1 (re-adopted)", n)
	}
	if after.PeerIP != before.PeerIP || !after.RegisteredSince.Equal(*before.RegisteredSince) {
		t.Errorf("registration changed: %+v -> %+v", before, after)
	}
	if kernel {
		l2, err := l.Node.NL.LinkByName(l.Dev)
		if err != nil || l2.Attrs().Index != link.Attrs().Index {
			t.Errorf("device index %d -> %v (%v): the device was recreated", link.Attrs().Index, l2, err)
		}
	}
	waitFor(t, "traffic", 10*time.Second, l.PingFar)
	l.NoLeaks(t, "restart")
}

// TestPIALabelsAndSecrets: the conditional label wireguard/DEV/healthy
// follows the PIA tunnel and the forwarded port is annotated (on a real
// kube-apiserver, with the node's own identity), and no secret (token,
// password, private key, port payload or signature) appears in the log,
// the plan, the status JSON, the metrics or the Node.
func TestPIALabelsAndSecrets(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no etcd or kube-apiserver")
	}
	kubetest.Require(t)
	srv := kubetest.Start(t)
	ctx := t.Context()
	if err := srv.CreateNode(ctx, "node-pia", nil); err != nil {
		t.Fatal(err)
	}
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	kubeconfig := filepath.Join(l.Dir, "kubelet.kubeconfig")
	if err := srv.WriteNodeKubeconfig(kubeconfig, "node-pia"); err != nil {
		t.Fatal(err)
	}
	const label = "homelab.example/egress-gateway"
	l.Extra = fmt.Sprintf(`node: {name: node-pia}
kubernetes:
  kubeconfig: %s
  hold: 0s
  conditionalLabels:
    - {key: %s, value: "true", when: wireguard/%s/healthy}
`, kubeconfig, label, l.Dev)
	l.PIA = "      portForward: true"
	l.WriteConfig(t, "stub_ams")
	r := startPIA(t, l, fastPIA)
	node := func() *corev1.Node {
		n, err := srv.Admin.CoreV1().Nodes().Get(ctx, "node-pia", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "the label with the tunnel healthy", 90*time.Second, func() bool { return node().Labels[label] == "true" })
	waitFor(t, "the forwarded port's annotation", 60*time.Second, func() bool {
		p := tunnel(r).ForwardedPort
		return p != 0 && node().Annotations["nodeagent.io/pia-forwarded-port"] == fmt.Sprint(p)
	})
	// A server restart brings a new port; the annotation follows.
	first := tunnel(r).ForwardedPort
	l.Stub.Servers[0].Restart()
	waitFor(t, "the new port's annotation", 90*time.Second, func() bool {
		p := tunnel(r).ForwardedPort
		return p != 0 && p != first && node().Annotations["nodeagent.io/pia-forwarded-port"] == fmt.Sprint(p)
	})
	for _, s := range l.Stub.Servers {
		s.Down()
	}
	gone := waitFor(t, "the label gone with every server down", 90*time.Second, func() bool { _, ok := node().Labels[label]; return !ok })
	t.Logf("every server down -> label removed: %s", gone.Round(100*time.Millisecond))
	for _, s := range l.Stub.Servers {
		s.Up()
	}
	waitFor(t, "the label back", 90*time.Second, func() bool { return node().Labels[label] == "true" })

	key, err := os.ReadFile(filepath.Join(l.StateDir, "pia", l.Dev+".key"))
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"private key": strings.TrimSpace(string(key)), "password": "hunter2-stub"}
	for i, tok := range l.Stub.IssuedTokens() {
		secrets[fmt.Sprintf("token %d", i)] = tok
	}
	if len(secrets) < 3 {
		t.Fatal("the stub issued no token")
	}
	pls := l.Stub.IssuedPayloads()
	if len(pls) == 0 {
		t.Fatal("the stub issued no port-forwarding payload")
	}
	for i, pl := range pls {
		secrets[fmt.Sprintf("port-forwarding payload or signature %d", i)] = pl
	}
	st, _ := json.Marshal(r.d.Status())
	plan, _ := json.Marshal(r.d.Plan(ctx))
	var scrape strings.Builder
	mfs, _ := r.d.Metrics().Registry.Gather()
	for _, mf := range mfs {
		scrape.WriteString(mf.String())
	}
	nj, _ := json.Marshal(node())
	for what, text := range map[string]string{"log": r.log.String(), "status": string(st), "plan": string(plan), "metrics": scrape.String(), "Node": string(nj)} {
		for name, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("the %s appears in the %s", name, what)
			}
		}
	}
}

// TestPIAAutoRegion: region auto takes the region whose first meta server
// answers a TCP connect soonest; one that does not answer loses.
func TestPIAAutoRegion(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "auto")
	l.Stub.Servers[0].MetaDown() // stub_ams's first meta server
	r := startPIA(t, l, fastPIA)
	waitHealthy(t, r, 60*time.Second)
	if tu := tunnel(r); tu.Region != "stub_nyc" || tu.ServerCN != "newyork403" {
		t.Errorf("auto chose %s (%s), want stub_nyc: stub_ams's meta server does not answer, stub_gone is offline", tu.Region, tu.ServerCN)
	}
	waitFor(t, "traffic", 10*time.Second, l.PingFar)
}

// TestPIASlowAPI: PIA's API answering slower than the call deadline is a
// timeout in status, never a wedged loop: the daemon answers its API and
// keeps converging meanwhile; once the API is quick again, it registers.
func TestPIASlowAPI(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.Stub.Slow(12 * time.Second) // over the 10 s bound of a call
	r := startPIA(t, l, fastPIA)
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		p := r.d.Plan(t.Context())
		if d := time.Since(t0); d > time.Second || p.Error != "" {
			t.Fatalf("a plan asked while PIA is slow took %s (error %q)", d, p.Error)
		}
		time.Sleep(time.Second)
	}
	waitFor(t, "the timeout in status", 40*time.Second, func() bool {
		// net/http says "Client.Timeout exceeded", a context "deadline
		// exceeded": either is the timeout.
		e := strings.ToLower(tunnel(r).LastError)
		return strings.Contains(e, "deadline exceeded") || strings.Contains(e, "timeout")
	})
	if n := l.Stub.AddKeys(); n != 0 || tunnel(r).Healthy {
		t.Errorf("registered while the API timed out: %d addKey requests", n)
	}
	l.Stub.Slow(0)
	waitHealthy(t, r, 60*time.Second)
	l.NoLeaks(t, "slow API")
}
