package wg

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// testKey is a fixed key, so plan texts are stable.
func testKey(b byte) Key {
	var k Key
	for i := range k {
		k[i] = b
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k
}

func pub(b byte) wgtypes.Key { return testKey(b).PublicKey() }

// removals is the plan text of removing peers ks from wg0, in the order
// of their keys' bytes.
func removals(ks ...wgtypes.Key) string {
	slices.SortFunc(ks, func(a, b wgtypes.Key) int { return bytes.Compare(a[:], b[:]) })
	var s strings.Builder
	for _, k := range ks {
		s.WriteString("- wireguard wg0 peer " + k.String() + "\n")
	}
	return s.String()
}

func TestMakePlan(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	priv := testKey(1)
	alice := Peer{PublicKey: pub(2), Name: "alice", AllowedIPs: []netip.Prefix{pfx("10.90.0.2/32")}}
	bob := Peer{PublicKey: pub(3), Name: "bob", AllowedIPs: []netip.Prefix{pfx("10.90.0.3/32")}, Endpoint: "bob.example:51820", Keepalive: 25 * time.Second}
	wg0 := Device{Name: "wg0", Impl: ImplAuto, PrivateKey: priv, ListenPort: 51820, MTU: 1420, Addrs: []netip.Prefix{pfx("10.90.0.1/24")}, Peers: []Peer{alice, bob}}
	bobEP := netip.MustParseAddrPort("198.51.100.7:51820")
	resolved := map[string]Resolved{"bob.example:51820": {Addr: bobEP}}
	obsPeer := func(p Peer, ep netip.AddrPort, hs time.Time) ObservedPeer {
		return ObservedPeer{PublicKey: p.PublicKey, Endpoint: ep, Keepalive: p.Keepalive, LastHandshake: hs, AllowedIPs: p.AllowedIPs}
	}
	wg0obs := ObservedDevice{Name: "wg0", Index: 5, Kind: "wireguard", Impl: ImplKernel, Owned: true, MTU: 1420, Up: true,
		Addrs:      []ObservedAddr{{Prefix: pfx("10.90.0.1/24"), Owned: true}},
		PrivateKey: priv, PublicKey: priv.PublicKey(), ListenPort: 51820,
		Peers: map[wgtypes.Key]ObservedPeer{
			alice.PublicKey: obsPeer(alice, netip.MustParseAddrPort("203.0.113.5:4000"), now.Add(-time.Minute)),
			bob.PublicKey:   obsPeer(bob, bobEP, now.Add(-time.Minute)),
		}}
	with := func(d Device, f func(*Device)) Device {
		d.Peers = append([]Peer(nil), d.Peers...)
		f(&d)
		return d
	}
	withObs := func(od ObservedDevice, f func(*ObservedDevice)) ObservedDevice {
		peers := map[wgtypes.Key]ObservedPeer{}
		for k, v := range od.Peers {
			peers[k] = v
		}
		od.Peers = peers
		f(&od)
		return od
	}
	obs := func(ds ...ObservedDevice) Observed {
		o := Observed{Devices: map[string]ObservedDevice{}, Resolved: resolved, Kernel: true, Time: now}
		for _, d := range ds {
			o.Devices[d.Name] = d
		}
		return o
	}
	noKernel := func(o Observed) Observed { o.Kernel = false; return o }
	kept := func(o Observed, ks ...wgtypes.Key) Observed {
		o.Kept = map[string]map[wgtypes.Key]bool{"wg0": {}}
		for _, k := range ks {
			o.Kept["wg0"][k] = true
		}
		return o
	}
	daemon := func(o Observed) Observed { o.Userspace = true; return o }
	pubs := func(b byte) string { return pub(b).String() }
	tests := []struct {
		name string
		d    []Device
		o    Observed
		want string
	}{
		{"cold start creates the device with its peers", []Device{wg0}, obs(),
			"+ wireguard wg0 (kernel, public key " + priv.PublicKey().String() + ", listen port 51820, mtu 1420)\n" +
				"+ address 10.90.0.1/24 on wg0\n" +
				"+ wireguard wg0 peer " + pubs(2) + " (alice) allowed IPs 10.90.0.2/32\n" +
				"+ wireguard wg0 peer " + pubs(3) + " (bob) allowed IPs 10.90.0.3/32, endpoint bob.example:51820 = 198.51.100.7:51820, keepalive 25s\n"},
		{"converged is empty", []Device{wg0}, obs(wg0obs), ""},
		{"roamed endpoint of a peer without one is kept", []Device{wg0}, obs(withObs(wg0obs, func(o *ObservedDevice) {
			p := o.Peers[alice.PublicKey]
			p.Endpoint = netip.MustParseAddrPort("203.0.113.99:1")
			o.Peers[alice.PublicKey] = p
		})), ""},
		{"a live session on an old address of a name is left alone", []Device{wg0}, obs(withObs(wg0obs, func(o *ObservedDevice) {
			p := o.Peers[bob.PublicKey]
			p.Endpoint = netip.MustParseAddrPort("198.51.100.1:51820")
			o.Peers[bob.PublicKey] = p
		})), ""},
		{"a stale peer is re-pointed at what its name resolves to", []Device{wg0}, obs(withObs(wg0obs, func(o *ObservedDevice) {
			p := o.Peers[bob.PublicKey]
			p.Endpoint = netip.MustParseAddrPort("198.51.100.1:51820")
			p.LastHandshake = now.Add(-10 * time.Minute)
			o.Peers[bob.PublicKey] = p
		})), "~ wireguard wg0 peer " + pubs(3) + " (bob) endpoint 198.51.100.1:51820 -> 198.51.100.7:51820\n"},
		{"allowed IPs replaced on one peer only", []Device{with(wg0, func(d *Device) {
			d.Peers[0].AllowedIPs = []netip.Prefix{pfx("10.90.0.2/32"), pfx("10.91.0.0/24")}
		})}, obs(wg0obs), "~ wireguard wg0 peer " + pubs(2) + " (alice) allowed IPs 10.90.0.2/32 -> 10.90.0.2/32,10.91.0.0/24\n"},
		{"removed peer is removed, added peer added", []Device{with(wg0, func(d *Device) {
			d.Peers = []Peer{bob, {PublicKey: pub(4), Name: "carol", AllowedIPs: []netip.Prefix{pfx("10.90.0.4/32")}, PresharedKey: testKey(9)}}
		})}, obs(wg0obs), "- wireguard wg0 peer " + pubs(2) + "\n+ wireguard wg0 peer " + pubs(4) + " (carol) allowed IPs 10.90.0.4/32, preshared key\n"},
		{"preshared key change shows no key", []Device{with(wg0, func(d *Device) { d.Peers[0].PresharedKey = testKey(7) })}, obs(wg0obs),
			"~ wireguard wg0 peer " + pubs(2) + " (alice) preshared key\n"},
		{"device settings", []Device{with(wg0, func(d *Device) { d.ListenPort = 51821; d.FwMark = 0x100; d.PrivateKey = testKey(5) })}, obs(wg0obs),
			"~ wireguard wg0 private key (public key " + priv.PublicKey().String() + " -> " + testKey(5).PublicKey().String() + "), listen port 51820 -> 51821, fwmark 0x0 -> 0x100\n"},
		{"mtu, address and down", []Device{with(wg0, func(d *Device) { d.MTU = 1380; d.Addrs = []netip.Prefix{pfx("10.90.0.1/25")} })},
			obs(withObs(wg0obs, func(o *ObservedDevice) {
				o.Up = false
				o.Addrs = append(o.Addrs, ObservedAddr{Prefix: pfx("192.0.2.1/32")})
			})),
			"~ wireguard wg0 mtu 1420 -> 1380\n+ address 10.90.0.1/25 on wg0\n- address 10.90.0.1/24 on wg0\n~ wireguard wg0 down -> up\n"},
		{"removed device is deleted", nil, obs(wg0obs), "- wireguard wg0 (kernel)\n"},
		{"peers gone are removed in key order", []Device{with(wg0, func(d *Device) { d.Peers = nil })}, obs(withObs(wg0obs, func(od *ObservedDevice) {
			for _, b := range []byte{9, 5, 7} {
				od.Peers[pub(b)] = ObservedPeer{PublicKey: pub(b)}
			}
		})), removals(pub(2), pub(3), pub(5), pub(7), pub(9))},
		{"foreign WireGuard device is a conflict", []Device{wg0}, obs(withObs(wg0obs, func(o *ObservedDevice) { o.Owned = false })),
			"! wireguard wg0: exists and was not created by nodeagent; left untouched (set adopt: true to take it over)\n"},
		{"foreign device is never deleted", nil, obs(withObs(wg0obs, func(o *ObservedDevice) { o.Owned = false })), ""},
		// An adoption never removes a peer: one the register lacks is kept,
		// listed, recorded, and left so by later syncs.
		{"adopt keeps a peer the register lacks", []Device{with(wg0, func(d *Device) { d.Adopt = true; d.Peers = d.Peers[1:] })}, obs(withObs(wg0obs, func(o *ObservedDevice) { o.Owned = false })),
			"~ wireguard wg0 adopt (mark as nodeagent's)\n~ wireguard wg0 peer " + pubs(2) + " kept (in the kernel, not in the register: the adoption leaves it as it is, and nodeagent never removes it; add its file to the register to manage it, or remove it with wg set)\n"},
		{"a peer kept from the adoption stays", []Device{with(wg0, func(d *Device) { d.Adopt = true; d.Peers = d.Peers[1:] })}, kept(obs(wg0obs), pub(2)), ""},
		{"a kept peer the register names is managed from then on", []Device{wg0}, kept(obs(wg0obs), pub(2)),
			"~ wireguard wg0 peer " + pubs(2) + " (alice) no longer kept apart: the register names it now\n"},
		{"a kept peer gone from the kernel is forgotten", []Device{with(wg0, func(d *Device) { d.Peers = d.Peers[1:] })}, kept(obs(withObs(wg0obs, func(o *ObservedDevice) { delete(o.Peers, pub(2)) })), pub(2)),
			"~ wireguard wg0 peer " + pubs(2) + " no longer kept apart: it left the kernel\n"},
		{"an owned device's peer the register lacks is removed", []Device{with(wg0, func(d *Device) { d.Adopt = true; d.Peers = d.Peers[1:] })}, obs(wg0obs),
			"- wireguard wg0 peer " + pubs(2) + "\n"},
		{"a link of another kind is a conflict", []Device{wg0}, obs(ObservedDevice{Name: "wg0", Kind: "veth", MTU: 1500}),
			"! wireguard wg0: exists as a veth link, not a WireGuard device; left untouched\n"},
		{"no kernel and no daemon", []Device{wg0}, noKernel(obs()),
			"! wireguard wg0: the kernel has no WireGuard, and the userspace implementation runs inside nodeagent's own process, which a one-shot apply is not (run the daemon)\n"},
		{"no kernel, daemon: userspace", []Device{with(wg0, func(d *Device) { d.Peers = nil })}, daemon(noKernel(obs())),
			"+ wireguard wg0 (userspace, public key " + priv.PublicKey().String() + ", listen port 51820, mtu 1420)\n+ address 10.90.0.1/24 on wg0\n"},
		{"kernel asked for, none there", []Device{with(wg0, func(d *Device) { d.Impl = ImplKernel })}, daemon(noKernel(obs())),
			"! wireguard wg0: the kernel has no WireGuard (implementation: kernel); use auto or userspace\n"},
		{"auto keeps a running userspace device", []Device{wg0}, daemon(obs(withObs(wg0obs, func(o *ObservedDevice) { o.Impl = ImplUserspace; o.Kind = "tun" }))), ""},
		{"explicit implementation change recreates", []Device{with(wg0, func(d *Device) { d.Impl = ImplUserspace; d.Peers = nil; d.Addrs = nil })}, daemon(obs(withObs(wg0obs, func(o *ObservedDevice) { o.Addrs = nil; o.Peers = nil }))),
			"- wireguard wg0 (kernel): recreate: implementation kernel -> userspace\n+ wireguard wg0 (userspace, public key " + priv.PublicKey().String() + ", listen port 51820, mtu 1420)\n"},
		{"broken device is reported and left alone", []Device{with(wg0, func(d *Device) { d.Broken = "private key file /k: permission denied" })}, obs(wg0obs),
			"! wireguard wg0: private key file /k: permission denied; left as it is\n"},
		{"skipped register file is reported, the rest converges", []Device{with(wg0, func(d *Device) { d.Skipped = []string{"peers.d/x.yaml:2: allowedIPs[0]: bad"} })}, obs(wg0obs),
			"! wireguard wg0: peer skipped: peers.d/x.yaml:2: allowedIPs[0]: bad\n"},
		{"unreadable register keeps the kernel's peers", []Device{with(wg0, func(d *Device) {
			d.Peers = nil
			d.KeepPeers = true
			d.Skipped = []string{"/etc/nodeagent/peers.d: cannot read the directory: permission denied"}
		})}, obs(wg0obs), "! wireguard wg0: peer skipped: /etc/nodeagent/peers.d: cannot read the directory: permission denied\n"},
		{"unresolvable endpoint: new peer skipped", []Device{with(wg0, func(d *Device) {
			d.Peers = append(d.Peers, Peer{PublicKey: pub(6), Name: "dan", Endpoint: "nosuch.invalid:51820", AllowedIPs: []netip.Prefix{pfx("10.90.0.6/32")}})
		})}, func() Observed {
			o := obs(wg0obs)
			o.Resolved = map[string]Resolved{"bob.example:51820": {Addr: bobEP}, "nosuch.invalid:51820": {Err: "no such host"}}
			return o
		}(), "! wireguard wg0 peer " + pubs(6) + " (dan): endpoint nosuch.invalid:51820 does not resolve (no such host); skipped\n"},
		{"unresolvable endpoint: existing peer left as it is", []Device{wg0}, func() Observed {
			o := obs(wg0obs)
			o.Resolved = map[string]Resolved{"bob.example:51820": {Err: "no such host"}}
			return o
		}(), "! wireguard wg0 peer " + pubs(3) + " (bob): endpoint bob.example:51820 does not resolve (no such host); left as it is\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := MakePlan(Desired{Devices: tt.d}, tt.o).String()
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKeyNeverPrints(t *testing.T) {
	k := testKey(1)
	d := Device{Name: "wg0", PrivateKey: k, Peers: []Peer{{PresharedKey: testKey(2)}}}
	secret := []string{wgtypes.Key(k).String(), wgtypes.Key(testKey(2)).String()}
	for _, s := range []string{
		k.String(), fmtAll(k), fmtAll(d), fmtAll(&d),
	} {
		for _, sec := range secret {
			if strings.Contains(s, sec) || strings.Contains(s, "[") && strings.Contains(s, " 1 1 1 ") {
				t.Errorf("key material in %q", s)
			}
		}
	}
	if _, err := ParseKey("not a key " + secret[0][:10]); err == nil || strings.Contains(err.Error(), secret[0][:10]) {
		t.Errorf("ParseKey error %v: want an error that does not repeat the text", err)
	}
}

// TestAdoptWritesOnlyTheMark: adopting a device (wg-quick's, say) that
// already has exactly the desired key, port and 20 peers (endpoints,
// keepalives, preshared keys, live sessions, a plain address) plans the
// mark and nothing else: no device write, no peer write, so no session
// is disturbed. The plan reads as only an adoption.
func TestAdoptWritesOnlyTheMark(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	priv := testKey(1)
	d := Device{Name: "wg0", Impl: ImplAuto, PrivateKey: priv, ListenPort: 51820, MTU: 1420, Adopt: true,
		Addrs: []netip.Prefix{pfx("10.90.0.1/24")}}
	od := ObservedDevice{Name: "wg0", Index: 7, Kind: "wireguard", Impl: ImplKernel, MTU: 1420, Up: true,
		Addrs:      []ObservedAddr{{Prefix: pfx("10.90.0.1/24")}},
		PrivateKey: priv, PublicKey: priv.PublicKey(), ListenPort: 51820, Peers: map[wgtypes.Key]ObservedPeer{}}
	resolved := map[string]Resolved{}
	for i := range 20 {
		p := Peer{PublicKey: pub(byte(10 + i)), Name: fmt.Sprintf("peer%d", i),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 90, 1, byte(i)}), 32)}}
		op := ObservedPeer{PublicKey: p.PublicKey, AllowedIPs: p.AllowedIPs, RxBytes: int64(1000 * i), TxBytes: int64(2000 * i)}
		switch i % 4 {
		case 0: // a site peer at a fixed address, keepalive, live
			p.Endpoint = fmt.Sprintf("198.51.100.%d:51820", i)
			p.Keepalive = 25 * time.Second
			op.Endpoint = netip.MustParseAddrPort(p.Endpoint)
			resolved[p.Endpoint] = Resolved{Addr: op.Endpoint}
			op.Keepalive = p.Keepalive
			op.LastHandshake = now.Add(-30 * time.Second)
		case 1: // a peer by host name, with a preshared key
			p.Endpoint = fmt.Sprintf("site%d.example:51820", i)
			p.PresharedKey = testKey(byte(100 + i))
			ep := netip.MustParseAddrPort(fmt.Sprintf("203.0.113.%d:51820", i))
			resolved[p.Endpoint] = Resolved{Addr: ep}
			op.Endpoint, op.PresharedKey = ep, p.PresharedKey
			op.LastHandshake = now.Add(-time.Hour)
		case 2: // a roaming client, live at an endpoint the kernel learnt
			op.Endpoint = netip.MustParseAddrPort(fmt.Sprintf("192.0.2.%d:40000", i))
			op.LastHandshake = now.Add(-10 * time.Second)
		default: // a client never seen
		}
		d.Peers = append(d.Peers, p)
		od.Peers[p.PublicKey] = op
	}
	o := Observed{Devices: map[string]ObservedDevice{"wg0": od}, Resolved: resolved, Kernel: true, Time: now}
	p := MakePlan(Desired{Devices: []Device{d}}, o)
	if want := "~ wireguard wg0 adopt (mark as nodeagent's)\n"; p.String() != want {
		t.Fatalf("adopting a device as desired plans:\n%swant only:\n%s", p, want)
	}
	if len(p.Ops) != 1 || p.Ops[0].Kind != OpMarkDevice {
		t.Errorf("ops %+v: want the mark alone: no device, peer, address or MTU write", p.Ops)
	}
	if r := p.Report(); !r.OnlyAdoptions() {
		t.Errorf("the adoption is not reported as one: %+v", r)
	}

	// Marked, it is nodeagent's: adopt: true again (a re-import) plans
	// nothing.
	od.Owned = true
	o.Devices["wg0"] = od
	if p := MakePlan(Desired{Devices: []Device{d}}, o); !p.Empty() {
		t.Errorf("an owned device with adopt: true plans:\n%s", p)
	}
}
