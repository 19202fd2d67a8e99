package kubetest

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// TestServerNodeIdentity proves the harness is the server the tier claims:
// a node identity may patch its own Node and is refused another's by
// NodeRestriction, and the server comes back with its data after a stop.
func TestServerNodeIdentity(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range []string{"n1", "n2"} {
		if err := s.CreateNode(ctx, n, nil); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := s.NodeConfig("n1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"labels":{"homelab.example/x":"y"}}}`)
	if _, err := c.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("node n1 patching its own Node: %v", err)
	}
	_, err = c.CoreV1().Nodes().Patch(ctx, "n2", types.MergePatchType, patch, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node n1 patching node n2: err = %v, want 403 Forbidden", err)
	}
	forbidden := []byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/x":"y"}}}`)
	_, err = c.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, forbidden, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("node n1 setting a node-restriction.kubernetes.io label: err = %v, want 403 Forbidden", err)
	}

	s.Stop()
	if err := s.Start(ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
	n, err := s.Admin.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Labels["homelab.example/x"]; got != "y" {
		t.Errorf("after restart, label = %q, want y", got)
	}
}
