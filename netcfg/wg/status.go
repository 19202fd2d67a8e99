package wg

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
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
func States(p Plan) []DeviceState { return (*StateCache)(nil).States(p) }

// StateCache is States for a caller that asks after every sync (the
// daemon's status): it keeps, per device, the order of the peers it
// listed and their names, and uses them again when the device has the
// same peers by key and the desired state the same names for them. With
// thousands of peers, sorting the keys and indexing the desired peers by
// key was most of an idle resync's status. The zero value is ready; a nil
// cache keeps nothing.
type StateCache struct {
	last map[string]listed
}

// listed is how a device's peers were last listed.
type listed struct {
	order []wgtypes.Key // the observed keys, in textOrder
	names []string      // order's names, from desired
	// desired is a hash of the desired peers' keys and names, in order,
	// that the names came from.
	desired uint64
}

// namesSeed keys the hashes of desired peers' names.
var namesSeed = maphash.MakeSeed()

// namesHash hashes the desired peers' keys and names, in order.
func namesHash(desired []Peer) uint64 {
	var h maphash.Hash
	h.SetSeed(namesSeed)
	var n [8]byte
	for i := range desired {
		p := &desired[i]
		h.Write(p.PublicKey[:])
		binary.LittleEndian.PutUint64(n[:], uint64(len(p.Name)))
		h.Write(n[:])
		h.WriteString(p.Name)
	}
	return h.Sum64()
}

// States is the package's States, using and refreshing what c kept.
func (c *StateCache) States(p Plan) []DeviceState {
	out := []DeviceState{}
	var next map[string]listed
	if c != nil {
		next = make(map[string]listed, len(p.Desired.Devices))
	}
	for _, d := range p.Desired.Devices {
		ds := DeviceState{Name: d.Name, Time: p.Observed.Time}
		if od, ok := p.Observed.Devices[d.Name]; ok && od.Impl != "" {
			ds.Impl, ds.PublicKey, ds.ListenPort = od.Impl, od.PublicKey, od.ListenPort
			var prev listed
			if c != nil {
				prev = c.last[d.Name]
			}
			l := listPeers(prev, d.Peers, od.Peers)
			if len(l.order) > 0 {
				ds.Peers = make([]PeerState, len(l.order))
				for i, k := range l.order {
					op := od.Peers[k]
					ds.Peers[i] = PeerState{
						PublicKey: op.PublicKey, Name: l.names[i], Endpoint: op.Endpoint,
						LastHandshake: op.LastHandshake, RxBytes: op.RxBytes, TxBytes: op.TxBytes,
						AllowedIPs: op.AllowedIPs,
					}
				}
			}
			if next != nil {
				next[d.Name] = l
			}
		}
		for _, o := range p.Ops {
			if o.Kind == OpFail && o.Device == d.Name {
				ds.Problems = append(ds.Problems, strings.TrimPrefix(o.String(), "! "))
			}
		}
		out = append(out, ds)
	}
	if c != nil {
		c.last = next
	}
	return out
}

// listPeers orders observed's keys as their text sorts (textOrder) and
// names each from desired: prev's order when observed has exactly its
// keys, and prev's names too when desired is also the same keys and
// names in the same order (by a 64-bit hash: a collision would show
// names out of date, and change nothing else).
func listPeers(prev listed, desired []Peer, observed map[wgtypes.Key]ObservedPeer) listed {
	l := listed{order: prev.order}
	if len(l.order) != len(observed) || len(l.order) == 0 {
		l.order = nil
	}
	for _, k := range l.order {
		if _, ok := observed[k]; !ok {
			l.order = nil
			break
		}
	}
	sameOrder := l.order != nil
	if !sameOrder && len(observed) > 0 {
		// Listed by the key as wg(8) prints it, without encoding one
		// (textOrder).
		byKey := make([]orderedKey, 0, len(observed))
		for k := range observed {
			byKey = append(byKey, orderedKey{textOrder(&k), k})
		}
		slices.SortFunc(byKey, compareOrdered)
		l.order = make([]wgtypes.Key, len(byKey))
		for i, kp := range byKey {
			l.order[i] = kp.k
		}
	}
	l.desired = namesHash(desired)
	if sameOrder && l.desired == prev.desired && len(prev.names) == len(l.order) {
		l.names = prev.names
		return l
	}
	names := make(map[wgtypes.Key]string, len(desired))
	for _, p := range desired {
		names[p.PublicKey] = p.Name
	}
	l.names = make([]string, len(l.order))
	for i, k := range l.order {
		l.names[i] = names[k]
	}
	return l
}
