package agent

import (
	"net"
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

// checkHazards sets the Coexistence condition from the hazards found on
// this node, at most every hazardsEvery (or resync period) and at every
// config load, with the MACs the sync observed. A new set of hazards is
// logged at WARN, each with its fix, once.
func (d *Daemon) checkHazards(res netcfg.Result) {
	every := min(hazardsEvery, d.o.Resync)
	if d.hash == d.hazardHash && time.Since(d.hazardAt) < every {
		return
	}
	d.hazardHash, d.hazardAt = d.hash, time.Now()
	obs := res.Post.Link.Observed
	macs := map[string]net.HardwareAddr{}
	for name, ol := range obs.Links {
		macs[name] = obs.MACs[ol.Index]
	}
	hs := hazards(d.o.Hazards, d.desired, macs)
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
