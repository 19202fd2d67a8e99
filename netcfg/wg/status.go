package wg

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/peerlive"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// DeviceState is one desired device as observed, for status: public keys
// only. The agent turns it into the local API's types.
type DeviceState struct {
	Name string
	// Impl is ImplKernel or ImplUserspace, "" when the device does not
	// exist (see Problems).
	Impl       string
	PublicKey  wgtypes.Key
	ListenPort int
	Peers      []PeerState // by public key
	// Problems are the device's ops that cannot be applied (a skipped
	// peer, a conflict), as plan text without the "! ".
	Problems []string
	// Time is when the device was observed.
	Time time.Time
}

// PeerState is one peer of a device as observed.
type PeerState struct {
	PublicKey     wgtypes.Key
	Name          string // from the desired peer of that key, "" if none
	Endpoint      netip.AddrPort
	LastHandshake time.Time // zero: never
	RxBytes       int64
	TxBytes       int64
	AllowedIPs    []netip.Prefix
}

// Live reports whether the peer is live at t (peerlive.Live).
func (p PeerState) Live(t time.Time) bool {
	return peerlive.Live(p.Endpoint.IsValid(), p.LastHandshake, t)
}

// LivePeers counts the device's live peers when it was observed: on a
// remote-access server, the sign that this node is the one the router
// really forwards the VPN port to.
func (d DeviceState) LivePeers() int {
	n := 0
	for _, p := range d.Peers {
		if p.Live(d.Time) {
			n++
		}
	}
	return n
}

type keyedPeer struct {
	key string
	k   wgtypes.Key
}

// States summarises the desired devices of p as observed, with the
// problems p reports for each.
func States(p Plan) []DeviceState {
	out := []DeviceState{}
	for _, d := range p.Desired.Devices {
		ds := DeviceState{Name: d.Name, Time: p.Observed.Time}
		names := map[wgtypes.Key]string{}
		for _, peer := range d.Peers {
			names[peer.PublicKey] = peer.Name
		}
		if od, ok := p.Observed.Devices[d.Name]; ok && od.Impl != "" {
			ds.Impl, ds.PublicKey, ds.ListenPort = od.Impl, od.PublicKey, od.ListenPort
			// Listed by the key as wg(8) prints it, each encoded once (not
			// twice per comparison), and sorted as small pairs.
			byKey := make([]keyedPeer, 0, len(od.Peers))
			for k := range od.Peers {
				byKey = append(byKey, keyedPeer{k.String(), k})
			}
			slices.SortFunc(byKey, func(a, b keyedPeer) int { return strings.Compare(a.key, b.key) })
			if len(byKey) > 0 {
				ds.Peers = make([]PeerState, len(byKey))
				for i, kp := range byKey {
					op := od.Peers[kp.k]
					ds.Peers[i] = PeerState{
						PublicKey: op.PublicKey, Name: names[op.PublicKey], Endpoint: op.Endpoint,
						LastHandshake: op.LastHandshake, RxBytes: op.RxBytes, TxBytes: op.TxBytes,
						AllowedIPs: op.AllowedIPs,
					}
				}
			}
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
