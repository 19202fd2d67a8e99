package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// resources maps the kinds a shipped manifest may hold to their resource
// and whether they are namespaced: what kubectl apply learns from
// discovery, for the few kinds nodeagent ships.
var resources = map[schema.GroupVersionKind]struct {
	res        string
	namespaced bool
}{
	{Version: "v1", Kind: "Namespace"}:                                              {"namespaces", false},
	{Version: "v1", Kind: "ServiceAccount"}:                                         {"serviceaccounts", true},
	{Version: "v1", Kind: "Secret"}:                                                 {"secrets", true},
	{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"}:                    {"leases", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}:               {"roles", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"}:        {"rolebindings", true},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}:        {"clusterroles", false},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"}: {"clusterrolebindings", false},
}

// ApplyManifest creates, as an admin, every object of the multi-document
// YAML file at path, as `kubectl create -f` would, with edit applied to
// each first (nil: none). Only the kinds nodeagent ships are known.
func (s *Server) ApplyManifest(ctx context.Context, path string, edit func(*unstructured.Unstructured)) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		r, ok := resources[gvk]
		if !ok {
			return fmt.Errorf("%s: kind %s is not one kubetest knows", path, gvk)
		}
		if edit != nil {
			edit(&obj)
		}
		gvr := gvk.GroupVersion().WithResource(r.res)
		var ri dynamic.ResourceInterface = dc.Resource(gvr)
		if r.namespaced {
			ri = dc.Resource(gvr).Namespace(obj.GetNamespace())
		}
		if _, err := ri.Create(ctx, &obj, metav1.CreateOptions{FieldManager: "kubectl-create"}); err != nil {
			return fmt.Errorf("%s: %s %s: %w", path, gvk.Kind, obj.GetName(), err)
		}
	}
}

// ServiceAccountConfig returns a client config that authenticates as
// ServiceAccount ns/name, with a token from the TokenRequest API (the
// Secret-based token a manifest asks for needs kube-controller-manager,
// which this server does not run).
func (s *Server) ServiceAccountConfig(ctx context.Context, ns, name string) (*rest.Config, error) {
	exp := int64(3600)
	tr, err := s.Admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", ns, name, err)
	}
	return &rest.Config{Host: s.URL, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: s.pki.caPEM}}, nil
}

// WriteKubeconfig writes rc (a bearer token's) as a kubeconfig file at
// path, mode 0600, as an operator would make one from a ServiceAccount's
// token, and with server as the API server's address instead of rc's when
// set (a proxy's).
func WriteKubeconfig(path string, rc *rest.Config, server string) error {
	if server == "" {
		server = rc.Host
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken, ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}
