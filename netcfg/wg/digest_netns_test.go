package wg

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// wgExec runs wg(8) inside ns: another process, as an operator's would be.
func wgExec(t *testing.T, ns *testenv.NetNS, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns", "exec", ns.Name, "wg"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("wg %v: %v\n%s", args, err, out)
	}
}

// kernelDeviceLab makes kernel WireGuard device name, up, in a fresh
// namespace, and a handle there.
func kernelDeviceLab(t *testing.T, name string) (*testenv.NetNS, *Handle) {
	t.Helper()
	testenv.RequireModule(t, "wireguard")
	ns := testenv.NewNetNS(t)
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := ns.NL.LinkAdd(&netlink.Wireguard{LinkAttrs: la}); err != nil {
		t.Fatal(err)
	}
	l, err := ns.NL.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.NL.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	h := &Handle{Host: ns.Host}
	t.Cleanup(h.Close)
	return ns, h
}

// TestKernelDigest: a kernel device's digest stays put while only its
// counters and handshake times move, and whatever dump sizes the kernel
// picks (the first dump on a socket comes in smaller messages than the
// next, and a peer with 300 allowed IPs is split across them); it moves
// with every field `wg set` can change, and an undone change gives the
// old digest back. Reading it allocates nothing.
func TestKernelDigest(t *testing.T) {
	ns, h := kernelDeviceLab(t, "wgdg0")
	key, _ := wgtypes.GeneratePrivateKey()
	port := 51820
	peers := randomPeers(5000, 1)
	peers[17].AllowedIPs = nil
	for j := 0; j < 300; j++ {
		peers[17].AllowedIPs = append(peers[17].AllowedIPs, net.IPNet{IP: net.IPv4(10, 250, byte(j/256), byte(j)).To4(), Mask: net.CIDRMask(32, 32)})
	}
	// Peer 42 sends handshake initiations to a port nobody answers, so
	// its counters move while its configuration does not.
	ka := time.Second
	peers[42].Endpoint = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	peers[42].PersistentKeepaliveInterval = &ka
	if err := h.configure("wgdg0", ImplKernel, wgtypes.Config{PrivateKey: &key, ListenPort: &port, Peers: peers}); err != nil {
		t.Fatal(err)
	}
	digest := func() Digest {
		t.Helper()
		d, err := h.Digest("wgdg0", ImplKernel)
		if err != nil || !d.Exists {
			t.Fatalf("digest: %v (exists %v)", err, d.Exists)
		}
		return d
	}
	tx := func() int64 {
		dev, err := h.device("wgdg0")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range dev.Peers {
			if p.PublicKey == peers[42].PublicKey {
				return p.TransmitBytes
			}
		}
		t.Fatal("peer 42 is gone")
		return 0
	}
	first := digest() // the socket's first dump: page-sized messages
	if again := digest(); again != first {
		t.Fatal("two dumps of an unchanged device give different digests")
	}
	sent := tx()
	usEventually(t, "peer 42's handshake initiations to move its counters", func() bool { return tx() > sent })
	if d := digest(); d != first {
		t.Fatal("the digest moved with the counters alone")
	}
	t.Logf("peer 42's tx counter moved %d -> %d bytes; digest unchanged", sent, tx())

	if d, err := h.Digest("wgnone0", ImplKernel); err != nil || d.Exists {
		t.Errorf("a missing device: %+v, %v; want not existing, no error", d, err)
	}
	if a := testing.AllocsPerRun(20, func() { h.Digest("wgdg0", ImplKernel) }); a != 0 {
		t.Errorf("a digest of 5000 peers allocates %.0f times; want 0", a)
	}

	peer := peers[99].PublicKey.String()
	psk, _ := wgtypes.GenerateKey()
	other, _ := wgtypes.GeneratePrivateKey()
	changes := []struct {
		what       string
		do, undo   []string
		undoneSame bool
	}{
		{"allowed IPs", []string{"peer", peer, "allowed-ips", "10.251.0.1/32"}, []string{"peer", peer, "allowed-ips", peers[99].AllowedIPs[0].String()}, true},
		{"endpoint", []string{"peer", peer, "endpoint", "192.0.2.9:51820"}, nil, false},
		{"keepalive", []string{"peer", peer, "persistent-keepalive", "25"}, []string{"peer", peer, "persistent-keepalive", "0"}, false},
		{"listen port", []string{"listen-port", "51821"}, []string{"listen-port", "51820"}, true},
		{"fwmark", []string{"fwmark", "0x99"}, []string{"fwmark", "0"}, true},
		{"a peer removed", []string{"peer", peers[5].PublicKey.String(), "remove"}, []string{"peer", peers[5].PublicKey.String(), "allowed-ips", peers[5].AllowedIPs[0].String()}, true},
		{"a peer added", []string{"peer", other.PublicKey().String(), "allowed-ips", "10.252.0.1/32"}, []string{"peer", other.PublicKey().String(), "remove"}, true},
	}
	before := digest()
	for _, c := range changes {
		wgExec(t, ns, append([]string{"set", "wgdg0"}, c.do...)...)
		after := digest()
		if after == before {
			t.Errorf("%s: the digest did not move", c.what)
		}
		if c.undo != nil {
			wgExec(t, ns, append([]string{"set", "wgdg0"}, c.undo...)...)
			// A keepalive of 0 is not the unset keepalive the device
			// had, to wg(8) it is; the kernel reports both as 0.
			if back := digest(); c.undoneSame && back != before {
				t.Errorf("%s undone: the digest did not come back", c.what)
			}
		}
		before = digest()
	}
	// The preshared key and the private key, which the dump carries.
	pskFile := t.TempDir() + "/psk"
	if err := os.WriteFile(pskFile, []byte(psk.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wgExec(t, ns, "set", "wgdg0", "peer", peer, "preshared-key", pskFile)
	if d := digest(); d == before {
		t.Error("preshared key: the digest did not move")
	}
	before = digest()
	keyFile := t.TempDir() + "/key"
	if err := os.WriteFile(keyFile, []byte(other.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wgExec(t, ns, "set", "wgdg0", "private-key", keyFile)
	if d := digest(); d == before {
		t.Error("private key: the digest did not move")
	}
}

// TestUserspaceDigest: a userspace device's digest counts the UAPI
// connections of other processes, so nodeagent's own reads leave it and a
// `wg set` (or even a `wg show`) moves it; a device started again under
// the same name never has its predecessor's digest. Reading it allocates
// nothing.
func TestUserspaceDigest(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetNS(t)
	u, _ := usNew(t)
	name := fmt.Sprintf("wgu%06d", time.Now().UnixNano()%1000000)
	if err := u.Start(ns.Host, name, 0); err != nil {
		t.Fatal(err)
	}
	h := &Handle{Host: ns.Host, Userspace: u}
	t.Cleanup(h.Close)
	k := usKeys(t)
	p := usKeys(t).PublicKey()
	usConfigure(t, ns.Host, name, wgtypes.Config{PrivateKey: &k, Peers: []wgtypes.PeerConfig{{PublicKey: p, AllowedIPs: []net.IPNet{{IP: net.IPv4(10, 1, 0, 2).To4(), Mask: net.CIDRMask(32, 32)}}}}})
	d0, err := h.Digest(name, ImplUserspace)
	if err != nil || !d0.Exists {
		t.Fatalf("digest: %+v %v", d0, err)
	}
	if _, err := h.device(name); err != nil {
		t.Fatal(err)
	}
	if d, _ := h.Digest(name, ImplUserspace); d != d0 {
		t.Error("nodeagent's own read moved the digest")
	}
	wgExec(t, ns, "set", name, "peer", p.String(), "allowed-ips", "10.1.0.3/32")
	d1, _ := h.Digest(name, ImplUserspace)
	if d1 == d0 {
		t.Error("wg set did not move the digest")
	}
	if a := testing.AllocsPerRun(100, func() { h.Digest(name, ImplUserspace) }); a != 0 {
		t.Errorf("a userspace digest allocates %.0f times; want 0", a)
	}
	u.Stop(name)
	if d, _ := h.Digest(name, ImplUserspace); d.Exists {
		t.Error("a stopped device still has a digest")
	}
	if err := u.Start(ns.Host, name, 0); err != nil {
		t.Fatal(err)
	}
	if d, _ := h.Digest(name, ImplUserspace); d == d0 || d == d1 {
		t.Error("a device started again has its predecessor's digest")
	}
}

// TestPollReadsOnlyMovedDevices: with two converged devices the first
// poll reads both (no digest yet) and finds nothing to do; the next reads
// neither and allocates nothing; a `wg set` on one makes the poll read
// that one alone and plan its repair, and only it; a device named in
// always is read on every poll.
func TestPollReadsOnlyMovedDevices(t *testing.T) {
	for _, impl := range []string{ImplUserspace, ImplKernel} {
		t.Run(impl, func(t *testing.T) {
			testenv.RequireRoot(t)
			if impl == ImplKernel {
				testenv.RequireModule(t, "wireguard")
			}
			ns := testenv.NewNetNS(t)
			u, _ := usNew(t)
			h := &Handle{Host: ns.Host, Userspace: u}
			t.Cleanup(h.Close)
			var d Desired
			suffix := fmt.Sprintf("%05d", time.Now().UnixNano()%100000)
			for i, n := range []int{3, 1000} {
				dev := Device{Name: fmt.Sprintf("wgp%d%s", i, suffix), Impl: impl, PrivateKey: testKey(byte(i + 1)), ListenPort: 51820 + i}
				for j := 0; j < n; j++ {
					var pk wgtypes.Key
					rand.Read(pk[:])
					dev.Peers = append(dev.Peers, Peer{PublicKey: pk, AllowedIPs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), byte(j >> 8), byte(j)}), 32)}})
				}
				d.Devices = append(d.Devices, dev)
			}
			ctx := context.Background()
			o, err := Observe(ctx, h, h.Host.Snapshot(), d)
			if err != nil {
				t.Fatal(err)
			}
			if _, rep := Apply(ctx, h, h.Host.Snapshot(), MakePlan(d, o)); rep.Err() != nil {
				t.Fatal(rep.Err())
			}
			var p Poller
			dumps := func() int64 { return h.Host.Dumps()[host.DumpWireGuard] }
			n := dumps()
			pl, looked, err := p.Poll(ctx, h, d, nil)
			if err != nil || !looked || pl.Writes() {
				t.Fatalf("first poll: looked %v, err %v, plan:\n%s", looked, err, pl)
			}
			if got := dumps() - n; got != 2 {
				t.Errorf("first poll read %d devices; want 2", got)
			}
			n = dumps()
			if _, looked, _ := p.Poll(ctx, h, d, nil); looked || dumps() != n {
				t.Errorf("a poll with nothing changed read a device (looked %v)", looked)
			}
			if a := testing.AllocsPerRun(20, func() { p.Poll(ctx, h, d, nil) }); a != 0 {
				t.Errorf("a poll with nothing changed allocates %.0f times; want 0", a)
			}
			moved := d.Devices[1].Name
			wgExec(t, ns, "set", moved, "peer", d.Devices[1].Peers[7].PublicKey.String(), "remove")
			n = dumps()
			pl, looked, err = p.Poll(ctx, h, d, nil)
			if err != nil || !looked || dumps()-n != 1 {
				t.Fatalf("after wg set: looked %v, %d devices read, err %v", looked, dumps()-n, err)
			}
			if len(pl.Ops) != 1 || pl.Ops[0].Kind != OpAddPeer || pl.Ops[0].Device != moved {
				t.Errorf("after wg set the poll planned:\n%s\nwant the removed peer of %s added back, nothing else", pl, moved)
			}
			// Not repaired: the digest is not taken, so the poll keeps
			// reading the device and planning the repair.
			if _, looked, _ := p.Poll(ctx, h, d, nil); !looked {
				t.Error("a device found drifted was not read again")
			}
			n = dumps()
			always := map[string]bool{d.Devices[0].Name: true}
			p.Poll(ctx, h, d, always)
			p.Poll(ctx, h, d, always)
			if got := dumps() - n; got != 4 {
				t.Errorf("two polls read %d devices; want 4 (the drifted one and the always one, each time)", got)
			}
		})
	}
}

