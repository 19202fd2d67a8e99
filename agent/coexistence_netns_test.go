package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/testenv"
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

// TestFightBackedOff: a program that deletes the shim's address and adds
// it back in its own form (noprefixroute, a lease's lifetime) every 100 ms
// meets nodeagent's repair FightBound times, then one repair per resync:
// the Conflict condition names the address, the rate and the suspect,
// and the node reads degraded. The kill-switch table's route, deleted
// meanwhile every 500 ms, is repaired at once each time. Once the program
// stops, the address is nodeagent's again at the next resync, and the
// fight is over a window later.
func TestFightBackedOff(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: it times another program's changes against the daemon's debounce and repairs, which TCG's slowness in the VM blurs (the package VM's fight and ifupdown steps run the real thing on Debian's kernel)")
	}
	l := newLab(t)
	const (
		bound  = 5
		window = 3 * time.Second
		resync = time.Second
		fight  = 4 * time.Second
	)
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) {
		o.Resync, o.FightBound, o.FightWindow = resync, bound, window
		o.Hazards, o.HazardSystem = hazard.Paths{Root: t.TempDir()}, &hazard.System{}
	})
	n := l.node
	repairs := func() float64 {
		mfs, _ := r.d.Metrics().Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "nodeagent_drift_repairs_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetValue() == "address" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	ksRoute := func() bool {
		out, _ := n.TryExec("ip", "route", "show", "table", "150")
		return strings.Contains(out, "10.70.0.0/24 dev shim0")
	}
	ours := func() bool {
		out, _ := n.TryExec("ip", "addr", "show", "dev", "shim0")
		return strings.Contains(out, "10.10.50.3/24") && !strings.Contains(out, "noprefixroute") && strings.Contains(out, "valid_lft forever")
	}
	readd := writeBatch(t, t.TempDir(), "addr del 10.10.50.3/24 dev shim0", "addr add 10.10.50.3/24 dev shim0 noprefixroute valid_lft 300 preferred_lft 300")
	before := repairs()
	start := time.Now()
	var ksLat []time.Duration
	next := start
	for time.Since(start) < fight {
		// One ip process, as the sh -c was: not sh -c, whose busybox in
		// the VM runs its own ip applet, which knows neither
		// noprefixroute nor lifetimes.
		n.TryExec("ip", "-force", "-batch", readd)
		if time.Now().After(next) {
			next = time.Now().Add(500 * time.Millisecond)
			// (Deleting the shim's only IPv4 address flushes the routes
			// through it too: the route may be gone already.)
			waitFor(t, "the kill-switch route", 2*time.Second, ksRoute)
			n.TryExec("ip", "route", "del", "10.70.0.0/24", "table", "150")
			ksLat = append(ksLat, waitFor(t, "the kill-switch route back", 2*time.Second, ksRoute))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopped := time.Now()
	got := repairs() - before
	maxRepairs := float64(bound) + float64(fight/resync) + 1
	t.Logf("the address was repaired %.0f times in %s of changes every 100 ms (bound %d, then one per %s resync); the kill-switch route was repaired %d times, slowest %s",
		got, fight, bound, resync, len(ksLat), slices.Max(ksLat))
	if got > maxRepairs || got < bound {
		t.Errorf("address repairs %.0f, want between %d and %.0f", got, bound, maxRepairs)
	}
	if slices.Max(ksLat) > time.Second {
		t.Errorf("a deleted kill-switch route took %s to come back: it must never be backed off", slices.Max(ksLat))
	}
	s := r.d.Status()
	c := s.Condition(api.CondConflict)
	if c == nil || c.Status != api.False {
		t.Fatalf("Conflict %+v", c)
	}
	for _, want := range []string{"address 10.10.50.3/24 on shim0", "repairs in", "noprefixroute", "once per resync", "most likely a DHCP client or NetworkManager"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Conflict lacks %q: %s", want, c.Message)
		}
	}
	if !s.Degraded {
		t.Error("not degraded during the fight")
	}
	// The program stopped: ours again at the next resync.
	back := waitFor(t, "the address nodeagent's again", 2*resync+time.Second, ours)
	t.Logf("the address was nodeagent's again %s after the program stopped", time.Since(stopped).Round(10*time.Millisecond))
	_ = back
	waitFor(t, "the fight over", window+3*resync, func() bool {
		s := r.d.Status()
		c := s.Condition(api.CondConflict)
		return c != nil && c.Status == api.True && !s.Degraded
	})
	if n := strings.Count(r.log.String(), "backing off: another program keeps changing"); n != 1 {
		t.Errorf("%d back-off lines, want 1", n)
	}
}

