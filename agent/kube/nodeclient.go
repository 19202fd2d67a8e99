package kube

import (
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// nodeClient is all the labeler asks of the API server: its own Node, a
// server-side apply of its labels and annotations to it, and, to adopt a
// label, a patch of its managedFields.
//
// It is a REST client for the core group's Nodes with a scheme of the core
// types alone, not client-go's clientset: the clientset's packages register
// every API group at start-up (and the apply configurations parse their
// schema), about 10 MiB of the daemon's resident memory for two requests
// the labeler never makes. The requests are those the clientset's typed
// client sends (GET /api/v1/nodes/NAME; PATCH of an apply patch or a JSON
// patch with fieldManager), and its errors are the same
// *errors.StatusError.
type nodeClient struct{ c rest.Interface }

// nodeCodecs know the core group's types and the meta types (Status,
// for the server's errors).
var nodeCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return serializer.NewCodecFactory(s)
}()

// newNodeClient makes the client for rc, which it changes (a copy is
// the caller's to give).
func newNodeClient(rc *rest.Config) (*nodeClient, error) {
	rc.GroupVersion = &corev1.SchemeGroupVersion
	rc.APIPath = "/api"
	rc.NegotiatedSerializer = nodeCodecs.WithoutConversion()
	c, err := rest.RESTClientFor(rc)
	if err != nil {
		return nil, err
	}
	return &nodeClient{c: c}, nil
}

// GetNode reads Node name.
func (n *nodeClient) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	node := &corev1.Node{}
	err := n.c.Get().Resource("nodes").Name(name).Do(ctx).Into(node)
	return node, err
}

// nodeApply is the apply patch of a Node's labels and annotations: what
// applyconfigurations' Node(name).WithLabels(...).WithAnnotations(...)
// encodes (an empty map is left out, as there).
type nodeApply struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   nodeApplyObj `json:"metadata"`
}

type nodeApplyObj struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ApplyNode applies labels and annotations to Node name as FieldManager,
// without forcing: a key another manager holds is a conflict.
func (n *nodeClient) ApplyNode(ctx context.Context, name string, labels, annotations map[string]string) error {
	body, err := json.Marshal(nodeApply{APIVersion: "v1", Kind: "Node", Metadata: nodeApplyObj{Name: name, Labels: labels, Annotations: annotations}})
	if err != nil {
		return err
	}
	return n.c.Patch(types.ApplyPatchType).Resource("nodes").Name(name).
		VersionedParams(&metav1.PatchOptions{FieldManager: FieldManager}, metav1.ParameterCodec).
		Body(body).Do(ctx).Error()
}

// jsonPatchOp is one operation of a JSON patch (RFC 6902).
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// SetManagedFields replaces the managedFields of Node name, and nothing
// else, if its resourceVersion is still resourceVersion: the patch sets
// it, so the server answers 409 Conflict for a Node changed since. (A
// JSON patch "test" of it fails with a bare 422 instead, which cannot be
// told from a patch the server finds invalid.) A non-apply write with
// explicit managedFields is recorded as written; as it changes no other
// field, no entry of its own is added.
func (n *nodeClient) SetManagedFields(ctx context.Context, name, resourceVersion string, mf []metav1.ManagedFieldsEntry) error {
	body, err := json.Marshal([]jsonPatchOp{
		{Op: "replace", Path: "/metadata/resourceVersion", Value: resourceVersion},
		{Op: "replace", Path: "/metadata/managedFields", Value: mf},
	})
	if err != nil {
		return err
	}
	return n.c.Patch(types.JSONPatchType).Resource("nodes").Name(name).
		VersionedParams(&metav1.PatchOptions{FieldManager: FieldManager}, metav1.ParameterCodec).
		Body(body).Do(ctx).Error()
}
