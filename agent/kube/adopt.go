package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Adoption (kubernetes.adoptLabels) takes a label over from another field
// manager without the label ever leaving the Node.
//
// A forced apply cannot do it: it takes a key only where the values
// differ, and a key another manager owns with nodeagent's value stays
// shared, so removing it from the config would leave it on the Node. A
// non-apply write that changes the value gives the key to an Update entry
// of the writer (the API server records {manager: nodeagent, operation:
// Update}), which nodeagent's applies never release either. So adoption is
// two writes in one sync:
//
//  1. a JSON patch that rewrites only metadata.managedFields: the key is
//     removed from every other entry (an entry left owning nothing is
//     dropped) and added to nodeagent's Apply entry (created if there is
//     none). The value is untouched, so the label cannot disappear, and no
//     field changes hands by the server's own accounting: the server
//     records the entries as written. The patch also sets
//     metadata.resourceVersion to the one read, a precondition: if the
//     Node changed since, the server answers 409 Conflict and the sync
//     fails into the usual backoff, to read and try again.
//  2. the regular apply, which now sets nodeagent's value where it
//     differs, without a conflict: nodeagent is the key's only owner.
//
// From then on the key is nodeagent's like any other it applies, and SSA
// removes it when it leaves the desired set. Should another manager claim
// it again (kubectl label --overwrite), the next sync adopts it again.

// takeovers returns the keys of want that cfg adopts, the Node carries,
// and a managedFields entry other than nodeagent's Apply entry owns,
// sorted.
func takeovers(node *corev1.Node, want map[string]string, adopt []string) []string {
	var out []string
	for _, key := range adopt {
		if _, wanted := want[key]; !wanted {
			continue
		}
		if _, on := node.Labels[key]; !on || slices.Contains(out, key) {
			continue
		}
		if len(otherOwners(node.ManagedFields, key)) > 0 {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// isOurs reports whether e is nodeagent's Apply entry.
func isOurs(e metav1.ManagedFieldsEntry) bool {
	return e.Manager == FieldManager && e.Operation == metav1.ManagedFieldsOperationApply && e.Subresource == ""
}

// otherOwners names the managedFields entries other than nodeagent's Apply
// entry that own label key, like "kubectl-label (Update)".
func otherOwners(mf []metav1.ManagedFieldsEntry, key string) []string {
	var out []string
	for _, e := range mf {
		if isOurs(e) || e.FieldsV1 == nil {
			continue
		}
		if _, owns, err := editLabel(e.FieldsV1.Raw, key, false); err == nil && owns {
			out = append(out, fmt.Sprintf("%s (%s)", e.Manager, e.Operation))
		}
	}
	return out
}

// adoptedFields returns mf with keys owned by nodeagent's Apply entry
// alone: removed from every other entry, an entry left owning nothing
// dropped, and added to nodeagent's, which is created at now if missing.
func adoptedFields(mf []metav1.ManagedFieldsEntry, keys []string, now time.Time) ([]metav1.ManagedFieldsEntry, error) {
	out := make([]metav1.ManagedFieldsEntry, 0, len(mf)+1)
	ours := -1
	for _, e := range mf {
		e = *e.DeepCopy()
		if e.FieldsV1 != nil && !isOurs(e) {
			dropped := false
			for _, key := range keys {
				raw, owned, err := editLabel(e.FieldsV1.Raw, key, true)
				if err != nil {
					return nil, fmt.Errorf("managedFields entry of %s: %w", e.Manager, err)
				}
				e.FieldsV1.Raw, dropped = raw, dropped || owned
			}
			if dropped && string(e.FieldsV1.Raw) == "{}" {
				continue
			}
		}
		if isOurs(e) && ours < 0 {
			ours = len(out)
		}
		out = append(out, e)
	}
	if ours < 0 {
		t := metav1.NewTime(now.UTC().Truncate(time.Second))
		out = append(out, metav1.ManagedFieldsEntry{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply,
			APIVersion: "v1", Time: &t, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte("{}")}})
		ours = len(out) - 1
	}
	e := &out[ours]
	if e.FieldsV1 == nil {
		e.FieldsType, e.FieldsV1 = "FieldsV1", &metav1.FieldsV1{Raw: []byte("{}")}
	}
	for _, key := range keys {
		raw, err := addLabel(e.FieldsV1.Raw, key)
		if err != nil {
			return nil, fmt.Errorf("managedFields entry of %s: %w", FieldManager, err)
		}
		e.FieldsV1.Raw = raw
	}
	return out, nil
}

// fieldSet is one level of a FieldsV1 document: "f:name" (or "." for the
// map itself) to the level below, which is kept as written.
type fieldSet map[string]json.RawMessage

// editLabel reports whether the FieldsV1 document raw owns label key
// (f:metadata.f:labels.f:<key>) and, if remove, returns raw without it,
// with the levels it leaves empty removed; otherwise raw unchanged.
func editLabel(raw []byte, key string, remove bool) ([]byte, bool, error) {
	var top, meta, labels fieldSet
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, false, err
	}
	m, ok := top["f:metadata"]
	if !ok {
		return raw, false, nil
	}
	if err := json.Unmarshal(m, &meta); err != nil {
		return nil, false, err
	}
	l, ok := meta["f:labels"]
	if !ok {
		return raw, false, nil
	}
	if err := json.Unmarshal(l, &labels); err != nil {
		return nil, false, err
	}
	if _, ok := labels["f:"+key]; !ok {
		return raw, false, nil
	}
	if !remove {
		return raw, true, nil
	}
	delete(labels, "f:"+key)
	if err := setLevel(meta, "f:labels", labels); err != nil {
		return nil, true, err
	}
	if err := setLevel(top, "f:metadata", meta); err != nil {
		return nil, true, err
	}
	out, err := json.Marshal(top)
	return out, true, err
}

// addLabel returns the FieldsV1 document raw owning label key too.
func addLabel(raw []byte, key string) ([]byte, error) {
	top, meta, labels := fieldSet{}, fieldSet{}, fieldSet{}
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, err
	}
	if m, ok := top["f:metadata"]; ok {
		if err := json.Unmarshal(m, &meta); err != nil {
			return nil, err
		}
	}
	if l, ok := meta["f:labels"]; ok {
		if err := json.Unmarshal(l, &labels); err != nil {
			return nil, err
		}
	}
	labels["f:"+key] = json.RawMessage("{}")
	if err := setLevel(meta, "f:labels", labels); err != nil {
		return nil, err
	}
	if err := setLevel(top, "f:metadata", meta); err != nil {
		return nil, err
	}
	return json.Marshal(top)
}

// setLevel stores below under name in s, or removes name if below is
// empty.
func setLevel(s fieldSet, name string, below fieldSet) error {
	if len(below) == 0 {
		delete(s, name)
		return nil
	}
	b, err := json.Marshal(below)
	if err != nil {
		return err
	}
	s[name] = b
	return nil
}

// adopt makes nodeagent the only owner of keys on node (see above). It
// changes nothing but node's managedFields.
func (l *Labeler) adopt(ctx context.Context, c *nodeClient, node *corev1.Node, keys []string) error {
	mf, err := adoptedFields(node.ManagedFields, keys, l.now())
	if err != nil {
		return err
	}
	if err := c.SetManagedFields(ctx, node.Name, node.ResourceVersion, mf); err != nil {
		return err
	}
	for _, key := range keys {
		l.log.Info("label adopted", "node", node.Name, "label", key, "value", node.Labels[key],
			"from", strings.Join(otherOwners(node.ManagedFields, key), ", "))
	}
	return nil
}
