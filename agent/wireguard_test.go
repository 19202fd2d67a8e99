package agent

import (
	"crypto/rand"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestWGStatusReuse: the status's WireGuard devices made with what the
// last sync made are exactly those made afresh, through traffic, a new
// handshake, an endpoint roaming, allowed IPs changing and peers coming
// and going; and the texts of a peer that did not change are the last
// sync's own.
func TestWGStatusReuse(t *testing.T) {
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	desired, observed := statusPeers(50, now)
	plan := func() wg.Plan {
		peers := map[wgtypes.Key]wg.ObservedPeer{}
		for k, p := range observed {
			p.AllowedIPs = append([]netip.Prefix(nil), p.AllowedIPs...) // a new read's own
			peers[k] = p
		}
		return statusPlan(desired, peers, now)
	}
	var c wgStatus
	// check makes the devices both ways, and counts the peers whose
	// allowed IPs' texts are the last sync's own (-1: not counted).
	check := func(step string, sharedWant int) {
		t.Helper()
		p := plan()
		last := c.last["wg0"]
		got, want := c.devices(p), wireGuardDevices(wg.States(p), nil)
		if !reflect.DeepEqual(got, want) {
			for i := range min(len(got[0].Peers), len(want[0].Peers)) {
				if !reflect.DeepEqual(got[0].Peers[i], want[0].Peers[i]) {
					t.Fatalf("%s: peer %d: %+v, made afresh %+v", step, i, got[0].Peers[i], want[0].Peers[i])
				}
			}
			t.Fatalf("%s: the devices differ from those made afresh", step)
		}
		// Texts taken from the last sync share its memory.
		shared := 0
		for i, ps := range got[0].Peers {
			if i < len(last.peers) && len(ps.AllowedIPs) > 0 && len(last.peers[i].AllowedIPs) > 0 && &ps.AllowedIPs[0] == &last.peers[i].AllowedIPs[0] {
				shared++
			}
		}
		if sharedWant >= 0 && shared != sharedWant {
			t.Errorf("%s: %d peers' allowed IPs taken from the last sync, want %d", step, shared, sharedWant)
		}
	}
	check("first", 0)
	check("nothing changed", 50)
	now = now.Add(10 * time.Second)
	for k, p := range observed {
		p.RxBytes += 1000
		if p.Endpoint.IsValid() {
			p.LastHandshake = now
			p.Endpoint = netip.AddrPortFrom(p.Endpoint.Addr(), 40000) // roamed
		}
		observed[k] = p
	}
	check("traffic, handshakes and roaming", 50)
	k := desired[4].PublicKey
	p := observed[k]
	p.AllowedIPs = append(p.AllowedIPs, netip.MustParsePrefix("10.99.0.0/24"))
	observed[k] = p
	check("one peer's allowed IPs", 49)
	check("then nothing", 50)
	delete(observed, desired[0].PublicKey)
	var nk wgtypes.Key
	rand.Read(nk[:])
	observed[nk] = wg.ObservedPeer{PublicKey: nk}
	check("a peer gone and another come", -1) // peers move up or down a place
	desired[7].Name = "renamed"
	check("a peer renamed", 49) // the new one has no allowed IPs
	check("then nothing again", 49)
}

// BenchmarkWGStatus5000 is the status's WireGuard devices after a resync
// that changed nothing, 5000 peers: made afresh (as every sync did) and
// with what the last sync made (as the daemon makes them). Run with
// -benchmem.
func BenchmarkWGStatus5000(b *testing.B) {
	now := time.Now()
	desired, peers := statusPeers(5000, now)
	p := statusPlan(desired, peers, now)
	b.Run("afresh", func(b *testing.B) {
		for b.Loop() {
			wireGuardDevices(wg.States(p), nil)
		}
	})
	b.Run("kept", func(b *testing.B) {
		var c wgStatus
		c.devices(p)
		for b.Loop() {
			c.devices(p)
		}
	})
}

// statusPeers is n desired peers and the kernel's view of them: one /32
// each, and every third with an endpoint and a handshake before now.
func statusPeers(n int, now time.Time) ([]wg.Peer, map[wgtypes.Key]wg.ObservedPeer) {
	var desired []wg.Peer
	observed := map[wgtypes.Key]wg.ObservedPeer{}
	for i := range n {
		var k wgtypes.Key
		rand.Read(k[:])
		desired = append(desired, wg.Peer{PublicKey: k, Name: fmt.Sprintf("p%05d", i)})
		op := wg.ObservedPeer{PublicKey: k, AllowedIPs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.%d/32", 64+i/65536, i/256%256, i%256))}}
		if i%3 == 0 {
			op.Endpoint = netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 51820)
			op.LastHandshake = now.Add(-time.Duration(i%120) * time.Second)
		}
		observed[k] = op
	}
	return desired, observed
}

// statusPlan is a post-sync plan of one device, wg0, with these peers.
func statusPlan(desired []wg.Peer, observed map[wgtypes.Key]wg.ObservedPeer, now time.Time) wg.Plan {
	return wg.Plan{
		Desired:  wg.Desired{Devices: []wg.Device{{Name: "wg0", Peers: desired}}},
		Observed: wg.Observed{Time: now, Devices: map[string]wg.ObservedDevice{"wg0": {Name: "wg0", Impl: wg.ImplKernel, Peers: observed}}},
	}
}
