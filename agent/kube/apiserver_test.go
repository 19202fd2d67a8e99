package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
)

// These tests run the Labeler against a real kube-apiserver with
// Node,RBAC authorization and NodeRestriction (testenv/kubetest), each
// agent with its own node's identity, as on a k3s node.

// shared is one API server for the tests that do not stop it; each test
// uses its own Node names.
var shared struct {
	once sync.Once
	srv  *kubetest.Server
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Stop()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

func sharedServer(t *testing.T) *kubetest.Server {
	t.Helper()
	kubetest.Require(t)
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "nodeagent-kube-")
		if shared.err != nil {
			return
		}
		shared.srv, shared.err = kubetest.New(shared.dir)
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.err = shared.srv.Start(ctx, t.Logf)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.srv
}

// fast are test timings: quick retries and a short hold.
func fast(cfg Config) Config {
	cfg.Enabled = true
	cfg.MinBackoff, cfg.MaxBackoff = 100*time.Millisecond, time.Second
	if cfg.Resync == 0 {
		cfg.Resync = time.Minute
	}
	return cfg
}

// agent starts a Labeler for cfg with node's identity from a kubeconfig
// file, like the k3s kubelet's, and stops it when t ends.
func agent(t *testing.T, s *kubetest.Server, identity string, cfg Config) *Labeler {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubelet.kubeconfig")
	if err := s.WriteNodeKubeconfig(kc, identity); err != nil {
		t.Fatal(err)
	}
	cfg.Kubeconfig = kc
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("node", identity)
	l := New(fast(cfg), log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return l
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// eventually polls f until it returns "" or timeout passes, then fails
// with f's last complaint.
func eventually(t *testing.T, timeout time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getNode(t *testing.T, s *kubetest.Server, name string) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := s.Admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func createNode(t *testing.T, s *kubetest.Server, name string, labels map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.CreateNode(ctx, name, labels); err != nil {
		t.Fatal(err)
	}
	// The server is shared: -count=2 must find the names free again.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Admin.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete node %s: %v", name, err)
		}
	})
}

// labelsAre returns "" when node name carries exactly want.
func labelsAre(t *testing.T, s *kubetest.Server, name string, want map[string]string) func() string {
	return func() string {
		got := getNode(t, s, name).Labels
		if got == nil {
			got = map[string]string{}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			return fmt.Sprintf("node %s labels (-want +got):\n%s", name, diff)
		}
		return ""
	}
}

func condIs(l *Labeler, status, reason string, contains ...string) func() string {
	return func() string {
		c := l.Condition()
		ok := c.Status == status && c.Reason == reason
		for _, s := range contains {
			ok = ok && strings.Contains(c.Message, s)
		}
		if !ok {
			return fmt.Sprintf("LabelsSynced = %s %s %q; want %s %s containing %q", c.Status, c.Reason, c.Message, status, reason, contains)
		}
		return ""
	}
}

// adminLabel sets a label as an administrator with kubectl's field manager
// (kubectl label uses a merge patch, an Update operation).
func adminLabel(t *testing.T, s *kubetest.Server, node, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := s.Admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-label"}); err != nil {
		t.Fatal(err)
	}
}

