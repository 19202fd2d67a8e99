package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
)

// TestCoexistenceNamesNetworkd: with a systemd-networkd running at its
// defaults and a .network file whose Name=en* catches the lab's VLAN (or,
// on a kernel without 8021q, Kind=macvlan the shim), the daemon's
// Coexistence condition names both settings and the file with their
// fixes, logs each once, and does not degrade the node; with the shipped
// drop-in's settings and the match narrowed, it turns True at the next
// look (the fixture tree stands in for /etc, /usr/lib and /proc).
func TestCoexistenceNamesNetworkd(t *testing.T) {
	l := newLab(t)
	root := t.TempDir()
	put := func(rel, body string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("etc/systemd/networkd.conf", "[Network]\n#ManageForeignRoutes=yes\n")
	caught, match := "enp1s0.50", "Name=en*"
	if !l.vlan {
		caught, match = "shim0", "Kind=macvlan"
	}
	put("usr/lib/systemd/network/20-uplink.network", "[Match]\n"+match+"\n[Network]\nDHCP=yes\n")
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) {
		o.Hazards = hazard.Paths{Root: root}
		o.HazardSystem = &hazard.System{Networkd: true, Udev: true, Version: 252}
		o.Resync = 300 * time.Millisecond
	})
	cond := func() *api.Condition { s := r.d.Status(); return s.Condition(api.CondCoexistence) }
	waitFor(t, "Coexistence False", 10*time.Second, func() bool { c := cond(); return c != nil && c.Status == api.False })
	c := cond()
	for _, want := range []string{
		"ManageForeignRoutingPolicyRules=yes", "ManageForeignRoutes=yes", "networkd.conf.d/nodeagent.conf",
		"usr/lib/systemd/network/20-uplink.network", "catches nodeagent's link " + caught, "Name=!" + caught,
	} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Coexistence lacks %q: %s", want, c.Message)
		}
	}
	if s := r.d.Status(); !s.Ready || s.Degraded {
		t.Errorf("ready %v degraded %v: a hazard must neither hold back Ready nor degrade", s.Ready, s.Degraded)
	}
	time.Sleep(time.Second) // several resyncs
	if n := strings.Count(r.log.String(), "a neighbour undoes nodeagent's work"); n != 3 {
		t.Errorf("%d WARN lines for 3 hazards over several looks, want 3", n)
	}

	// The shipped drop-in's settings (packaging's TestNetworkdDropInClears-
	// TheHazard checks the file itself; the VM tier has no source tree).
	put("etc/systemd/networkd.conf.d/nodeagent.conf", "[Network]\nManageForeignRoutingPolicyRules=no\nManageForeignRoutes=no\n")
	put("usr/lib/systemd/network/20-uplink.network", "[Match]\nName=enp1s0\n[Network]\nDHCP=yes\n")
	waitFor(t, "Coexistence True once fixed", 10*time.Second, func() bool { c := cond(); return c != nil && c.Status == api.True })
}
