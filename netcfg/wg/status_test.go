package wg

import (
	"crypto/rand"
	"slices"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestStatesOrder: States lists a device's peers in the order of their
// keys' text, as before it sorted by the text itself (the agent's status
// is searched by it): random keys, keys beginning with every base64
// digit, and keys whose first ten digits agree.
func TestStatesOrder(t *testing.T) {
	peers := map[wgtypes.Key]ObservedPeer{}
	add := func(k wgtypes.Key) { peers[k] = ObservedPeer{PublicKey: k} }
	for range 3000 {
		var k wgtypes.Key
		rand.Read(k[:])
		add(k)
	}
	for v := range 64 {
		var k wgtypes.Key
		rand.Read(k[:])
		k[0] = byte(v << 2) // first digit v
		add(k)
	}
	var base wgtypes.Key
	rand.Read(base[:])
	for i := range 40 {
		k := base
		k[7] = k[7]&0xf0 | byte(i%16) // digits after the tenth differ
		k[8+i%24] ^= byte(i)
		add(k)
	}
	p := Plan{
		Desired:  Desired{Devices: []Device{{Name: "wg0"}}},
		Observed: Observed{Devices: map[string]ObservedDevice{"wg0": {Name: "wg0", Impl: ImplKernel, Peers: peers}}},
	}
	st := States(p)
	if len(st) != 1 || len(st[0].Peers) != len(peers) {
		t.Fatalf("states: %d devices, want 1 with %d peers", len(st), len(peers))
	}
	got := make([]string, len(st[0].Peers))
	for i, ps := range st[0].Peers {
		got[i] = ps.PublicKey.String()
	}
	if !slices.IsSorted(got) {
		for i := 1; i < len(got); i++ {
			if got[i-1] > got[i] {
				t.Fatalf("peer %d (%s) is listed before %s", i-1, got[i-1], got[i])
			}
		}
	}
}
