package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
)

// Issue 33, acceptance 5: labels another field manager set are taken over
// when, and only when, the config adopts them, and the label is on the
// Node at every moment of the take-over.
//
// The other manager is kubectl label: adminLabel sends what
// `kubectl label node N homelab.example/vpn-ingress=true` sends after its
// GET, a merge patch of the label with fieldManager=kubectl-label (an
// Update operation). The real kubectl is not built here: k8s.io/kubectl
// is not in the module cache testenv/kubeapiserver uses.

const vpnKey = "homelab.example/vpn-ingress"

// labelEvent is one watch event of a Node, as far as one label goes.
type labelEvent struct {
	Type watch.EventType
	// RV is the Node's resourceVersion, or an ERROR's message.
	RV      string
	Value   string
	Present bool
	// Owners are the managedFields entries that own the label.
	Owners []string
}

// watchLabel watches node from its current resourceVersion, before the
// caller changes anything, and records key in every event until the
// returned stop is called, which returns the events.
func watchLabel(t *testing.T, s *kubetest.Server, node, key string) (stop func() []labelEvent) {
	t.Helper()
	n := getNode(t, s, node)
	rc := rest.CopyConfig(s.AdminConfig)
	rc.Timeout = 0 // the admin config's request timeout would end the watch
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", node).String(),
		ResourceVersion: n.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		events  []labelEvent
		stopped bool
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			e := labelEvent{Type: ev.Type}
			if n, ok := ev.Object.(*corev1.Node); ok {
				e.RV = n.ResourceVersion
				e.Value, e.Present = n.Labels[key]
				e.Owners = labelOwners(t, n, key)
			} else if st, ok := ev.Object.(*metav1.Status); ok {
				e.RV = st.Message
			}
			mu.Lock()
			// Stopping the watch closes its stream, which client-go
			// may report as one last ERROR event: not the Node's.
			if !stopped {
				events = append(events, e)
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return func() []labelEvent {
		select {
		case <-done:
			mu.Lock()
			if !stopped {
				t.Errorf("the watch on node %s ended early; not every change was seen", node)
			}
			mu.Unlock()
		default:
		}
		mu.Lock()
		stopped = true
		mu.Unlock()
		w.Stop()
		<-done
		return slices.Clone(events)
	}
}

// checkAlwaysPresent fails unless every event is a MODIFIED Node carrying
// key, and logs them. The first write must be the take-over: the label
// owned by nodeagent's apply alone from then on.
func checkAlwaysPresent(t *testing.T, events []labelEvent, key string) {
	t.Helper()
	if len(events) == 0 {
		t.Fatal("no watch events: the Node was not written")
	}
	for i, e := range events {
		t.Logf("watch event %d: %s rv=%s %s present=%v value=%q owners=%q", i+1, e.Type, e.RV, key, e.Present, e.Value, e.Owners)
		if want := []string{"nodeagent/Apply"}; e.Type == watch.Modified && !cmp.Equal(e.Owners, want) {
			t.Errorf("watch event %d: label %s owned by %q; want %q from the first write on", i+1, key, e.Owners, want)
		}
		if e.Type == watch.Error {
			t.Errorf("watch event %d: %s %s; not every change of the Node was seen", i+1, e.Type, e.RV)
		} else if e.Type != watch.Modified || !e.Present {
			t.Errorf("watch event %d: %s with label %s present=%v; want MODIFIED with the label", i+1, e.Type, key, e.Present)
		}
	}
}

// ownersOf returns the managedFields entries of node that own label key,
// as manager/operation, sorted.
func ownersOf(t *testing.T, s *kubetest.Server, node, key string) []string {
	t.Helper()
	return labelOwners(t, getNode(t, s, node), key)
}

func labelOwners(t *testing.T, n *corev1.Node, key string) []string {
	var out []string
	for _, e := range n.ManagedFields {
		if e.FieldsV1 == nil {
			continue
		}
		if _, owns, err := editLabel(e.FieldsV1.Raw, key, false); err != nil {
			t.Fatalf("managedFields of %s: %v", e.Manager, err)
		} else if owns {
			out = append(out, e.Manager+"/"+string(e.Operation))
		}
	}
	slices.Sort(out)
	return out
}

func ownersAre(t *testing.T, s *kubetest.Server, node, key string, want ...string) func() string {
	return func() string {
		if got := ownersOf(t, s, node, key); !cmp.Equal(want, got) {
			return fmt.Sprintf("owners of label %s: %q, want %q", key, got, want)
		}
		return ""
	}
}

func logManagedFields(t *testing.T, s *kubetest.Server, node, when string) {
	t.Helper()
	n := getNode(t, s, node)
	b, err := json.Marshal(n.ManagedFields)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("managedFields %s (rv %s): %s", when, n.ResourceVersion, b)
}

// TestAdoptKubectlLabel: a label set by kubectl label, with nodeagent's
// value, becomes nodeagent's alone without ever leaving the Node, stays
// so over later applies, and leaves the Node with the config.
func TestAdoptKubectlLabel(t *testing.T) {
	s := sharedServer(t)
	const node = "adopt-same"
	createNode(t, s, node, map[string]string{"kubernetes.io/hostname": node})
	adminLabel(t, s, node, vpnKey, "true")
	eventually(t, 5*time.Second, ownersAre(t, s, node, vpnKey, "kubectl-label/Update"))
	logManagedFields(t, s, node, "before")

	stop := watchLabel(t, s, node, vpnKey)
	l := agent(t, s, node, Config{NodeName: node, Labels: map[string]string{vpnKey: "true", "homelab.example/role": "gateway"},
		Adopt: []string{vpnKey}})
	l.Update(Snapshot{Summary: "converged"})
	eventually(t, 20*time.Second, condIs(l, api.True, ReasonSynced, "2 labels"))
	eventually(t, 5*time.Second, ownersAre(t, s, node, vpnKey, "nodeagent/Apply"))
	events := stop()
	checkAlwaysPresent(t, events, vpnKey)
	logManagedFields(t, s, node, "after the take-over and apply")

	// More applies (an annotation change, a new label) keep it so.
	l.Update(Snapshot{Summary: "converged again"})
	l.SetConfig(fast(Config{Kubeconfig: l.cfg.Kubeconfig, NodeName: node, Adopt: []string{vpnKey},
		Labels: map[string]string{vpnKey: "true", "homelab.example/role": "gateway", "homelab.example/rack": "r1"}}))
	eventually(t, 20*time.Second, labelsAre(t, s, node, map[string]string{"kubernetes.io/hostname": node,
		vpnKey: "true", "homelab.example/role": "gateway", "homelab.example/rack": "r1"}))
	eventually(t, 10*time.Second, condIs(l, api.True, ReasonSynced, "3 labels"))
	if got := getNode(t, s, node).Annotations[AnnotationStatus]; got != "converged again" {
		t.Errorf("annotation %s = %q after the take-over, want the later summary", AnnotationStatus, got)
	}
	eventually(t, time.Second, ownersAre(t, s, node, vpnKey, "nodeagent/Apply"))
	for _, e := range getNode(t, s, node).ManagedFields {
		if e.Manager == "kubectl-label" || (e.Manager == FieldManager && e.Operation != metav1.ManagedFieldsOperationApply) {
			t.Errorf("managedFields still has %s/%s: %s", e.Manager, e.Operation, e.FieldsV1.Raw)
		}
	}

	// Out of the config, out of the Node: nobody else owns it now.
	l.SetConfig(fast(Config{Kubeconfig: l.cfg.Kubeconfig, NodeName: node,
		Labels: map[string]string{"homelab.example/role": "gateway", "homelab.example/rack": "r1"}}))
	eventually(t, 20*time.Second, labelsAre(t, s, node, map[string]string{"kubernetes.io/hostname": node,
		"homelab.example/role": "gateway", "homelab.example/rack": "r1"}))
	eventually(t, 10*time.Second, condIs(l, api.True, ReasonSynced, "2 labels"))
}

// TestAdoptOtherValue: a label kubectl label set with another value takes
// nodeagent's value and owner, never absent, the value going straight
// from the administrator's to nodeagent's.
func TestAdoptOtherValue(t *testing.T) {
	s := sharedServer(t)
	const node = "adopt-other"
	createNode(t, s, node, map[string]string{"kubernetes.io/hostname": node})
	adminLabel(t, s, node, vpnKey, "admin")
	logManagedFields(t, s, node, "before")

	stop := watchLabel(t, s, node, vpnKey)
	l := agent(t, s, node, Config{NodeName: node, Labels: map[string]string{vpnKey: "agent"}, Adopt: []string{vpnKey}})
	l.Update(Snapshot{Summary: "converged"})
	eventually(t, 20*time.Second, labelsAre(t, s, node, map[string]string{"kubernetes.io/hostname": node, vpnKey: "agent"}))
	eventually(t, 10*time.Second, condIs(l, api.True, ReasonSynced))
	eventually(t, 5*time.Second, ownersAre(t, s, node, vpnKey, "nodeagent/Apply"))
	events := stop()
	checkAlwaysPresent(t, events, vpnKey)
	var values []string
	for _, e := range events {
		if len(values) == 0 || values[len(values)-1] != e.Value {
			values = append(values, e.Value)
		}
	}
	if want := []string{"admin", "agent"}; !cmp.Equal(values, want) {
		t.Errorf("label values over the watch: %q, want %q", values, want)
	}
	logManagedFields(t, s, node, "after")

	l.SetConfig(fast(Config{Kubeconfig: l.cfg.Kubeconfig, NodeName: node}))
	eventually(t, 20*time.Second, labelsAre(t, s, node, map[string]string{"kubernetes.io/hostname": node}))
}

// TestNotAdoptedConflicts: the same label, not in adoptLabels, is left to
// kubectl label as before adoption existed: Conflict, value and owner
// unchanged.
func TestNotAdoptedConflicts(t *testing.T) {
	s := sharedServer(t)
	const node = "adopt-not"
	createNode(t, s, node, map[string]string{"kubernetes.io/hostname": node})
	adminLabel(t, s, node, vpnKey, "admin")
	l := agent(t, s, node, Config{NodeName: node, Labels: map[string]string{vpnKey: "agent", "homelab.example/role": "gateway"},
		Adopt: []string{"homelab.example/role"}})
	l.Update(Snapshot{Summary: "converged"})
	eventually(t, 20*time.Second, condIs(l, api.False, ReasonConflict,
		`label homelab.example/vpn-ingress is owned by "kubectl-label"`, "left as they are, the rest is applied"))
	eventually(t, 5*time.Second, labelsAre(t, s, node, map[string]string{"kubernetes.io/hostname": node,
		vpnKey: "admin", "homelab.example/role": "gateway"}))
	eventually(t, time.Second, ownersAre(t, s, node, vpnKey, "kubectl-label/Update"))
	t.Logf("LabelsSynced: %+v", l.Condition())
}

// TestAdoptStaleResourceVersion: the take-over is conditional on the
// resourceVersion read: a Node changed since is a 409 Conflict and is
// left as it is.
func TestAdoptStaleResourceVersion(t *testing.T) {
	s := sharedServer(t)
	const node = "adopt-stale"
	createNode(t, s, node, map[string]string{"kubernetes.io/hostname": node})
	adminLabel(t, s, node, vpnKey, "true")
	stale := getNode(t, s, node)
	adminLabel(t, s, node, "homelab.example/rack", "r1")
	before := getNode(t, s, node)

	rc, err := s.NodeConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newNodeClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	l := New(Config{NodeName: node}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	logManagedFields(t, s, node, "before")
	err = l.adopt(ctx, c, stale, []string{vpnKey})
	if !apierrors.IsConflict(err) || reasonFor(err) != ReasonConflict {
		t.Fatalf("take-over with resourceVersion %s after %s: %v; want a 409 Conflict", stale.ResourceVersion, before.ResourceVersion, err)
	}
	t.Logf("stale take-over: %v%s", err, httpCode(err))
	if after := getNode(t, s, node); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("node changed by a refused take-over: resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
	}

	// With the Node as it is now, it goes through.
	if err := l.adopt(ctx, c, before, []string{vpnKey}); err != nil {
		t.Fatal(err)
	}
	logManagedFields(t, s, node, "after")
	eventually(t, time.Second, ownersAre(t, s, node, vpnKey, "nodeagent/Apply"))
	eventually(t, time.Second, ownersAre(t, s, node, "homelab.example/rack", "kubectl-label/Update"))
}
