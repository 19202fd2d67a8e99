package wg

import (
	"slices"
	"strings"
	"time"
)

// DeviceStatus is what status, metrics and node annotations report of one
// device. It holds public keys only.
type DeviceStatus struct {
	Name string `json:"name"`
	// Implementation is kernel or userspace; "" when the device does not
	// exist (see Problems).
	Implementation string       `json:"implementation"`
	PublicKey      string       `json:"publicKey,omitempty"`
	ListenPort     int          `json:"listenPort,omitempty"`
	Peers          []PeerStatus `json:"peers"`
	// LivePeers counts peers with an endpoint and a handshake younger than
	// StaleHandshake: on a remote-access server, the sign that this node is
	// the one the router really forwards the VPN port to.
	LivePeers int `json:"livePeers"`
	// Problems are the device's reported failures: skipped register files,
	// unresolvable endpoints, a broken key file, a conflict.
	Problems []string `json:"problems,omitempty"`
}

// PeerStatus is one peer as status reports it.
type PeerStatus struct {
	PublicKey     string     `json:"publicKey"`
	Name          string     `json:"name,omitempty"`
	Endpoint      string     `json:"endpoint,omitempty"`
	LastHandshake *time.Time `json:"lastHandshake,omitempty"`
	// HandshakeAgeSeconds is -1 for a peer that never completed one.
	HandshakeAgeSeconds int64    `json:"handshakeAgeSeconds"`
	RxBytes             int64    `json:"rxBytes"`
	TxBytes             int64    `json:"txBytes"`
	AllowedIPs          []string `json:"allowedIPs"`
	Live                bool     `json:"live"`
}

// Status summarises the desired devices as observed, with the problems p
// reports for each.
func Status(p Plan) []DeviceStatus {
	var out []DeviceStatus
	for _, d := range p.Desired.Devices {
		ds := DeviceStatus{Name: d.Name, Peers: []PeerStatus{}}
		names := map[string]string{}
		for _, peer := range d.Peers {
			names[peer.PublicKey.String()] = peer.Name
		}
		if od, ok := p.Observed.Devices[d.Name]; ok && od.Impl != "" {
			ds.Implementation = od.Impl
			ds.PublicKey = od.PublicKey.String()
			ds.ListenPort = od.ListenPort
			for _, op := range od.Peers {
				ps := PeerStatus{
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
			slices.SortFunc(ds.Peers, func(a, b PeerStatus) int { return strings.Compare(a.PublicKey, b.PublicKey) })
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