// Acceptance 1: static labels reach the agent's own Node; a label dropped
// from the config leaves it; labels of other managers stay, and a key an
// administrator owns with another value is reported, not taken over.
func TestStaticLabels(t *testing.T) {
	s := sharedServer(t)
	const node = "static-1"
	createNode(t, s, node, map[string]string{"kubernetes.io/hostname": node})
	adminLabel(t, s, node, "homelab.example/rack", "r1")
	adminLabel(t, s, node, "homelab.example/contested", "admin")

	l := agent(t, s, node, Config{NodeName: node, Labels: map[string]string{
		"homelab.example/vpn-ingress": "true",
		"homelab.example/role":        "gateway",
		"homelab.example/contested":   "agent",
	}})
	l.Update(Snapshot{Summary: "converged"})
	eventually(t, 20*time.Second, labelsAre(t, s, node, map[string]string{
		"kubernetes.io/hostname":      node,
		"homelab.example/rack":        "r1",
		"homelab.example/contested":   "admin",
		"homelab.example/vpn-ingress": "true",
		"homelab.example/role":        "gateway",
	}))
	eventually(t, 10*time.Second, condIs(l, api.False, ReasonConflict, `label homelab.example/contested is owned by "kubectl-label"`))
	if got := getNode(t, s, node).Annotations[AnnotationStatus]; got != "converged" {
		t.Errorf("annotation %s = %q, want converged", AnnotationStatus, got)
	}

	l.SetConfig(fast(Config{Kubeconfig: l.cfg.Kubeconfig, NodeName: node, Labels: map[string]string{
		"homelab.example/vpn-ingress": "true",
	}}))
	eventually(t, 20*time.Second, labelsAre(t, s, node, map[string]string{
		"kubernetes.io/hostname":      node,
		"homelab.example/rack":        "r1",
		"homelab.example/contested":   "admin",
		"homelab.example/vpn-ingress": "true",
	}))
	eventually(t, 10*time.Second, condIs(l, api.True, ReasonSynced, "node static-1: 1 labels, 1 annotations"))

	// Disabling labelling removes what nodeagent applied, nothing else.
	l.SetConfig(Config{Kubeconfig: l.cfg.Kubeconfig, NodeName: node})
	eventually(t, 20*time.Second, labelsAre(t, s, node, map[string]string{
		"kubernetes.io/hostname":    node,
		"homelab.example/rack":      "r1",
		"homelab.example/contested": "admin",
	}))
	eventually(t, 10*time.Second, condIs(l, api.True, ReasonDisabled))
	if a, ok := getNode(t, s, node).Annotations[AnnotationStatus]; ok {
		t.Errorf("annotation %s = %q after disabling; want it removed", AnnotationStatus, a)
	}
}

// Acceptance 2: a role moves from node A to node B, each agent with its
// own identity; exactly one node carries the label at the end.
func TestMoveRole(t *testing.T) {
	s := sharedServer(t)
	const key = "homelab.example/vpn-ingress"
	createNode(t, s, "move-a", nil)
	createNode(t, s, "move-b", nil)
	a := agent(t, s, "move-a", Config{NodeName: "move-a", Labels: map[string]string{key: "true"}})
	b := agent(t, s, "move-b", Config{NodeName: "move-b"})
	a.Update(Snapshot{})
	b.Update(Snapshot{})
	carriers := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ns, err := s.Admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: key + "=true"})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, n := range ns.Items {
			if strings.HasPrefix(n.Name, "move-") {
				names = append(names, n.Name)
			}
		}
		slices.Sort(names)
		return names
	}
	onlyOn := func(want ...string) func() string {
		return func() string {
			if diff := cmp.Diff(want, carriers()); diff != "" {
				return fmt.Sprintf("nodes labelled %s (-want +got):\n%s", key, diff)
			}
			return ""
		}
	}
	eventually(t, 20*time.Second, onlyOn("move-a"))

	a.SetConfig(fast(Config{Kubeconfig: a.cfg.Kubeconfig, NodeName: "move-a"}))
	b.SetConfig(fast(Config{Kubeconfig: b.cfg.Kubeconfig, NodeName: "move-b", Labels: map[string]string{key: "true"}}))
	eventually(t, 20*time.Second, onlyOn("move-b"))
	eventually(t, 10*time.Second, condIs(a, api.True, ReasonSynced))
	eventually(t, 10*time.Second, condIs(b, api.True, ReasonSynced))
}

