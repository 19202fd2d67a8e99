package netcfg

import (
	"slices"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/clients"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// A peer with an expires (netcfg/clients) leaves its device when the time
// comes, whatever else happens: the desired state is read once and kept
// across resyncs (a quiet one reads only the config), so the expiry is
// applied to it at each plan, not only when it is read. A read after the
// expiry holds the peer from the start (desired.go).

// At is d as it stands at now: each WireGuard peer whose expiry has
// passed is held (listed in its device's Held as expired) instead of
// desired. d is not modified; devices without such a peer are shared.
func (d Desired) At(now time.Time) Desired {
	var devs []wg.Device
	for i := range d.WG.Devices {
		dev := &d.WG.Devices[i]
		if !slices.ContainsFunc(dev.Peers, func(p wg.Peer) bool { return expired(p, now) }) {
			continue
		}
		if devs == nil {
			devs = slices.Clone(d.WG.Devices)
		}
		nd := &devs[i]
		nd.Peers = nil
		nd.Held = slices.Clone(dev.Held)
		for _, p := range dev.Peers {
			if expired(p, now) {
				nd.Held = append(nd.Held, heldPeer(p, clients.Life{State: clients.StateExpired,
					Reason: "expired at " + p.Expires.UTC().Format(time.RFC3339), Expires: p.Expires}))
				continue
			}
			nd.Peers = append(nd.Peers, p)
		}
		// What the start-up read staged holds the expired peer: the
		// creation writes the peers afresh.
		nd.Stage = nil
	}
	if devs == nil {
		return d
	}
	d.WG.Devices = devs
	return d
}

func expired(p wg.Peer, now time.Time) bool {
	return !p.Expires.IsZero() && !now.Before(p.Expires)
}

// NextExpiry is the earliest expiry of a desired peer after now, or zero:
// when a sync must run to take that peer out.
func NextExpiry(d Desired, now time.Time) time.Time {
	var next time.Time
	for i := range d.WG.Devices {
		for j := range d.WG.Devices[i].Peers {
			e := d.WG.Devices[i].Peers[j].Expires
			if !e.IsZero() && e.After(now) && (next.IsZero() || e.Before(next)) {
				next = e
			}
		}
	}
	return next
}

// heldPeer is p as a held peer.
func heldPeer(p wg.Peer, l clients.Life) wg.HeldPeer {
	return wg.HeldPeer{PublicKey: p.PublicKey, Name: p.Name, Source: p.Source, State: l.State, Reason: l.Reason,
		Expires: l.Expires, AllowedIPs: p.AllowedIPs}
}
