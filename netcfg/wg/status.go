package wg

import (
	"github.com/nodeagent/nodeagent/agent/api"
	"slices"
	"strings"
	"time"
)

// Status summarises the desired devices as observed, with the problems p
// reports for each, in the local API's terms (public keys only). LivePeers
// counts peers with an endpoint and a handshake younger than
// StaleHandshake: on a remote-access server, the sign that this node is the
// one the router really forwards the VPN port to.
func Status(p Plan) []api.WireGuardDevice {
	out := []api.WireGuardDevice{}
	for _, d := range p.Desired.Devices {
		ds := api.WireGuardDevice{Name: d.Name, Peers: []api.WireGuardPeer{}}
		names := map[string]string{}
		for _, peer := range d.Peers {
			names[peer.PublicKey.String()] = peer.Name
		}
		if od, ok := p.Observed.Devices[d.Name]; ok && od.Impl != "" {
			ds.Implementation = od.Impl
			ds.PublicKey = od.PublicKey.String()
			ds.ListenPort = od.ListenPort
			for _, op := range od.Peers {
				ps := api.WireGuardPeer{
					PublicKey: op.PublicKey.String(), Name: names[op.PublicKey.String()],
					RxBytes: op.RxBytes, TxBytes: op.TxBytes, HandshakeAgeSeconds: -1, AllowedIPs: []string{},
				}
				if op.Endpoint.IsValid() {
					ps.Endpoint = op.Endpoint.String()
				}
				if !op.LastHandshake.IsZero() {
					hs := op.LastHandshake
					ps.LastHandshake = &hs
					age := p.Observed.Time.Sub(hs)
					ps.HandshakeAgeSeconds = int64(age / time.Second)
					ps.Live = op.Endpoint.IsValid() && age < StaleHandshake
				}
				for _, a := range op.AllowedIPs {
					ps.AllowedIPs = append(ps.AllowedIPs, a.String())
				}
				if ps.Live {
					ds.LivePeers++
				}
				ds.Peers = append(ds.Peers, ps)
			}
			slices.SortFunc(ds.Peers, func(a, b api.WireGuardPeer) int { return strings.Compare(a.PublicKey, b.PublicKey) })
		}
		for _, o := range p.Ops {
			if o.Kind == OpFail && o.Device == d.Name {
				ds.Problems = append(ds.Problems, strings.TrimPrefix(o.String(), "! "))
			}
		}
		out = append(out, ds)
	}
	return out
}
