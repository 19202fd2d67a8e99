package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
)

// syncClients converges yaml (client devices) in ns with nodeagent's own
// converger, userspace devices living until the test ends.
func syncClients(t *testing.T, ns *testenv.NetNS, yaml string) {
	t.Helper()
	c, err := config.Parse(filepath.Join(t.TempDir(), "clients.yaml"), []byte(yaml))
	if err != nil {
		t.Fatalf("clients' config: %v", err)
	}
	d, err := netcfg.FromConfig(c, "")
	if err != nil {
		t.Fatal(err)
	}
	us := wg.NewUserspace(nil)
	t.Cleanup(us.Close)
	cv := &netcfg.Converger{Host: ns.Host, Userspace: us}
	t.Cleanup(cv.Close)
	if _, err := cv.Sync(context.Background(), d); err != nil {
		t.Fatalf("clients' sync: %v", err)
	}
}