// TestRenamedOrRealiasedLinkStaysOurs: another program renames the shim
// (as udev's .link Name= does when it appears) or overwrites its alias,
// nodeagent's mark (udev's Alias=, an ifupdown description): the daemon
// gives the link its name or its mark back, the same link (its ifindex),
// never deleting it and making it again, and never reading it as foreign.
func TestRenamedOrRealiasedLinkStaysOurs(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: it times another program's changes against the daemon's debounce and repairs, which TCG's slowness in the VM blurs (the package VM's fight and ifupdown steps run the real thing on Debian's kernel)")
	}
	l := newLab(t)
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) {
		o.Hazards, o.HazardSystem = hazard.Paths{Root: t.TempDir()}, &hazard.System{}
	})
	n := l.node
	ifindex := func() string {
		out, err := n.TryExec("ip", "-o", "link", "show", "shim0")
		if err != nil {
			return ""
		}
		i, _, _ := strings.Cut(out, ":")
		return i
	}
	before := ifindex()
	for i := range 3 {
		// In one batch, as udev renames a link that is down: the daemon's
		// debounce is longer than the batch.
		// (A file, not sh -c: the VM's busybox sh runs its own ip applet,
		// which has no -batch.)
		n.Exec(t, "ip", "-batch", writeBatch(t, t.TempDir(), "link set shim0 down", "link set shim0 name mv0", "link set mv0 up"))
		waitFor(t, "shim0 back", 5*time.Second, func() bool { return ifindex() == before })
		out := n.Exec(t, "ip", "-d", "link", "show", "shim0")
		// Up as set (the flags): its operstate is UNKNOWN over the VM's
		// dummy trunk.
		if !strings.Contains(out, "alias nodeagent") || !strings.Contains(out, ",UP,") {
			t.Errorf("rename %d: shim0 came back as %s", i, out)
		}
		n.Exec(t, "ip", "link", "set", "shim0", "alias", "lab")
		waitFor(t, "the mark back", 5*time.Second, func() bool {
			out, _ := n.TryExec("ip", "-d", "link", "show", "shim0")
			return strings.Contains(out, "alias nodeagent")
		})
	}
	if got := ifindex(); got != before {
		t.Errorf("shim0 is a new link (ifindex %s, was %s)", got, before)
	}
	// ifdown and ifup (systemctl restart networking with a stanza for the
	// link): deleted and made again just like it at once by another
	// program. It takes the place of nodeagent's and is taken for it.
	n.Exec(t, "ip", "-batch", writeBatch(t, t.TempDir(), "link del shim0", "link add shim0 link enp1s0 type macvlan mode bridge", "link set shim0 up"))
	waitFor(t, "the remade link marked, with its address", 5*time.Second, func() bool {
		out, _ := n.TryExec("ip", "-d", "addr", "show", "shim0")
		return strings.Contains(out, "alias nodeagent") && strings.Contains(out, "10.10.50.3/24")
	})
	log := r.log.String()
	for _, want := range []string{"rename back from mv0", "another program changed its alias", "another program made it again in the place of nodeagent's"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q", want)
		}
	}
	if strings.Contains(log, "exists and was not created by nodeagent") || strings.Contains(log, `op="- link shim0`) {
		t.Error("the link was taken for a foreign one, or deleted")
	}
}
