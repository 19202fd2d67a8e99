package agent

import (
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/waiting"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/host"
)

// trackWaits follows, from one sync's report, the objects that wait for a
// link the config does not create (a parent NIC, a device a route names).
// It logs once, at WARN, each wait that went past the bound, and exports
// how many objects wait. The waits it returns keep the node from reading
// as ready; those over the bound also degrade it.
func (d *Daemon) trackWaits(res netcfg.Result) (waits, over []waiting.Wait) {
	waits, newly := d.waits.Update(time.Now(), res.Report, createsLink(d.desired), func() []string { return linkNames(d.host) })
	n := 0
	for _, w := range waits {
		n += len(w.Objects)
		if w.Over {
			over = append(over, w)
		}
	}
	d.metrics.SetPendingObjects(n)
	d.followWaits(waits)
	for _, w := range newly {
		d.log.Warn("objects wait for a link that does not exist and that the config does not create; the node is degraded until it appears",
			"link", w.Missing, "for", time.Since(w.Since).Round(time.Second), "objects", strings.Join(w.Objects, ", "), "suggest", w.Suggest)
	}
	return waits, over
}

// followWaits makes the links waits name part of what the event filter
// looks for, so that the kernel's event for one appearing triggers the
// sync that puts the waiting objects in place (an OpenVPN tun made after
// the daemon started: the VLAN's kill-switch table has no way out until
// then). A link that appeared after this sync observed and before the
// filter looked for it sent its event unseen: one that exists now is a
// sync now.
func (d *Daemon) followWaits(waits []waiting.Wait) {
	names := make([]string, 0, len(waits))
	for _, w := range waits {
		names = append(names, w.Missing) // sorted by Missing
	}
	if slices.Equal(names, d.waitingFor) {
		return
	}
	added := !isSubset(names, d.waitingFor)
	d.waitingFor = names
	d.want.Store(interestOf(d.desired, names))
	if !added {
		return
	}
	for _, l := range linkNames(d.host) {
		if slices.Contains(names, l) {
			d.kickNow(trigEvent)
			return
		}
	}
}

// isSubset reports whether every name of a is in b.
func isSubset(a, b []string) bool {
	for _, n := range a {
		if !slices.Contains(b, n) {
			return false
		}
	}
	return true
}

// waitsDue is when a sync should look again because a wait reaches the
// bound (the node is degraded then, not at the next resync); false when
// no wait is under the bound.
func (d *Daemon) waitsDue() (time.Duration, bool) {
	return d.waits.Due(time.Now())
}

// createsLink says whether des makes a link (or WireGuard device) of that
// name: a wait for one is a step of a sync, not a fault.
func createsLink(des netcfg.Desired) func(string) bool {
	creates := map[string]bool{}
	for _, l := range des.Link.Links {
		creates[l.Name] = true
	}
	for _, dev := range des.WG.Devices {
		creates[dev.Name] = true
	}
	return func(n string) bool { return creates[n] }
}

// linkNames lists the names of the links h has, for suggestions; none
// when they cannot be read.
func linkNames(h *host.Host) []string {
	ls, err := h.Snapshot().Links()
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(ls))
	for _, l := range ls {
		names = append(names, l.Name)
	}
	return names
}
