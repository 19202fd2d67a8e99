package wg

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestReadUserspace: a userspace device read in process (readUserspace)
// is the observation wgctrl's read through the UAPI socket gives
// (observePeer), for peers of every shape: a live one with a handshake and
// counters, one with a preshared key, keepalive, an IPv6 endpoint and
// allowed IPs of both families, one with nothing but its key; with the
// device's key, port and fwmark. The read makes no UAPI connection, so the
// device's generation stays put.
func TestReadUserspace(t *testing.T) {
	testenv.RequireRoot(t)
	const (
		nameA, nameB = "wgrdA1", "wgrdB1"
		portA, portB = 47121, 47122
	)
	psk, other, bare := usKeys(t), usKeys(t), usKeys(t)
	mark := 0x1234
	tun := usTunnel(t, nameA, nameB, portA, portB, wgtypes.Config{
		FirewallMark: &mark,
		Peers: []wgtypes.PeerConfig{
			{
				PublicKey:                   other.PublicKey(),
				PresharedKey:                &psk,
				Endpoint:                    &net.UDPAddr{IP: net.ParseIP("2001:db8::7"), Port: 51820},
				PersistentKeepaliveInterval: ptr(25 * time.Second),
				AllowedIPs: []net.IPNet{
					{IP: net.IPv4(10, 98, 0, 0), Mask: net.CIDRMask(16, 32)},
					{IP: net.ParseIP("fd00:98::"), Mask: net.CIDRMask(64, 128)},
					{IP: net.IPv4(10, 97, 1, 1), Mask: net.CIDRMask(32, 32)},
				},
			},
			{PublicKey: bare.PublicKey()},
		},
	})
	a, u, keyA, keyB := tun.a, tun.u, tun.keyA, tun.keyB
	a.Exec(t, "ping", "-c", "2", "-W", "2", "10.99.0.2")

	h := &Handle{Host: a.Host, Userspace: u}
	defer h.Close()
	gen0, _ := u.Generation(nameA)
	got := ObservedDevice{Name: nameA, Impl: ImplUserspace}
	ok, err := h.readUserspace(&got, 0)
	if !ok || err != nil {
		t.Fatalf("readUserspace: %v, %v", ok, err)
	}
	if gen, _ := u.Generation(nameA); gen != gen0 {
		t.Errorf("the in-process read moved the device's generation: %d, was %d", gen, gen0)
	}

	// The same device through the UAPI socket and wgctrl, as read did it
	// before.
	dev, err := h.device(nameA)
	if err != nil {
		t.Fatal(err)
	}
	want := ObservedDevice{Name: nameA, Impl: ImplUserspace, PrivateKey: Key(dev.PrivateKey), PublicKey: dev.PublicKey,
		ListenPort: dev.ListenPort, FwMark: dev.FirewallMark, Peers: map[wgtypes.Key]ObservedPeer{}}
	for _, p := range dev.Peers {
		want.Peers[p.PublicKey] = observePeer(p)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Prefix{}, netip.AddrPort{})); diff != "" {
		t.Errorf("in-process read differs from wgctrl's (-wgctrl +in-process):\n%s", diff)
	}
	// What the comparison rests on is really there.
	live := got.Peers[keyB.PublicKey()]
	if live.LastHandshake.IsZero() || live.RxBytes == 0 || live.TxBytes == 0 {
		t.Errorf("the live peer has no handshake or counters: %+v", live)
	}
	if p := got.Peers[other.PublicKey()]; p.PresharedKey != Key(psk) || p.Keepalive != 25*time.Second ||
		p.Endpoint != netip.MustParseAddrPort("[2001:db8::7]:51820") || len(p.AllowedIPs) != 3 {
		t.Errorf("the peer with a preshared key, keepalive and IPv6 endpoint reads %+v", p)
	}
	if got.ListenPort != portA || got.FwMark != mark || got.PublicKey != keyA.PublicKey() || len(got.Peers) != 3 {
		t.Errorf("device: port %d fwmark %#x public key %v, %d peers", got.ListenPort, got.FwMark, got.PublicKey, len(got.Peers))
	}
}

func ptr[T any](v T) *T { return &v }

// TestParseUAPI: a UAPI answer that is not one is an error naming the line
// and the key, never half an observation; a well-formed one parses to the
// values written.
func TestParseUAPI(t *testing.T) {
	k := strings.Repeat("11", 32)
	good := "private_key=" + strings.Repeat("22", 32) + "\nlisten_port=51820\nfwmark=7\n" +
		"public_key=" + k + "\npreshared_key=" + strings.Repeat("00", 32) + "\nprotocol_version=1\n" +
		"endpoint=[2001:db8::1]:51820\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\n" +
		"tx_bytes=10\nrx_bytes=20\npersistent_keepalive_interval=25\nallowed_ip=10.0.0.0/8\nallowed_ip=10.1.2.3/32\n" +
		"public_key=" + strings.Repeat("33", 32) + "\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\nerrno=0\n\n"
	var od ObservedDevice
	if err := parseUAPI(&od, []byte(good), 0); err != nil {
		t.Fatal(err)
	}
	var pk wgtypes.Key
	for i := range pk {
		pk[i] = 0x11
	}
	p := od.Peers[pk]
	if od.ListenPort != 51820 || od.FwMark != 7 || od.PrivateKey[0] != 0x22 || len(od.Peers) != 2 ||
		p.Endpoint != netip.MustParseAddrPort("[2001:db8::1]:51820") || !p.LastHandshake.Equal(time.Unix(1700000000, 5)) ||
		p.TxBytes != 10 || p.RxBytes != 20 || p.Keepalive != 25*time.Second ||
		!slices.Equal(p.AllowedIPs, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.2.3/32")}) {
		t.Errorf("parsed %+v, peer %+v", od, p)
	}
	for _, tt := range []struct{ text, want string }{
		{"listen_port\n", "line 1: no '='"},
		{"listen_port=x\n", "line 1: bad listen_port"},
		{"public_key=abc\n", "line 1: bad public_key"},
		{"listen_port=1\npublic_key=" + k + "\nallowed_ip=10.0.0.0/33\n", "line 3: bad allowed_ip"},
		{"allowed_ip=10.0.0.0/8\n", "line 1: bad allowed_ip"},
		{"public_key=" + k + "\nendpoint=nowhere\n", "line 2: bad endpoint"},
		{"public_key=" + k + "\nprivate_key=" + k + "\n", "line 2: bad private_key"},
		{"public_key=" + k + "\nrx_bytes=-1\n", "line 2: bad rx_bytes"},
		{"errno=22\n", "errno=22"},
	} {
		var od ObservedDevice
		err := parseUAPI(&od, []byte(tt.text), 0)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseUAPI(%q) = %v; want an error with %q", tt.text, err, tt.want)
		}
		if od.Peers != nil {
			t.Errorf("parseUAPI(%q) failed but left peers behind", tt.text)
		}
	}
}
