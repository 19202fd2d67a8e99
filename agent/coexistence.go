package agent

import (
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
)

// hazards lists what a running systemd-networkd would do to d's objects
// (package hazard): its settings that delete foreign routing, where d has
// routing, and the .network files whose [Match] catches one of d's links.
// macs are the links' hardware addresses by name; a VLAN not made yet is
// matched with its parent's, which it will have.
func hazards(p hazard.Paths, d netcfg.Desired, macs map[string]net.HardwareAddr) []hazard.Hazard {
	var links []hazard.Link
	for _, l := range d.Link.Links {
		mac := macs[l.Name]
		if mac == nil && l.Kind == link.VLAN {
			mac = macs[l.Parent]
		}
		links = append(links, hazard.Link{Name: l.Name, Kind: string(l.Kind), MAC: mac})
	}
	for _, dev := range d.WG.Devices {
		links = append(links, hazard.Link{Name: dev.Name, Kind: "wireguard", MAC: macs[dev.Name]})
	}
	var out []hazard.Hazard
	for _, hz := range hazard.Networkd(p, links) {
		if hz.Setting != "" && !usesRouting(d) {
			continue
		}
		out = append(out, hz)
	}
	return out
}

// networkdHazards is hazards for plan and apply --once, with the MACs read
// from h, one line each.
func networkdHazards(h *host.Host, d netcfg.Desired) []string {
	macs := map[string]net.HardwareAddr{}
	if ls, err := h.Snapshot().Links(); err == nil {
		for _, l := range ls {
			macs[l.Name] = l.HardwareAddr
		}
	}
	var out []string
	for _, hz := range hazards(hazard.Paths{}, d, macs) {
		out = append(out, hz.String())
	}
	return out
}

// hazardsEvery bounds how often the daemon looks for hazards between
// config loads: it reads networkd's configuration and scans /proc.
const hazardsEvery = 30 * time.Second

// repairLook bounds how often a drift repair makes the daemon look for
// hazards again.
const repairLook = time.Second

// checkHazards sets the Coexistence condition from the hazards found on
// this node, at most every hazardsEvery (or resync period), at every config
// load and whenever a neighbour's files or state changed (d.neighbours),
// with the MACs the sync observed.
func (d *Daemon) checkHazards(res netcfg.Result) {
	obs := res.Post.Link.Observed
	macs := map[string]net.HardwareAddr{}
	for name, ol := range obs.Links {
		macs[name] = obs.MACs[ol.Index]
	}
	d.hazardMACs = macs
	every := min(hazardsEvery, d.o.Resync)
	if d.hash == d.hazardHash && time.Since(d.hazardAt) < every {
		return
	}
	d.evalHazards()
}

// evalHazards looks for hazards now. A new set is logged at WARN, each
// with its fix, once.
func (d *Daemon) evalHazards() {
	d.hazardHash, d.hazardAt = d.hash, time.Now()
	hs := hazards(d.o.Hazards, d.desired, d.hazardMACs)
	hs = append(hs, d.nm.hazards(desiredLinks(d.desired))...)
	d.hazardsFound = hs
	lines := make([]string, len(hs))
	for i, hz := range hs {
		lines[i] = hz.String()
	}
	key := strings.Join(lines, "\n")
	if key != d.hazardLogged {
		d.hazardLogged = key
		for _, hz := range hs {
			d.log.Warn("a neighbour undoes nodeagent's work", "source", hz.Source, "what", hz.What, "fix", hz.Fix)
		}
	}
	if len(hs) == 0 {
		d.setCondition(api.CondCoexistence, api.True, "NoHazards", "")
		return
	}
	d.setCondition(api.CondCoexistence, api.False, "HazardsFound", strings.Join(lines, "; "))
}

// desiredLinks are the names of d's links and WireGuard devices.
func desiredLinks(d netcfg.Desired) []string {
	var out []string
	for _, l := range d.Link.Links {
		out = append(out, l.Name)
	}
	for _, dev := range d.WG.Devices {
		out = append(out, dev.Name)
	}
	return out
}

// neighbourChanged tells the loop that a neighbour's files or state
// changed; it never blocks.
func (d *Daemon) neighbourChanged() {
	select {
	case d.neighbours <- struct{}{}:
	default:
	}
}

// repairCauses logs, at WARN and once per cause for the daemon's life, the
// hazards that explain the repairs (kind to count) of a drift sync: an
// operator reads why nodeagent keeps putting things back, and its fix, not
// a line per repair. A repair no known hazard explains is logged once per
// kind. It returns whether anything was logged.
func (d *Daemon) repairCauses(repairs map[string]int) bool {
	if d.causesLogged == nil {
		d.causesLogged = map[string]bool{}
	}
	logged := false
	for _, kind := range slices.Sorted(maps.Keys(repairs)) {
		explained := false
		for _, hz := range d.hazardsFound {
			if !slices.Contains(hz.Kinds, kind) {
				continue
			}
			explained = true
			if key := hz.Source + "\x00" + hz.What; !d.causesLogged[key] {
				d.causesLogged[key] = true
				logged = true
				d.log.Warn("repairing what a neighbour deleted", "kind", kind, "cause", hz.Source+": "+hz.What, "fix", hz.Fix)
			}
		}
		if key := "\x00" + kind; !explained && !d.causesLogged[key] {
			d.causesLogged[key] = true
			logged = true
			d.log.Warn("repairing what another program changed; no known neighbour explains it", "kind", kind,
				"hint", "nodeagent_drift_repairs_total counts every repair; nodeagentctl status lists the neighbours it knows of")
		}
	}
	return logged
}
