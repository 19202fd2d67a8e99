package agent

import (
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// wireGuardDevices turns the WireGuard subsystem's device states into the
// local API's terms (public keys only).
func wireGuardDevices(states []wg.DeviceState) []api.WireGuardDevice {
	out := []api.WireGuardDevice{}
	for _, s := range states {
		d := api.WireGuardDevice{Name: s.Name, Implementation: s.Impl, ListenPort: s.ListenPort, Peers: make([]api.WireGuardPeer, 0, len(s.Peers)), Problems: s.Problems}
		if s.Impl != "" {
			d.PublicKey = s.PublicKey.String()
		}
		for _, p := range s.Peers {
			ps := api.WireGuardPeer{
				PublicKey: p.PublicKey.String(), Name: p.Name, RxBytes: p.RxBytes, TxBytes: p.TxBytes,
				HandshakeAgeSeconds: -1, AllowedIPs: make([]string, 0, len(p.AllowedIPs)), Live: p.Live(s.Time),
			}
			if p.Endpoint.IsValid() {
				ps.Endpoint = p.Endpoint.String()
			}
			if !p.LastHandshake.IsZero() {
				hs := p.LastHandshake
				ps.LastHandshake = &hs
				ps.HandshakeAgeSeconds = int64(s.Time.Sub(hs) / time.Second)
			}
			for _, a := range p.AllowedIPs {
				ps.AllowedIPs = append(ps.AllowedIPs, a.String())
			}
			if ps.Live {
				d.LivePeers++
			}
			d.Peers = append(d.Peers, ps)
		}
		out = append(out, d)
	}
	return out
}