// Acceptance 3: the agent's identity cannot label another Node. Status
// says 403 Forbidden with the server's words; the other Node is untouched.
func TestOtherNodeForbidden(t *testing.T) {
	s := sharedServer(t)
	createNode(t, s, "victim", map[string]string{"homelab.example/x": "1"})
	createNode(t, s, "intruder", nil)
	before := getNode(t, s, "victim")

	l := agent(t, s, "intruder", Config{NodeName: "victim", Labels: map[string]string{"homelab.example/vpn-ingress": "true"}})
	l.Update(Snapshot{Summary: "converged"})
	// In Kubernetes 1.34 the Node authorizer already refuses reading
	// another Node; NodeRestriction would refuse the write
	// (testenv/kubetest proves that one).
	eventually(t, 20*time.Second, condIs(l, api.False, ReasonForbidden, "HTTP 403", `User "system:node:intruder" cannot get resource "nodes"`, "only its own Node object"))
	t.Logf("LabelsSynced: %+v", l.Condition())

	after := getNode(t, s, "victim")
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("node victim changed: resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
	}
	if diff := cmp.Diff(before.Labels, after.Labels); diff != "" {
		t.Errorf("node victim labels (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(before.Annotations, after.Annotations); diff != "" {
		t.Errorf("node victim annotations (-before +after):\n%s", diff)
	}
}

// Acceptance 4: with the API server down at start the Labeler retries with
// a capped backoff, says Unreachable, and Update never blocks; once the
// server is up and the kubelet has registered the Node, labels arrive
// within the backoff cap. (The daemon-level proof that networking
// converges meanwhile is the daemon's: Update is all it calls.)
func TestAPIServerDownAtStart(t *testing.T) {
	kubetest.Require(t)
	s, err := kubetest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	const node = "cold-boot"
	l := agent(t, s, node, Config{NodeName: node, Labels: map[string]string{"homelab.example/vpn-ingress": "true"}})

	// The daemon's syncs: Update after each, however the API server fares.
	var slowest time.Duration
	for i := range 40 {
		start := time.Now()
		l.Update(Snapshot{Conditions: map[string]bool{"converged": true}, Summary: fmt.Sprintf("sync %d", i)})
		slowest = max(slowest, time.Since(start))
		time.Sleep(50 * time.Millisecond)
	}
	if slowest > 50*time.Millisecond {
		t.Errorf("slowest Update took %s with the API server down; want it not to block", slowest)
	}
	eventually(t, 10*time.Second, condIs(l, api.False, ReasonUnreachable, "connection refused", "retry"))
	t.Logf("while down: %+v", l.Condition())
	if c := l.Condition(); !regexp.MustCompile(`retry \d+ in 1(\.\d+)?s$`).MatchString(c.Message) {
		t.Errorf("after 2s of failures the retry delay should be at the 1s cap: %q", c.Message)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.Start(ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
	// The server is up but the kubelet has not registered yet: nodeagent
	// must not create the Node itself.
	eventually(t, 10*time.Second, condIs(l, api.False, ReasonNodeNotFound))
	if _, err := s.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
		t.Fatal("nodeagent created its Node; only the kubelet registers it")
	}
	if err := s.CreateNode(ctx, node, nil); err != nil { // a server of its own: no cleanup
		t.Fatal(err)
	}
	registered := time.Now()
	// Within the cap (1s, plus 10% jitter) and a request's time.
	eventually(t, 3*time.Second, labelsAre(t, s, node, map[string]string{"homelab.example/vpn-ingress": "true"}))
	t.Logf("labels arrived %s after the Node was registered", time.Since(registered).Round(time.Millisecond))
	eventually(t, 5*time.Second, condIs(l, api.True, ReasonSynced))

	// And again when the API server goes away and comes back.
	s.StopAPIServer()
	adminDown := time.Now()
	l.SetConfig(fast(Config{Kubeconfig: l.cfg.Kubeconfig, NodeName: node, Labels: map[string]string{"homelab.example/vpn-ingress": "true", "homelab.example/b": "2"}}))
	eventually(t, 10*time.Second, condIs(l, api.False, ReasonUnreachable))
	t.Logf("unreachable %s after the API server stopped", time.Since(adminDown).Round(time.Millisecond))
}

// nodeUpdates counts the MODIFIED events of node name until stop is
// called.
func nodeUpdates(t *testing.T, s *kubetest.Server, name string) (count func() int, stop func()) {
	t.Helper()
	n := getNode(t, s, name)
	// The admin config's request timeout would end the watch early.
	rc := rest.CopyConfig(s.AdminConfig)
	rc.Timeout = 0
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: n.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	modified := 0
	stopped := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				mu.Lock()
				modified++
				mu.Unlock()
			}
		}
	}()
	return func() int {
			select {
			case <-done:
				mu.Lock()
				defer mu.Unlock()
				if !stopped {
					t.Fatal("the watch on the Node ended early; updates are not counted")
				}
			default:
			}
			mu.Lock()
			defer mu.Unlock()
			return modified
		}, func() {
			mu.Lock()
			stopped = true
			mu.Unlock()
			w.Stop()
			<-done
		}
}

