package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPeerSeries: each peer's bytes, handshake age and state by name, a
// held peer as disabled, and every peer counted by state.
func TestPeerSeries(t *testing.T) {
	m := New()
	now := time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)
	m.wg.now = func() time.Time { return now }
	hs := now.Add(-30 * time.Second)
	m.SetWireGuard([]api.WireGuardDevice{{Name: "wg0", LivePeers: 1, Peers: []api.WireGuardPeer{
		{PublicKey: "a=", Name: "phone", LastHandshake: &hs, HandshakeAgeSeconds: 30, RxBytes: 1000, TxBytes: 2000, Live: true},
		{PublicKey: "b=", Name: "laptop", HandshakeAgeSeconds: -1},
		{PublicKey: "c=", Name: "old", HandshakeAgeSeconds: -1, State: "disabled", Reason: "disabled: true in its file"},
	}}})
	if err := testutil.CollectAndCompare(m.wg, strings.NewReader(`
# HELP nodeagent_wireguard_peer_handshake_age_seconds Seconds since the peer's last completed handshake (the first 100 peers by device and name); omitted while it has none.
# TYPE nodeagent_wireguard_peer_handshake_age_seconds gauge
nodeagent_wireguard_peer_handshake_age_seconds{device="wg0",peer="phone"} 30
# HELP nodeagent_wireguard_peer_receive_bytes_total Bytes received from the peer, by device and peer name (the first 100 peers by device and name; the rest summed under peer="_other").
# TYPE nodeagent_wireguard_peer_receive_bytes_total counter
nodeagent_wireguard_peer_receive_bytes_total{device="wg0",peer="laptop"} 0
nodeagent_wireguard_peer_receive_bytes_total{device="wg0",peer="old"} 0
nodeagent_wireguard_peer_receive_bytes_total{device="wg0",peer="phone"} 1000
# HELP nodeagent_wireguard_peer_state The peer's state, 1 for the one it is in: live (a handshake younger than 3 minutes), idle, disabled or expired (the first 100 peers by device and name).
# TYPE nodeagent_wireguard_peer_state gauge
nodeagent_wireguard_peer_state{device="wg0",peer="laptop",state="idle"} 1
nodeagent_wireguard_peer_state{device="wg0",peer="old",state="disabled"} 1
nodeagent_wireguard_peer_state{device="wg0",peer="phone",state="live"} 1
# HELP nodeagent_wireguard_peers Peers configured on the WireGuard device.
# TYPE nodeagent_wireguard_peers gauge
nodeagent_wireguard_peers{device="wg0"} 2
# HELP nodeagent_wireguard_peers_by_state Peers of the device in each state (live, idle, disabled, expired), every peer counted.
# TYPE nodeagent_wireguard_peers_by_state gauge
nodeagent_wireguard_peers_by_state{device="wg0",state="disabled"} 1
nodeagent_wireguard_peers_by_state{device="wg0",state="expired"} 0
nodeagent_wireguard_peers_by_state{device="wg0",state="idle"} 1
nodeagent_wireguard_peers_by_state{device="wg0",state="live"} 1
`), "nodeagent_wireguard_peer_handshake_age_seconds", "nodeagent_wireguard_peer_receive_bytes_total", "nodeagent_wireguard_peer_state",
		"nodeagent_wireguard_peers", "nodeagent_wireguard_peers_by_state"); err != nil {
		t.Error(err)
	}
}

// TestPeerSeriesCap: 2,000 peers with handshakes give series of their own
// to MaxPeerSeries of them (four each), the rest summed under _other.
func TestPeerSeriesCap(t *testing.T) {
	m := New()
	now := time.Now()
	var peers []api.WireGuardPeer
	var rx int64
	for i := range 2000 {
		hs := now.Add(-time.Duration(i) * time.Second)
		peers = append(peers, api.WireGuardPeer{PublicKey: fmt.Sprintf("k%04d=", i), Name: fmt.Sprintf("client%04d", i),
			LastHandshake: &hs, RxBytes: int64(i), TxBytes: 1, Live: i < 100})
		if i >= MaxPeerSeries {
			rx += int64(i)
		}
	}
	m.SetWireGuard([]api.WireGuardDevice{{Name: "wg0", Peers: peers}})
	perPeer := map[string]bool{}
	series := 0
	for _, name := range []string{"nodeagent_wireguard_peer_receive_bytes_total", "nodeagent_wireguard_peer_transmit_bytes_total",
		"nodeagent_wireguard_peer_handshake_age_seconds", "nodeagent_wireguard_peer_state"} {
		mfs, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, mm := range mf.GetMetric() {
				for _, l := range mm.GetLabel() {
					if l.GetName() == "peer" && l.GetValue() != OtherPeers {
						perPeer[l.GetValue()] = true
						series++
					}
					if l.GetName() == "peer" && l.GetValue() == OtherPeers && name == "nodeagent_wireguard_peer_receive_bytes_total" && int64(mm.GetCounter().GetValue()) != rx {
						t.Errorf("_other received %v, want %d", mm.GetCounter().GetValue(), rx)
					}
				}
			}
		}
	}
	t.Logf("2000 peers: %d per-peer series for %d peers (cap %d peers, 4 series each), the rest under %s", series, len(perPeer), MaxPeerSeries, OtherPeers)
	if len(perPeer) != MaxPeerSeries || series > 4*MaxPeerSeries {
		t.Errorf("%d peers with %d series of their own, want %d peers, at most %d series", len(perPeer), series, MaxPeerSeries, 4*MaxPeerSeries)
	}
}
