package gateway

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

const testLabel = "homelab.example/egress-gateway"

// node is one candidate: its namespace, its Role, and a stand-in for the
// reconcile loop that claims and gives up the gateway address as Want
// says (probe, add, announce; or delete), as netcfg/link does.
type node struct {
	name   string
	ns     *testenv.NetNS
	role   *Role
	cancel context.CancelFunc
	done   chan struct{}
	proxy  *testenv.Proxy
	log    *strings.Builder
	logMu  sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

var gw = netip.MustParsePrefix("10.10.50.1/24")

func roleConfig() config.Gateway {
	return config.Gateway{
		Name:      "vlan50-egress",
		Lease:     config.GatewayLease{Namespace: "nodeagent", Name: "vlan50-egress", Duration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond},
		Link:      "shim0",
		Addresses: []string{gw.String()},
		Labels:    map[string]string{testLabel: "true"},
		Probe:     config.DAD{Probes: 1, Interval: 100 * time.Millisecond, Wait: 300 * time.Millisecond, Announcements: 2},
	}
}

// start runs n's Role and its loop stand-in.
func (n *node) start(t *testing.T, srv *kubetest.Server, lease *rest.Config) {
	t.Helper()
	n.startWith(t, srv, lease, roleConfig())
}

func (n *node) startWith(t *testing.T, srv *kubetest.Server, lease *rest.Config, rc config.Gateway) {
	t.Helper()
	nodeCfg, err := srv.NodeConfig(n.name)
	if err != nil {
		t.Fatal(err)
	}
	n.log = &strings.Builder{}
	changed := make(chan struct{}, 1)
	r, err := New(Config{Role: rc, Identity: n.name, Lease: lease, Node: nodeCfg, Host: n.ns.Host,
		Log: slog.New(slog.NewTextHandler(lockedWriter{&n.logMu, n.log}, nil)),
		Changed: func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	n.role = r
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan struct{})
	r.Start(ctx)
	go func() {
		defer close(n.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-tick.C:
			}
			n.converge(ctx)
		}
	}()
}

// converge is the loop's part: the address follows Want, claimed after a
// probe and announced, as netcfg/link claims it.
func (n *node) converge(ctx context.Context) {
	present := n.has()
	want := n.role.Want()
	switch {
	case want && !present:
		c, err := n.role.conn()
		if err != nil {
			n.role.Synced(false, nil)
			return
		}
		defer c.Close()
		p := n.role.cfg.Role.Probe
		found, err := c.Probe(ctx, []netip.Addr{gw.Addr()}, arp.Config{Probes: p.Probes, Interval: p.Interval, Wait: p.Wait})
		if err != nil {
			n.role.Synced(false, nil)
			return
		}
		if mac, ok := found[gw.Addr()]; ok {
			n.role.Synced(false, mac)
			return
		}
		n.ns.TryExec("ip", "addr", "add", gw.String(), "dev", "shim0")
		c.Announce(ctx, []netip.Addr{gw.Addr()}, arp.Config{Announcements: p.Announcements, Interval: p.Interval})
		n.role.Synced(n.has(), nil)
	case !want && present:
		n.ns.TryExec("ip", "addr", "del", gw.String(), "dev", "shim0")
		n.role.Synced(false, nil)
	default:
		n.role.Synced(present, nil)
	}
}

func (n *node) has() bool {
	out, _ := n.ns.TryExec("ip", "-br", "addr", "show", "dev", "shim0")
	return strings.Contains(out, gw.String())
}

func (n *node) stop() {
	if n.cancel != nil {
		n.cancel()
		<-n.done
		n.cancel = nil
	}
}

func (n *node) logs() string {
	n.logMu.Lock()
	defer n.logMu.Unlock()
	return n.log.String()
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// twoCandidates is the role's test bed: a real kube-apiserver with the
// shipped RBAC manifest applied, and two candidates on one segment, each
// with its own cuttable path to the API server.
func twoCandidates(t *testing.T) (*kubetest.Server, *node, *node, func(*node) *rest.Config) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no etcd or kube-apiserver")
	}
	srv := kubetest.Start(t)
	ctx := context.Background()
	for _, n := range []string{"node-a", "node-b"} {
		if err := srv.CreateNode(ctx, n, nil); err != nil {
			t.Fatal(err)
		}
	}
	manifest, _ := filepath.Abs("../../packaging/examples/kubernetes/gateway-rbac.yaml")
	if err := srv.ApplyManifest(ctx, manifest, nil); err != nil {
		t.Fatal(err)
	}
	sa, err := srv.ServiceAccountConfig(ctx, "nodeagent", "nodeagent-gateway")
	if err != nil {
		t.Fatal(err)
	}
	a := &node{name: "node-a", ns: testenv.NewNetNS(t)}
	b := &node{name: "node-b", ns: testenv.NewNetNS(t)}
	a.ns.Veth(t, "shim0", b.ns, "shim0")
	a.ns.Exec(t, "ip", "addr", "add", "10.10.50.2/24", "dev", "shim0")
	b.ns.Exec(t, "ip", "addr", "add", "10.10.50.3/24", "dev", "shim0")
	for _, n := range []*node{a, b} {
		n.proxy = testenv.NewProxy(t, strings.TrimPrefix(srv.URL, "https://"))
	}
	leaseVia := func(n *node) *rest.Config {
		c := rest.CopyConfig(sa)
		c.Host = "https://" + n.proxy.Addr()
		return c
	}
	t.Cleanup(func() {
		a.stop()
		b.stop()
		if t.Failed() {
			t.Logf("node-a:\n%s\nnode-b:\n%s", a.logs(), b.logs())
		}
	})
	return srv, a, b, leaseVia
}

