package kube

import "gopkg.in/yaml.v3"

// ServerOf is the API server URL of a kubeconfig's first cluster, "" when
// b is not a kubeconfig that names one. The file holds credentials: a
// caller reports that it did not parse, never what it held.
func ServerOf(b []byte) string {
	var kc struct {
		Clusters []struct {
			Cluster struct {
				Server string `yaml:"server"`
			} `yaml:"cluster"`
		} `yaml:"clusters"`
	}
	if yaml.Unmarshal(b, &kc) != nil || len(kc.Clusters) == 0 {
		return ""
	}
	return kc.Clusters[0].Cluster.Server
}
