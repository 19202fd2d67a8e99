package agent

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/clientapi"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// wgStatus makes the status's WireGuard devices after every sync. It keeps
// what it made last, and a peer listed at the same place with the same key
// takes its key's text, and its endpoint's and allowed IPs' when they are
// the same, from there: with thousands of peers and nothing changing, the
// texts were most of what an idle resync allocated. The zero value is
// ready.
type wgStatus struct {
	states wg.StateCache
	last   map[string]wgListed
}

// wgListed is one device's peers as last listed: the states they were
// made from, and what was made.
type wgListed struct {
	from  []wg.PeerState
	peers []api.WireGuardPeer
}

// devices is the status's WireGuard devices for the post-sync plan p.
func (c *wgStatus) devices(p wg.Plan) []api.WireGuardDevice {
	states := c.states.States(p)
	out := wireGuardDevices(states, c.last)
	c.last = make(map[string]wgListed, len(states))
	for i, s := range states {
		c.last[s.Name] = wgListed{s.Peers, out[i].Peers}
	}
	return out
}

// wireGuardDevices turns the WireGuard subsystem's device states into the
// local API's terms (public keys only), one device per state, taking the
// texts of last (by device name) where they are the same.
func wireGuardDevices(states []wg.DeviceState, last map[string]wgListed) []api.WireGuardDevice {
	out := []api.WireGuardDevice{}
	for _, s := range states {
		d := api.WireGuardDevice{Name: s.Name, Implementation: s.Impl, ListenPort: s.ListenPort, Peers: make([]api.WireGuardPeer, 0, len(s.Peers)), Problems: s.Problems}
		if s.Impl != "" {
			d.PublicKey = s.PublicKey.String()
		}
		prev := last[s.Name]
		for i, p := range s.Peers {
			ps := api.WireGuardPeer{
				Name: p.Name, RxBytes: p.RxBytes, TxBytes: p.TxBytes,
				HandshakeAgeSeconds: -1, Live: p.Live(s.Time),
			}
			var was *wg.PeerState
			if i < len(prev.from) && prev.from[i].PublicKey == p.PublicKey {
				was = &prev.from[i]
			}
			if was != nil {
				ps.PublicKey = prev.peers[i].PublicKey
			} else {
				ps.PublicKey = p.PublicKey.String()
			}
			switch {
			case !p.Endpoint.IsValid():
			case was != nil && was.Endpoint == p.Endpoint:
				ps.Endpoint = prev.peers[i].Endpoint
			default:
				ps.Endpoint = p.Endpoint.String()
			}
			if !p.LastHandshake.IsZero() {
				hs := p.LastHandshake
				ps.LastHandshake = &hs
				ps.HandshakeAgeSeconds = int64(s.Time.Sub(hs) / time.Second)
			}
			if was != nil && slices.Equal(was.AllowedIPs, p.AllowedIPs) {
				ps.AllowedIPs = prev.peers[i].AllowedIPs
			} else {
				ps.AllowedIPs = prefixTexts(p.AllowedIPs)
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

func prefixTexts(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, a := range ps {
		out = append(out, a.String())
	}
	return out
}

// peersFresh is how old the peers' figures may be when the API asks for
// them: a client polling `nodeagentctl peers` or a scrape every second
// costs one read of the devices a second at most.
const peersFresh = time.Second

// peersRequest asks for the WireGuard devices with their figures (bytes,
// handshakes) read now, which a sync reads only every resync. It updates
// the status and the metrics with what it read; nothing is written to the
// kernel.
type peersRequest struct{ reply chan<- []api.WireGuardDevice }

func (r peersRequest) serve(ctx context.Context, d *Daemon) {
	if time.Since(d.peersAt) < peersFresh || len(d.desired.WG.Devices) == 0 {
		r.reply <- d.Status().WireGuard
		return
	}
	p, err := d.cv.PlanWG(ctx, d.converging())
	if err != nil {
		r.reply <- d.Status().WireGuard
		return
	}
	d.peersAt = time.Now()
	devs := clientapi.WithHeld(d.wgStatus.devices(p), d.desired.At(time.Now()).WG)
	d.mu.Lock()
	d.status.WireGuard = devs
	d.mu.Unlock()
	d.metrics.SetWireGuard(devs)
	r.reply <- devs
}
