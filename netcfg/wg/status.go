package wg

import (
	"cmp"
	"encoding/binary"
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

// orderedKey is a peer's key with its textOrder.
type orderedKey struct {
	o uint64
	k wgtypes.Key
}

// textOrder orders keys as their text (base64, as wg(8) prints them)
// sorts, without encoding them: its bits are the key's first ten base64
// digits, each as its character's place among base64's characters in
// byte order. Keys whose first ten digits agree (one pair in 2^60) are
// ordered by their text.
func textOrder(k *wgtypes.Key) uint64 {
	x := binary.BigEndian.Uint64(k[:8])
	var o uint64
	for i := range 10 {
		o = o<<6 | uint64(b64Rank[x>>(58-6*i)&63])
	}
	return o
}

// b64Rank is each base64 digit's character's place in byte order among
// the alphabet's ('+' < '/' < '0'-'9' < 'A'-'Z' < 'a'-'z').
var b64Rank = func() (r [64]byte) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for v := range 64 {
		for _, c := range []byte(alphabet) {
			if c < alphabet[v] {
				r[v]++
			}
		}
	}
	return r
}()

func compareOrdered(a, b orderedKey) int {
	if c := cmp.Compare(a.o, b.o); c != 0 {
		return c
	}
	return strings.Compare(a.k.String(), b.k.String())
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
			// Listed by the key as wg(8) prints it, without encoding
			// one (textOrder).
			byKey := make([]orderedKey, 0, len(od.Peers))
			for k := range od.Peers {
				byKey = append(byKey, orderedKey{textOrder(&k), k})
			}
			slices.SortFunc(byKey, compareOrdered)
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
