package netcfg

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

// TestTeardownStopsAtAFailure: when removing the routing step fails (its
// rt_tables.d file sits on a read-only filesystem), teardown stops there
// and says so; the kill switch, which comes last, stays in the kernel.
func TestTeardownStopsAtAFailure(t *testing.T) {
	node := testenv.NewNetNS(t)
	run(t, node, "ip link add tun0 type veth peer name tun0p", "ip link set tun0 up")
	cfg := `sysctls: {net.ipv4.ip_forward: "1"}
routing:
  tables:
    - {id: 150, name: egress, killSwitch: true, routes: [{to: default, dev: tun0}]}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  killSwitch: [{from: 10.10.50.0/24, allowOut: [tun0]}]
`
	dir := t.TempDir()
	tables := filepath.Join(dir, "rt_tables.d", "nodeagent.conf")
	c, err := config.ParseWith("nodeagent.yaml", []byte(cfg), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	d, err := FromConfig(c, tables)
	if err != nil {
		t.Fatal(err)
	}
	cv := &Converger{Host: node.Host}
	if _, err := cv.Sync(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tables); err != nil {
		t.Fatalf("the tables file was not written: %v", err)
	}
	// The tables file's directory goes read-only under it.
	ro := filepath.Dir(tables)
	if err := unix.Mount(ro, ro, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
	if err := unix.Mount("", ro, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Skipf("remount read-only: %v", err)
	}
	_, err = cv.Teardown(context.Background(), tables, nil)
	if err == nil || !strings.Contains(err.Error(), "stopped at routes; left in place: nftables") {
		t.Fatalf("teardown with the routing step failing: %v", err)
	}
	if out := node.Exec(t, "nft", "list", "tables"); !strings.Contains(out, "table inet nodeagent") {
		t.Errorf("teardown removed the kill switch after a failed step:\n%s", out)
	}
	// Writable again: teardown finishes.
	unix.Unmount(ro, unix.MNT_DETACH)
	if _, err := cv.Teardown(context.Background(), tables, nil); err != nil {
		t.Fatal(err)
	}
	if out := node.Exec(t, "nft", "list", "tables"); strings.Contains(out, "nodeagent") {
		t.Errorf("teardown left:\n%s", out)
	}
}
