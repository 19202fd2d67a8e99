package wg

import (
	"crypto/rand"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// decoded is what a sequence of WG_CMD_SET_DEVICE messages says, as the
// kernel would read it: device fields from the first, peers in order,
// allowed IPs added up across a split peer's parts.
type decoded struct {
	names   []string
	key     []byte
	port    int
	peers   []wgtypes.PeerConfig
	replace map[wgtypes.Key]bool
}

func decode(t *testing.T, msgs [][]byte) decoded {
	t.Helper()
	d := decoded{replace: map[wgtypes.Key]bool{}}
	idx := map[wgtypes.Key]int{}
	for mi, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m)
		if err != nil {
			t.Fatal(err)
		}
		for ad.Next() {
			switch ad.Type() {
			case unix.WGDEVICE_A_IFNAME:
				d.names = append(d.names, ad.String())
			case unix.WGDEVICE_A_PRIVATE_KEY:
				if mi > 0 {
					t.Errorf("message %d repeats the private key", mi)
				}
				d.key = ad.Bytes()
			case unix.WGDEVICE_A_LISTEN_PORT:
				d.port = int(ad.Uint16())
			case unix.WGDEVICE_A_PEERS:
				ad.Nested(func(pd *netlink.AttributeDecoder) error {
					for pd.Next() {
						pd.Nested(func(a *netlink.AttributeDecoder) error {
							var p wgtypes.PeerConfig
							var flags uint32
							for a.Next() {
								switch a.Type() {
								case unix.WGPEER_A_PUBLIC_KEY:
									copy(p.PublicKey[:], a.Bytes())
								case unix.WGPEER_A_FLAGS:
									flags = a.Uint32()
								case unix.WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL:
									ka := time.Duration(a.Uint16()) * time.Second
									p.PersistentKeepaliveInterval = &ka
								case unix.WGPEER_A_ALLOWEDIPS:
									a.Nested(func(ips *netlink.AttributeDecoder) error {
										for ips.Next() {
											ips.Nested(func(ip *netlink.AttributeDecoder) error {
												var n net.IPNet
												for ip.Next() {
													switch ip.Type() {
													case unix.WGALLOWEDIP_A_IPADDR:
														n.IP = net.IP(ip.Bytes())
													case unix.WGALLOWEDIP_A_CIDR_MASK:
														n.Mask = net.CIDRMask(int(ip.Uint8()), len(n.IP)*8)
													}
												}
												p.AllowedIPs = append(p.AllowedIPs, n)
												return nil
											})
										}
										return nil
									})
								}
							}
							if i, ok := idx[p.PublicKey]; ok {
								if flags&unix.WGPEER_F_REPLACE_ALLOWEDIPS != 0 {
									t.Errorf("a later part of peer %s replaces its allowed IPs", p.PublicKey)
								}
								d.peers[i].AllowedIPs = append(d.peers[i].AllowedIPs, p.AllowedIPs...)
								return nil
							}
							idx[p.PublicKey] = len(d.peers)
							d.replace[p.PublicKey] = flags&unix.WGPEER_F_REPLACE_ALLOWEDIPS != 0
							d.peers = append(d.peers, p)
							return nil
						})
					}
					return nil
				})
			}
		}
		if err := ad.Err(); err != nil {
			t.Fatalf("message %d: %v", mi, err)
		}
	}
	return d
}

func randomPeers(n, ips int) []wgtypes.PeerConfig {
	ka := 25 * time.Second
	out := make([]wgtypes.PeerConfig, n)
	for i := range out {
		rand.Read(out[i].PublicKey[:])
		out[i].ReplaceAllowedIPs = true
		if i%7 == 0 {
			out[i].PersistentKeepaliveInterval = &ka
		}
		for j := 0; j < ips; j++ {
			out[i].AllowedIPs = append(out[i].AllowedIPs, net.IPNet{IP: net.IPv4(10, byte(i>>8), byte(i), byte(j)).To4(), Mask: net.CIDRMask(32, 32)})
		}
	}
	return out
}

