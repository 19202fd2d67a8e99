package kube

import (
	"encoding/json"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// owned returns the label and annotation keys that manager owns by apply
// in mf, a Node's managedFields. The entry's FieldsV1 is JSON like
// {"f:metadata":{"f:labels":{"f:homelab.example/x":{}}}}.
func owned(mf []metav1.ManagedFieldsEntry, manager string) (labels, annotations map[string]bool) {
	labels, annotations = map[string]bool{}, map[string]bool{}
	for _, e := range mf {
		if e.Manager != manager || e.Operation != metav1.ManagedFieldsOperationApply || e.FieldsV1 == nil {
			continue
		}
		var f struct {
			Metadata struct {
				Labels      map[string]json.RawMessage `json:"f:labels"`
				Annotations map[string]json.RawMessage `json:"f:annotations"`
			} `json:"f:metadata"`
		}
		if json.Unmarshal(e.FieldsV1.Raw, &f) != nil {
			continue
		}
		for k := range f.Metadata.Labels {
			if key, ok := strings.CutPrefix(k, "f:"); ok {
				labels[key] = true
			}
		}
		for k := range f.Metadata.Annotations {
			if key, ok := strings.CutPrefix(k, "f:"); ok {
				annotations[key] = true
			}
		}
	}
	return labels, annotations
}
