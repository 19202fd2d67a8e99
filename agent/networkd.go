package agent

import (
	"net"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
)

// networkdHazards lists, for plan and apply --once, what a running
// systemd-networkd would do to d's objects (package hazard): its settings
// that delete foreign routing, where d has routing, and the .network
// files whose [Match] catches one of d's links. A VLAN not made yet is
// matched with its parent's MAC, which it will have.
func networkdHazards(h *host.Host, d netcfg.Desired) []string {
	macs := map[string]net.HardwareAddr{}
	if ls, err := h.Snapshot().Links(); err == nil {
		for _, l := range ls {
			macs[l.Name] = l.HardwareAddr
		}
	}
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
	var out []string
	for _, hz := range hazard.Networkd(hazard.Paths{}, links) {
		if hz.Setting != "" && !usesRouting(d) {
			continue
		}
		out = append(out, hz.String())
	}
	return out
}