// TestKernelReaderMatchesWgctrl: the raw dump reader Observe uses for
// kernel devices reads what wgctrl reads, field for field: 5000 peers, one
// with 300 allowed IPs (split across dump messages), IPv4 and IPv6
// endpoints and allowed IPs, a preshared key, a keepalive, a live
// handshake counter.
func TestKernelReaderMatchesWgctrl(t *testing.T) {
	_, h := kernelDeviceLab(t, "wgrd0")
	key, _ := wgtypes.GeneratePrivateKey()
	port, mark := 51820, 0x42
	peers := randomPeers(5000, 1)
	peers[17].AllowedIPs = nil
	for j := 0; j < 300; j++ {
		peers[17].AllowedIPs = append(peers[17].AllowedIPs, net.IPNet{IP: net.IPv4(10, 250, byte(j/256), byte(j)).To4(), Mask: net.CIDRMask(32, 32)})
	}
	psk, _ := wgtypes.GenerateKey()
	ka := time.Second
	peers[42].Endpoint = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	peers[42].PersistentKeepaliveInterval = &ka
	peers[42].PresharedKey = &psk
	peers[43].Endpoint = &net.UDPAddr{IP: net.ParseIP("2001:db8::7"), Port: 51999}
	peers[43].AllowedIPs = append(peers[43].AllowedIPs, net.IPNet{IP: net.ParseIP("fd00:1::"), Mask: net.CIDRMask(64, 128)},
		net.IPNet{IP: net.IPv4(172, 20, 0, 0).To4(), Mask: net.CIDRMask(14, 32)})
	if err := h.configure("wgrd0", ImplKernel, wgtypes.Config{PrivateKey: &key, ListenPort: &port, FirewallMark: &mark, Peers: peers}); err != nil {
		t.Fatal(err)
	}
	kd, ok, err := h.readKernel("wgrd0", 0)
	if err != nil || !ok {
		t.Fatalf("read: %v (exists %v)", err, ok)
	}
	dev, err := h.device("wgrd0")
	if err != nil {
		t.Fatal(err)
	}
	if kd.privateKey != Key(dev.PrivateKey) || kd.publicKey != dev.PublicKey || kd.listenPort != dev.ListenPort || kd.fwMark != dev.FirewallMark {
		t.Errorf("device fields differ: port %d/%d mark %d/%d", kd.listenPort, dev.ListenPort, kd.fwMark, dev.FirewallMark)
	}
	if len(kd.peers) != len(dev.Peers) {
		t.Fatalf("%d peers read; wgctrl reads %d", len(kd.peers), len(dev.Peers))
	}
	for _, p := range dev.Peers {
		want := observePeer(p)
		got := kd.peers[p.PublicKey]
		// The counters of peer 42 move between the two reads.
		want.TxBytes, got.TxBytes, want.LastHandshake, got.LastHandshake = 0, 0, time.Time{}, time.Time{}
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Fatalf("peer %s:\n read   %+v\n wgctrl %+v", p.PublicKey, got, want)
		}
	}
	if n := len(kd.peers[peers[17].PublicKey].AllowedIPs); n != 300 {
		t.Errorf("the split peer has %d allowed IPs; want 300", n)
	}
	if ep := kd.peers[peers[43].PublicKey].Endpoint.String(); ep != "[2001:db8::7]:51999" {
		t.Errorf("IPv6 endpoint read as %s", ep)
	}
	// The allowed IPs are cut from shared slabs: each peer's must end where
	// its capacity does, so that an append to one never writes over the
	// next peer's.
	for k, p := range kd.peers {
		if cap(p.AllowedIPs) != len(p.AllowedIPs) {
			t.Fatalf("peer %s: allowed IPs of length %d, capacity %d", k, len(p.AllowedIPs), cap(p.AllowedIPs))
		}
	}
	if d, _ := h.Digest("wgrd0", ImplKernel); d != kd.digest {
		t.Error("the reader's digest is not the digest of the same state")
	}
}
