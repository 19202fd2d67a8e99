package wg

import (
	"net"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestKernelWriterRoundTrip writes 5000 peers, one of them with 300
// allowed IPs (split across messages), an endpoint, a keepalive and a
// preshared key, to a kernel device with the packed writer, and reads the
// device back with wgctrl: every field as written, in at most
// ceil(bytes / page) + 1 messages (the writer's are 32 KiB: far fewer). Then it removes one peer and replaces
// another's allowed IPs, and the other peers are untouched.
func TestKernelWriterRoundTrip(t *testing.T) {
	ns, h := kernelDeviceLab(t, "wgrt0")
	key, _ := wgtypes.GeneratePrivateKey()
	psk, _ := wgtypes.GenerateKey()
	port := 51820
	peers := randomPeers(5000, 1)
	peers[17].AllowedIPs = nil
	for j := 0; j < 300; j++ {
		peers[17].AllowedIPs = append(peers[17].AllowedIPs, net.IPNet{IP: net.IPv4(10, 250, byte(j/256), byte(j)).To4(), Mask: net.CIDRMask(32, 32)})
	}
	ka := 25 * time.Second
	peers[42].Endpoint = &net.UDPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 51999}
	peers[42].PersistentKeepaliveInterval = &ka
	peers[42].PresharedKey = &psk
	cfg := wgtypes.Config{PrivateKey: &key, ListenPort: &port, Peers: peers}
	msgs, _ := messages("wgrt0", cfg, msgLimit)
	bytes := 0
	for _, m := range msgs {
		bytes += nlmsgHdrLen + genlHdrLen + len(m)
	}
	start := time.Now()
	if err := h.configure("wgrt0", ImplKernel, cfg); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	page := pageLimit()
	bound := int64((bytes+page-1)/page + 1)
	t.Logf("5000 peers (one with 300 allowed IPs): %d messages for %d bytes (bound %d), %s", h.MessageWrites(), bytes, bound, took.Round(time.Millisecond))
	if n := h.MessageWrites(); n > bound {
		t.Errorf("%d messages; want at most %d", n, bound)
	}

	read := func() map[wgtypes.Key]wgtypes.Peer {
		t.Helper()
		var dev *wgtypes.Device
		err := ns.Host.Do(func() error {
			c, err := wgctrl.New()
			if err != nil {
				return err
			}
			defer c.Close()
			dev, err = c.Device("wgrt0")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if dev.PrivateKey != key || dev.ListenPort != port {
			t.Errorf("device key or port not as written")
		}
		out := map[wgtypes.Key]wgtypes.Peer{}
		for _, p := range dev.Peers {
			out[p.PublicKey] = p
		}
		return out
	}
	same := func(want wgtypes.PeerConfig, got wgtypes.Peer) bool {
		var a, b []string
		for _, n := range want.AllowedIPs {
			a = append(a, n.String())
		}
		for _, n := range got.AllowedIPs {
			b = append(b, n.String())
		}
		slices.Sort(a)
		slices.Sort(b)
		return slices.Equal(a, b)
	}
	got := read()
	if len(got) != len(peers) {
		t.Fatalf("the device has %d peers, want %d", len(got), len(peers))
	}
	for i, p := range peers {
		g, ok := got[p.PublicKey]
		if !ok || !same(p, g) {
			t.Fatalf("peer %d: %d allowed IPs on the device, want %d", i, len(g.AllowedIPs), len(p.AllowedIPs))
		}
	}
	if g := got[peers[42].PublicKey]; g.Endpoint.String() != "192.0.2.7:51999" || g.PersistentKeepaliveInterval != ka || g.PresharedKey != psk {
		t.Errorf("peer 42: endpoint %v keepalive %v psk set %v", g.Endpoint, g.PersistentKeepaliveInterval, g.PresharedKey == psk)
	}

	// One peer removed, one's allowed IPs replaced; nothing else written.
	changed := peers[99]
	changed.AllowedIPs = []net.IPNet{{IP: net.IPv4(10, 251, 0, 1).To4(), Mask: net.CIDRMask(32, 32)}}
	changed.ReplaceAllowedIPs, changed.UpdateOnly = true, true
	if err := h.configure("wgrt0", ImplKernel, wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: peers[5].PublicKey, Remove: true}, changed}}); err != nil {
		t.Fatal(err)
	}
	got = read()
	if _, ok := got[peers[5].PublicKey]; ok || len(got) != len(peers)-1 {
		t.Errorf("after removing one: %d peers, removed one still there %v", len(got), ok)
	}
	if !same(changed, got[changed.PublicKey]) || !same(peers[17], got[peers[17].PublicKey]) {
		t.Error("the replaced allowed IPs, or an untouched peer's, are not as written")
	}
}