// TestMessagesPackedAsWg: 5000 peers go in as few messages as their bytes
// need (at most ceil(bytes / page) + 1), each within its limit (32 KiB,
// or a page as wg(8) where the kernel refuses bigger), and say
// exactly the config: every peer once, in order, all its allowed IPs, a
// peer with more IPs than a message holds split with only its first part
// replacing them.
func TestMessagesPackedAsWg(t *testing.T) {
	for _, limit := range []int{msgLimit, pageLimit()} {
		t.Run(fmt.Sprintf("%d-byte messages", limit), func(t *testing.T) { testMessages(t, limit) })
	}
}

func testMessages(t *testing.T, limit int) {
	for _, tt := range []struct {
		name       string
		peers, ips int
	}{{"5000 peers, one /32 each", 5000, 1}, {"40 peers of 300 allowed IPs", 40, 300}, {"one peer", 1, 1}, {"none", 0, 0}} {
		t.Run(tt.name, func(t *testing.T) {
			key, _ := wgtypes.GeneratePrivateKey()
			port := 51820
			cfg := wgtypes.Config{PrivateKey: &key, ListenPort: &port, Peers: randomPeers(tt.peers, tt.ips)}
			msgs, err := messages("wg0", cfg, limit)
			if err != nil {
				t.Fatal(err)
			}
			total := 0
			for i, m := range msgs {
				if n := nlmsgHdrLen + genlHdrLen + len(m); n > limit {
					t.Errorf("message %d is %d bytes, over %d", i, n, limit)
				}
				total += nlmsgHdrLen + genlHdrLen + len(m)
			}
			page := pageLimit()
			bound := (total+page-1)/page + 1
			t.Logf("%d peers x %d allowed IPs: %d messages, %d bytes (bound %d)", tt.peers, tt.ips, len(msgs), total, bound)
			if len(msgs) > bound {
				t.Errorf("%d messages for %d bytes; want at most %d", len(msgs), total, bound)
			}
			d := decode(t, msgs)
			if string(d.key) != string(key[:]) || d.port != port {
				t.Errorf("device fields: key %v port %d", d.key != nil, d.port)
			}
			for _, n := range d.names {
				if n != "wg0\x00" && n != "wg0" {
					t.Errorf("ifname %q", n)
				}
			}
			if len(d.peers) != len(cfg.Peers) {
				t.Fatalf("%d peers decoded, want %d", len(d.peers), len(cfg.Peers))
			}
			for i, want := range cfg.Peers {
				got := d.peers[i]
				if got.PublicKey != want.PublicKey || len(got.AllowedIPs) != len(want.AllowedIPs) || !d.replace[want.PublicKey] {
					t.Fatalf("peer %d: %s with %d allowed IPs (replace %v); want %s with %d", i, got.PublicKey, len(got.AllowedIPs), d.replace[want.PublicKey], want.PublicKey, len(want.AllowedIPs))
				}
				for j := range want.AllowedIPs {
					if got.AllowedIPs[j].String() != want.AllowedIPs[j].String() {
						t.Fatalf("peer %d allowed IP %d: %s, want %s", i, j, got.AllowedIPs[j].String(), want.AllowedIPs[j].String())
					}
				}
				if (want.PersistentKeepaliveInterval == nil) != (got.PersistentKeepaliveInterval == nil) {
					t.Errorf("peer %d keepalive", i)
				}
			}
		})
	}
}

// The old way, for the ratio: wgctrl's one message per peer above 32.
func BenchmarkMessages5000Peers(b *testing.B) {
	cfg := wgtypes.Config{Peers: randomPeers(5000, 1)}
	b.ReportAllocs()
	var n int
	for i := 0; i < b.N; i++ {
		msgs, err := messages("wg0", cfg, msgLimit)
		if err != nil {
			b.Fatal(err)
		}
		n = len(msgs)
	}
	b.ReportMetric(float64(n), "messages")
	b.ReportMetric(5000, "wgctrl-messages")
}