// Acceptance 5: a conditional label follows its condition only after the
// hold; a condition flapping faster than the hold writes the Node not once.
func TestConditionalHysteresis(t *testing.T) {
	s := sharedServer(t)
	const node = "hyst-1"
	const when = "wireguard/wg-pia/healthy"
	const hold = 1500 * time.Millisecond
	createNode(t, s, node, nil)
	l := agent(t, s, node, Config{NodeName: node, Hold: hold,
		Conditional: []config.ConditionalLabel{{Key: gw, Value: "true", When: when}}})
	update := func(healthy bool) {
		l.Update(Snapshot{Conditions: map[string]bool{when: healthy, "converged": true}, Summary: "converged"})
	}
	update(false)
	eventually(t, 20*time.Second, condIs(l, api.True, ReasonSynced))
	count, stop := nodeUpdates(t, s, node)
	defer stop()

	// flap toggles the condition every 300ms for d, the daemon's sync
	// reporting it each time.
	flap := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			update(true)
			time.Sleep(300 * time.Millisecond)
			update(false)
			time.Sleep(300 * time.Millisecond)
		}
	}
	steady := func(healthy bool, d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			update(healthy)
			time.Sleep(100 * time.Millisecond)
		}
	}
	hasLabel := func() bool { _, ok := getNode(t, s, node).Labels[gw]; return ok }

	flap(4 * time.Second)
	if n := count(); n != 0 || hasLabel() {
		t.Fatalf("flapping faster than the hold: %d Node updates, label %v; want 0, absent", n, hasLabel())
	}

	steady(true, hold+time.Second)
	eventually(t, 5*time.Second, func() string {
		if !hasLabel() {
			return "label not applied after the condition held"
		}
		return ""
	})
	if n := count(); n != 1 {
		t.Errorf("condition held: %d Node updates, want 1", n)
	}

	// Flapping again keeps the label and writes nothing.
	flap(4 * time.Second)
	if n := count(); n != 1 || !hasLabel() {
		t.Errorf("flapping with the label on: %d Node updates in all, label %v; want 1, present", n, hasLabel())
	}

	steady(false, hold+time.Second)
	eventually(t, 5*time.Second, func() string {
		if hasLabel() {
			return "label still on after the condition failed for the hold"
		}
		return ""
	})
	time.Sleep(200 * time.Millisecond)
	if n := count(); n != 2 {
		t.Errorf("after the condition failed: %d Node updates in all, want 2", n)
	}
}

// Acceptance 6: the annotations count the peers of the WireGuard servers
// with an endpoint and a handshake younger than 3 minutes, from an
// injected observation; the PIA client tunnel is not counted.
func TestWireGuardLivePeers(t *testing.T) {
	s := sharedServer(t)
	const node = "wg-server"
	createNode(t, s, node, nil)
	l := agent(t, s, node, Config{NodeName: node, Hold: 200 * time.Millisecond,
		Labels: map[string]string{"homelab.example/vpn-ingress": "true"}, WireGuardServers: []string{"wg0"}})
	now := time.Now()
	ago := func(d time.Duration) *time.Time { x := now.Add(-d); return &x }
	peer := func(name, endpoint string, hs *time.Time) api.WireGuardPeer {
		return api.WireGuardPeer{Name: name, Endpoint: endpoint, LastHandshake: hs}
	}
	devs := []api.WireGuardDevice{
		{Name: "wg0", ListenPort: 51820, Peers: []api.WireGuardPeer{
			peer("phone", "198.51.100.7:40000", ago(20*time.Second)),
			peer("laptop", "198.51.100.8:40000", ago(4*time.Minute)),
			peer("tablet", "", nil),
		}},
		{Name: "wg-pia", Peers: []api.WireGuardPeer{peer("pia", "203.0.113.1:1337", ago(time.Second))}},
	}
	l.Update(Snapshot{WireGuard: devs, Summary: "converged", At: now})
	annotationsAre := func(live, count string) func() string {
		return func() string {
			a := getNode(t, s, node).Annotations
			want := map[string]string{AnnotationWireGuardLive: live, AnnotationWireGuardLivePeers: count, AnnotationStatus: "converged"}
			got := map[string]string{}
			for k := range want {
				got[k] = a[k]
			}
			if diff := cmp.Diff(want, got); diff != "" {
				return fmt.Sprintf("annotations (-want +got):\n%s", diff)
			}
			return ""
		}
	}
	eventually(t, 20*time.Second, annotationsAre("wg0=1/3", "1"))

	// The laptop handshakes again and the tablet connects.
	devs = slices.Clone(devs)
	devs[0].Peers = []api.WireGuardPeer{
		peer("phone", "198.51.100.7:40000", ago(20*time.Second)),
		peer("laptop", "198.51.100.8:40000", ago(5*time.Second)),
		peer("tablet", "198.51.100.9:40000", ago(time.Second)),
	}
	l.Update(Snapshot{WireGuard: devs, Summary: "converged", At: now})
	eventually(t, 10*time.Second, annotationsAre("wg0=3/3", "3"))

	// Three minutes later without handshakes, none is live.
	l.Update(Snapshot{WireGuard: devs, Summary: "converged", At: now.Add(3 * time.Minute)})
	eventually(t, 10*time.Second, annotationsAre("wg0=0/3", "0"))
}
