package kube

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func fieldsV1(s string) *metav1.FieldsV1 { return &metav1.FieldsV1{Raw: []byte(s)} }

// TestAdoptedFields: the adopted keys leave every other entry (an entry
// left owning nothing goes) and join nodeagent's Apply entry; the rest of
// every entry is kept as it was.
func TestAdoptedFields(t *testing.T) {
	const vpn, rack = "homelab.example/vpn-ingress", "homelab.example/rack"
	at := metav1.NewTime(t0)
	kubelet := metav1.ManagedFieldsEntry{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &at,
		FieldsType: "FieldsV1", FieldsV1: fieldsV1(`{"f:metadata":{"f:labels":{".":{},"f:kubernetes.io/hostname":{}}},"f:status":{"f:capacity":{}}}`)}
	kubectl := metav1.ManagedFieldsEntry{Manager: "kubectl-label", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &at,
		FieldsType: "FieldsV1", FieldsV1: fieldsV1(`{"f:metadata":{"f:labels":{"f:` + vpn + `":{}}}}`)}
	other := metav1.ManagedFieldsEntry{Manager: "flux", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1", Time: &at,
		FieldsType: "FieldsV1", FieldsV1: fieldsV1(`{"f:metadata":{"f:annotations":{"f:x":{}},"f:labels":{"f:` + vpn + `":{},"f:` + rack + `":{}}}}`)}
	ours := metav1.ManagedFieldsEntry{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1", Time: &at,
		FieldsType: "FieldsV1", FieldsV1: fieldsV1(`{"f:metadata":{"f:annotations":{"f:nodeagent.io/status":{}},"f:labels":{"f:homelab.example/role":{}}}}`)}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Labels:        map[string]string{vpn: "true", rack: "r1", "homelab.example/role": "gw", "kubernetes.io/hostname": "n"},
		ManagedFields: []metav1.ManagedFieldsEntry{kubelet, kubectl, other, ours},
	}}

	want := map[string]string{vpn: "true", rack: "r2", "homelab.example/role": "gw", "homelab.example/new": "x"}
	keys := takeovers(node, want, []string{"homelab.example/new", "homelab.example/role", vpn, vpn, "homelab.example/unwanted"})
	// Not on the Node (new), already nodeagent's alone (role), not wanted:
	// nothing to take over; rack is not adopted.
	if diff := cmp.Diff([]string{vpn}, keys); diff != "" {
		t.Errorf("takeovers (-want +got):\n%s", diff)
	}
	if got := otherOwners(node.ManagedFields, vpn); !cmp.Equal(got, []string{"kubectl-label (Update)", "flux (Apply)"}) {
		t.Errorf("otherOwners = %q", got)
	}

	got, err := adoptedFields(node.ManagedFields, []string{vpn}, t0)
	if err != nil {
		t.Fatal(err)
	}
	fields := func(mf []metav1.ManagedFieldsEntry) map[string]any {
		out := map[string]any{}
		for _, e := range mf {
			var v any
			if err := json.Unmarshal(e.FieldsV1.Raw, &v); err != nil {
				t.Fatal(err)
			}
			out[e.Manager+"/"+string(e.Operation)] = v
		}
		return out
	}
	wantFields := fields([]metav1.ManagedFieldsEntry{
		kubelet,
		{Manager: "flux", Operation: metav1.ManagedFieldsOperationApply, FieldsV1: fieldsV1(`{"f:metadata":{"f:annotations":{"f:x":{}},"f:labels":{"f:` + rack + `":{}}}}`)},
		{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply, FieldsV1: fieldsV1(`{"f:metadata":{"f:annotations":{"f:nodeagent.io/status":{}},"f:labels":{"f:homelab.example/role":{},"f:` + vpn + `":{}}}}`)},
	})
	if diff := cmp.Diff(wantFields, fields(got)); diff != "" {
		t.Errorf("adopted managedFields (-want +got):\n%s", diff)
	}
	for _, e := range got {
		if e.Time == nil || !e.Time.Equal(&at) || e.APIVersion != "v1" || e.FieldsType != "FieldsV1" {
			t.Errorf("entry %s/%s: time, apiVersion or fieldsType not kept: %+v", e.Manager, e.Operation, e)
		}
	}
	// The Node's own entries are not modified.
	if string(kubectl.FieldsV1.Raw) != `{"f:metadata":{"f:labels":{"f:`+vpn+`":{}}}}` || len(node.ManagedFields) != 4 {
		t.Errorf("adoptedFields modified its input")
	}

	// Without an entry of nodeagent's, one is made.
	got, err = adoptedFields([]metav1.ManagedFieldsEntry{kubelet, kubectl}, []string{vpn}, t0)
	if err != nil {
		t.Fatal(err)
	}
	wantFields = fields([]metav1.ManagedFieldsEntry{
		kubelet,
		{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply, FieldsV1: fieldsV1(`{"f:metadata":{"f:labels":{"f:` + vpn + `":{}}}}`)},
	})
	if diff := cmp.Diff(wantFields, fields(got)); diff != "" {
		t.Errorf("adopted managedFields without nodeagent's entry (-want +got):\n%s", diff)
	}
	if e := got[len(got)-1]; e.APIVersion != "v1" || e.FieldsType != "FieldsV1" || e.Time == nil || !e.Time.Time.Equal(t0) {
		t.Errorf("new entry = %+v", e)
	}

	// A key only nodeagent's own Update entry holds (not an apply of
	// nodeagent's) is taken over too.
	stray := metav1.ManagedFieldsEntry{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationUpdate, FieldsV1: fieldsV1(`{"f:metadata":{"f:labels":{"f:` + vpn + `":{}}}}`)}
	node.ManagedFields = []metav1.ManagedFieldsEntry{kubelet, stray, ours}
	if keys := takeovers(node, want, []string{vpn}); !cmp.Equal(keys, []string{vpn}) {
		t.Errorf("takeovers with nodeagent's Update entry = %q", keys)
	}
}