// TestPreferredNode: with gateway.preferred.node set, the preferred node
// takes the role back from another holder when takeBack is on (it asks on
// the Lease, the holder hands over), and leaves it where it is when it is
// off.
func TestPreferredNode(t *testing.T) {
	srv, a, b, leaseVia := twoCandidates(t)
	st := func(n *node) State { return n.role.Status().State }
	for _, takeBack := range []bool{false, true} {
		rc := roleConfig()
		rc.Preferred = config.GatewayPreferred{Node: "node-a", TakeBack: takeBack}
		b.startWith(t, srv, leaseVia(b), rc)
		waitFor(t, "node-b holding the role", 20*time.Second, func() bool { return st(b) == Holder && b.has() })
		a.startWith(t, srv, leaseVia(a), rc)
		if !takeBack {
			time.Sleep(4 * rc.Lease.RetryPeriod)
			waitFor(t, "node-a standing by", 10*time.Second, func() bool { return st(a) == Standby })
			if st(b) != Holder || a.has() {
				t.Errorf("takeBack off: node-b %s, node-a %s; the role should stay with node-b", st(b), st(a))
			}
		} else {
			took := waitFor(t, "node-a taking the role back", 20*time.Second, func() bool { return st(a) == Holder && a.has() && !b.has() && st(b) == Standby })
			t.Logf("takeBack: the preferred node holds the role %s after it started", took.Round(time.Millisecond))
		}
		a.stop()
		b.stop()
		a.ns.TryExec("ip", "addr", "del", gw.String(), "dev", "shim0")
		b.ns.TryExec("ip", "addr", "del", gw.String(), "dev", "shim0")
	}
}

