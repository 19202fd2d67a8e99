package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestAddressReownedAndReaddedQuickly runs the daemon with the configured
// duplicate-address detection at three probes a second apart, and
// (a) does what NetworkManager's reapply does to an address of a link it
// took as externally connected: deletes it and adds the same prefix with
// noprefixroute and no mark. The daemon, woken by the kernel's events,
// makes it its own again, and counts one repair of kind "address".
// (b) deletes the address ten times and measures how long it takes to come
// back: a re-add of an address that was the daemon's moments ago takes one
// short probe, not the full detection (claims.go in netcfg/link). The
// times are reported, not asserted (target: median < 200 ms).
func TestAddressReownedAndReaddedQuickly(t *testing.T) {
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "enp1s0", peer, "eth0")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(`dad: {probes: 3, interval: 1s, wait: 1s, announcements: 1}
macvlans:
  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}
checks:
  gatewayARP: false
`), 0o600)
	// Eleven repairs of one address in a row are timed, not a fight.
	r := startDaemon(t, node, cfg, func(o *RunOptions) { o.Resync = time.Hour; o.FightBound = 1000 })
	// The test's own handle: the daemon's is the daemon's.
	h, err := host.Open(node.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addr := func() (host.Addr, bool) {
		addrs, err := h.AddrList()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if a.Prefix.String() == "10.10.50.3/24" {
				return a, true
			}
		}
		return host.Addr{}, false
	}
	ours := func() bool { a, ok := addr(); return ok && a.Owned() && len(a.Form()) == 0 }
	repairs := func() float64 {
		mfs, err := r.d.Metrics().Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "nodeagent_drift_repairs_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "kind" && lp.GetValue() == "address" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	waitFor(t, "the address to be the daemon's", 20*time.Second, ours)

	// (a) NetworkManager's form, in one batch (well within the debounce).
	before := repairs()
	node.Exec(t, "ip", "-batch", writeBatch(t, dir,
		"addr del 10.10.50.3/24 dev shim0",
		"addr add 10.10.50.3/24 dev shim0 noprefixroute"))
	if a, ok := addr(); ok && a.Owned() {
		t.Fatal("the planted address carries the daemon's mark")
	}
	took := waitFor(t, "the address in NetworkManager's form to be the daemon's again", 20*time.Second, ours)
	t.Logf("re-own of the address in NetworkManager's form: %s after the batch", took)
	waitFor(t, "the repair to be counted", 5*time.Second, func() bool { return repairs()-before >= 1 })
	time.Sleep(300 * time.Millisecond)
	if got := repairs() - before; got != 1 {
		t.Errorf("nodeagent_drift_repairs_total{kind=\"address\"} rose by %v, want 1", got)
	}
	if !strings.Contains(r.log.String(), "re-own address 10.10.50.3/24 on shim0 (noprefixroute, not ours)") {
		t.Errorf("the log does not name the re-own")
	}

	// (b) Deleted ten times: each back after one short probe.
	const trials = 10
	var lat []time.Duration
	for i := range trials {
		if !ours() {
			t.Fatalf("trial %d: the address is not the daemon's before it", i)
		}
		node.Exec(t, "ip", "addr", "del", "10.10.50.3/24", "dev", "shim0")
		lat = append(lat, waitFor(t, "the address back", 20*time.Second, func() bool { _, ok := addr(); return ok }))
		// Let the sync end (its announcement) and its echo pass.
		time.Sleep(300 * time.Millisecond)
	}
	slices.Sort(lat)
	t.Logf("re-add of a deleted address, delete -> back (configured detection: 3 probes 1s apart, 1s wait): median %s, max %s, all %v",
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), lat)
	if !ours() {
		t.Error("the re-added address is not the daemon's")
	}
}

// writeBatch writes lines as an `ip -batch` file and returns its path.
func writeBatch(t *testing.T, dir string, lines ...string) string {
	t.Helper()
	f := filepath.Join(dir, fmt.Sprintf("batch%d", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
