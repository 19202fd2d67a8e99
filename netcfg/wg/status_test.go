package wg

import (
	"crypto/rand"
	"fmt"
	"maps"
	"reflect"
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

// TestStateCache: the daemon's cached States lists exactly what States
// does through a run of changes (peers coming and going in the kernel,
// names changing, peers reordered or duplicated in the desired state, a
// device gone and back), and reuses its order and names when nothing of
// theirs changed.
func TestStateCache(t *testing.T) {
	key := func() wgtypes.Key {
		var k wgtypes.Key
		rand.Read(k[:])
		return k
	}
	var desired []Peer
	observed := map[wgtypes.Key]ObservedPeer{}
	for i := range 200 {
		k := key()
		desired = append(desired, Peer{PublicKey: k, Name: fmt.Sprintf("peer%03d", i)})
		observed[k] = ObservedPeer{PublicKey: k, RxBytes: int64(i)}
	}
	plan := func() Plan {
		devs := map[string]ObservedDevice{"wg1": {Name: "wg1", Impl: ImplKernel}}
		if observed != nil {
			devs["wg0"] = ObservedDevice{Name: "wg0", Impl: ImplKernel, Peers: maps.Clone(observed)}
		}
		return Plan{
			Desired:  Desired{Devices: []Device{{Name: "wg0", Peers: slices.Clone(desired)}, {Name: "wg1"}}},
			Observed: Observed{Devices: devs},
		}
	}
	var c StateCache
	check := func(step string, reused, namesReused bool) {
		t.Helper()
		var before []wgtypes.Key
		var namesBefore []string
		if l, ok := c.last["wg0"]; ok {
			before, namesBefore = l.order, l.names
		}
		p := plan()
		if got, want := c.States(p), States(p); !reflect.DeepEqual(got, want) {
			for i := range min(len(got), len(want)) {
				for j := range min(len(got[i].Peers), len(want[i].Peers)) {
					if !reflect.DeepEqual(got[i].Peers[j], want[i].Peers[j]) {
						t.Fatalf("%s: %s peer %d: cached %+v, States %+v", step, got[i].Name, j, got[i].Peers[j], want[i].Peers[j])
					}
				}
			}
			t.Fatalf("%s: the cached states differ from States (devices or peer counts)", step)
		}
		after := c.last["wg0"].order
		same := len(before) > 0 && len(after) > 0 && &before[0] == &after[0]
		if same != reused {
			t.Errorf("%s: order reused %v, want %v", step, same, reused)
		}
		names := c.last["wg0"].names
		if same := len(namesBefore) > 0 && len(names) > 0 && &namesBefore[0] == &names[0]; same != namesReused {
			t.Errorf("%s: names reused %v, want %v", step, same, namesReused)
		}
	}
	check("first", false, false)
	check("nothing changed", true, true)
	for k, p := range observed {
		p.RxBytes += 100 // traffic: the same peers
		observed[k] = p
	}
	check("counters moved", true, true)
	desired[3].Name = "renamed"
	check("a name changed", true, false)
	desired[0], desired[1] = desired[1], desired[0]
	check("desired reordered", true, false)
	desired = append(desired, Peer{PublicKey: desired[5].PublicKey, Name: "a later duplicate"})
	check("a duplicate key in desired", true, false)
	gone := desired[7].PublicKey
	delete(observed, gone)
	check("a peer gone from the kernel", false, false)
	observed[key()] = ObservedPeer{}
	check("another one instead", false, false)
	check("then nothing", true, true)
	observed[gone] = ObservedPeer{PublicKey: gone}
	check("it is back", false, false)
	saved := observed
	observed = nil
	check("the device gone", false, false)
	observed = saved
	check("the device back", false, false)
	desired = nil
	check("no desired peers", true, false)
	observed = map[wgtypes.Key]ObservedPeer{}
	check("no peers", false, false)
}