// TestRoleMovesByLeaseAndWire: two candidates against a real kube-apiserver
// (Node,RBAC and NodeRestriction), with the shipped RBAC manifest's
// ServiceAccount for the Lease and each node's own identity for its labels,
// on one segment. One holds the role; a clean hand-over moves it within a
// second or so; a holder cut from the API server but not from the wire
// keeps it (its Lease runs out, but the standby hears it answer); a holder
// that dies with its links takes the Lease duration and a retry to replace,
// and its label goes with it.
func TestRoleMovesByLeaseAndWire(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no etcd or kube-apiserver")
	}
	srv, a, b, leaseVia := twoCandidates(t)
	ctx := context.Background()
	labelled := func() map[string]bool {
		out := map[string]bool{}
		for _, n := range []string{"node-a", "node-b"} {
			nd, err := srv.Admin.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err == nil && nd.Labels[testLabel] == "true" {
				out[n] = true
			}
		}
		return out
	}
	state := func(n *node) State { return n.role.Status().State }
	holds := func(h, s *node) func() bool {
		return func() bool {
			l := labelled()
			return state(h) == Holder && h.role.elect.view().leading && state(s) == Standby && h.has() && !s.has() && l[h.name] && !l[s.name]
		}
	}

	// A first, then B: A holds, B stands by.
	a.start(t, srv, leaseVia(a))
	waitFor(t, "node-a holding the role", 20*time.Second, func() bool { return state(a) == Holder && a.has() })
	b.start(t, srv, leaseVia(b))
	waitFor(t, "node-a holder, node-b standby, the label on node-a", 20*time.Second, holds(a, b))
	if s := b.role.Status(); s.Holder != "node-a" || !strings.Contains(s.Reason, "held by node-a") {
		t.Errorf("node-b's status: %+v", s)
	}

	// A clean hand-over: A releases, B takes it at once.
	began := time.Now()
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	a.role.HandOver(hctx, func(context.Context) error { a.converge(hctx); return nil })
	cancel()
	a.stop()
	waitFor(t, "node-b holding the role after the hand-over", 10*time.Second, func() bool { return state(b) == Holder && b.has() })
	t.Logf("hand-over: node-b holds the role %s after node-a began handing over", time.Since(began).Round(time.Millisecond))
	waitFor(t, "the label on node-b alone", 10*time.Second, func() bool { l := labelled(); return l["node-b"] && !l["node-a"] })

	// A comes back as a standby.
	a.start(t, srv, leaseVia(a))
	waitFor(t, "node-b holder, node-a standby", 20*time.Second, holds(b, a))

	// B is cut from the API server, not from the wire: its Lease runs out,
	// but A hears it answer and does not take the role.
	b.proxy.Cut()
	time.Sleep(3 * roleConfig().Lease.Duration)
	if state(b) != Holder || !b.has() || a.has() || state(a) == Holder {
		t.Errorf("with node-b cut from the API server: node-b %s (address %v), node-a %s (address %v); want node-b to keep the role",
			state(b), b.has(), state(a), a.has())
	}
	if s := a.role.Status(); s.Holder == "node-a" && a.role.elect.view().leading {
		t.Errorf("node-a took the Lease while node-b answered on the wire: %+v", s)
	}
	b.proxy.Restore()
	waitFor(t, "node-b holder again with its API path back", 20*time.Second, holds(b, a))

	// B dies with its links (a power cut): A takes over once the Lease has
	// run out, and takes B's label off.
	// Its path to the API server goes with it, so nothing is released.
	b.proxy.Cut()
	b.stop()
	b.ns.Exec(t, "ip", "link", "set", "shim0", "down")
	took := waitFor(t, "node-a holding the role after node-b died", 30*time.Second, func() bool { return state(a) == Holder && a.has() })
	t.Logf("death: node-a holds the role %s after node-b died (Lease duration %s)", took.Round(time.Millisecond), roleConfig().Lease.Duration)
	if bound := roleConfig().Lease.Duration + 3*time.Second; took > bound {
		t.Errorf("take-over after a death took %s, over the Lease duration + 3 s (%s)", took.Round(time.Millisecond), bound)
	}
	waitFor(t, "the label on node-a alone", 10*time.Second, func() bool { l := labelled(); return l["node-a"] && !l["node-b"] })
}
