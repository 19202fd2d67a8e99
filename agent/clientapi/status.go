package clientapi

import (
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// WithHeld returns devs (the status's devices, peers sorted by public
// key) with des's held peers in them, as disabled or expired with the
// reason, and the expiry of each peer that has one; des is the desired
// state as it stands now (netcfg's Desired.At). An entry held before and
// desired now loses its state; one neither held nor desired goes. devs is
// not modified.
func WithHeld(devs []api.WireGuardDevice, des wg.Desired) []api.WireGuardDevice {
	out := devs
	cloned := false
	for i := range devs {
		di := slices.IndexFunc(des.Devices, func(d wg.Device) bool { return d.Name == devs[i].Name })
		var dev *wg.Device
		if di >= 0 {
			dev = &des.Devices[di]
		}
		marked := slices.ContainsFunc(devs[i].Peers, func(p api.WireGuardPeer) bool { return p.State != "" || p.Expires != nil })
		if !marked && (dev == nil || (len(dev.Held) == 0 && !slices.ContainsFunc(dev.Peers, func(p wg.Peer) bool { return !p.Expires.IsZero() }))) {
			continue
		}
		if !cloned {
			out = slices.Clone(devs)
			cloned = true
		}
		peers := slices.Clone(devs[i].Peers)
		if marked {
			// Entries held or expiring before: as they are now.
			var active map[string]bool
			peers = slices.DeleteFunc(peers, func(p api.WireGuardPeer) bool {
				if p.State == "" {
					return false
				}
				if active == nil {
					active = map[string]bool{}
					if dev != nil {
						for _, q := range dev.Peers {
							active[q.PublicKey.String()] = true
						}
					}
				}
				return !active[p.PublicKey]
			})
			for j := range peers {
				peers[j].State, peers[j].Reason, peers[j].Expires = "", "", nil
			}
		}
		if dev != nil {
			for _, p := range dev.Peers {
				if p.Expires.IsZero() {
					continue
				}
				if at, ok := find(peers, p.PublicKey.String()); ok {
					e := p.Expires
					peers[at].Expires = &e
				}
			}
			for _, h := range dev.Held {
				k := h.PublicKey.String()
				at, ok := find(peers, k)
				ps := api.WireGuardPeer{PublicKey: k, HandshakeAgeSeconds: -1}
				if ok {
					ps = peers[at]
				}
				ps.Name, ps.State, ps.Reason, ps.Live = h.Name, h.State, h.Reason, false
				ps.AllowedIPs = ps.AllowedIPs[:0:0]
				for _, a := range h.AllowedIPs {
					ps.AllowedIPs = append(ps.AllowedIPs, a.String())
				}
				if !h.Expires.IsZero() {
					e := h.Expires
					ps.Expires = &e
				}
				if ok {
					peers[at] = ps
				} else {
					peers = slices.Insert(peers, at, ps)
				}
			}
		}
		out[i].Peers = peers
	}
	return out
}

func find(peers []api.WireGuardPeer, key string) (int, bool) {
	return slices.BinarySearchFunc(peers, key, func(p api.WireGuardPeer, k string) int { return strings.Compare(p.PublicKey, k) })
}
