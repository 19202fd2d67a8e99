// Command kube-apiserver is the upstream Kubernetes API server, built from the
// k8s.io/kubernetes module at the version pinned in go.mod. The test harness
// in testenv/kubetest builds it on demand; no binary is committed.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
