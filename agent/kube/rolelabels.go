package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"k8s.io/client-go/tools/clientcmd"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// RoleFieldManager is the field manager of a role's labels (a gateway
// role's, netcfg/config.Gateway): apart from FieldManager's, so that they
// can be taken off a Node by an apply of that manager alone, without
// knowing (and so removing) what the node's own labeller keeps there. The
// next holder of a role takes them off a holder that died this way.
const RoleFieldManager = "nodeagent-role"

// LabelClient applies a role's labels to Nodes by server-side apply as
// RoleFieldManager.
type LabelClient struct{ n *nodeClient }

// NewLabelClient makes a LabelClient for rc (copied).
func NewLabelClient(rc *rest.Config) (*LabelClient, error) {
	n, err := newNodeClient(rest.CopyConfig(rc))
	if err != nil {
		return nil, err
	}
	return &LabelClient{n: n}, nil
}

// ApplyRoleLabels makes labels the whole set of labels RoleFieldManager
// keeps on Node node: a key it kept before and labels lacks leaves the
// Node (nil or empty labels: every one). Keys another manager owns are
// conflicts, not taken (no force).
func (c *LabelClient) ApplyRoleLabels(ctx context.Context, node string, labels map[string]string) error {
	obj := nodeApply{APIVersion: "v1", Kind: "Node", Metadata: nodeApplyObj{Name: node, Labels: labels}}
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	err = c.n.c.Patch(types.ApplyPatchType).Resource("nodes").Name(node).
		VersionedParams(&metav1.PatchOptions{FieldManager: RoleFieldManager}, metav1.ParameterCodec).
		Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("node %s: role labels: %w", node, err)
	}
	return nil
}

// RoleLabels returns the labels RoleFieldManager keeps on Node node, as
// the Node has them.
func (c *LabelClient) RoleLabels(ctx context.Context, node string) (map[string]string, error) {
	n, err := c.n.GetNode(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	out := map[string]string{}
	keys, _ := owned(n.ManagedFields, RoleFieldManager)
	for key := range keys {
		if v, ok := n.Labels[key]; ok {
			out[key] = v
		}
	}
	return out, nil
}

// RESTConfig is the client config the Labeler of cfg would use: its
// kubeconfig, the in-cluster service account, or the k3s kubelet's, with
// nodeagent's user agent and the cap on response bodies. No request
// timeout is set: the caller bounds each request by its context (a watch
// lasts).
func RESTConfig(cfg Config) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	switch {
	case cfg.RESTConfig != nil:
		rc = rest.CopyConfig(cfg.RESTConfig)
	case cfg.Kubeconfig != "":
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		rc, err = rest.InClusterConfig()
	default:
		rc, err = clientcmd.BuildConfigFromFlags("", DefaultKubeconfig)
	}
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "nodeagent"
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return capBodies{rt} })
	return rc, nil
}

// maxKubeconfig bounds a kubeconfig file's size.
const maxKubeconfig = 1 << 20

// LoadKubeconfig reads the kubeconfig at path as a file others may have
// written: opened without following a link, a regular file of root's
// (private: readable by root alone) of at most 1 MiB, and returns its
// client config, as RESTConfig sets it up. Errors name the file, never
// its content.
func LoadKubeconfig(path string, private bool) (*rest.Config, error) {
	raw, err := fsafe.ReadFile(path, fsafe.Rules{Private: private, RootOwned: true, MaxSize: maxKubeconfig})
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: not a usable kubeconfig", path)
	}
	return RESTConfig(Config{RESTConfig: rc})
}
