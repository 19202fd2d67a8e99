package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSyncDone(t *testing.T) {
	m := New()
	m.SyncDone("start", 40*time.Millisecond, nil)
	m.SyncDone("event", 3*time.Millisecond, []string{"routes", "nftables"})
	m.SyncDone("event", 2*time.Second, []string{"routes"})

	if err := testutil.CollectAndCompare(m.syncs, strings.NewReader(`
# HELP nodeagent_syncs_total Syncs (observe, plan, apply, observe) run, by what triggered them.
# TYPE nodeagent_syncs_total counter
nodeagent_syncs_total{trigger="api"} 0
nodeagent_syncs_total{trigger="config"} 0
nodeagent_syncs_total{trigger="event"} 2
nodeagent_syncs_total{trigger="resync"} 0
nodeagent_syncs_total{trigger="retry"} 0
nodeagent_syncs_total{trigger="signal"} 0
nodeagent_syncs_total{trigger="start"} 1
`)); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(m.syncErrors, strings.NewReader(`
# HELP nodeagent_sync_errors_total Syncs in which a subsystem failed, by subsystem.
# TYPE nodeagent_sync_errors_total counter
nodeagent_sync_errors_total{subsystem="links"} 0
nodeagent_sync_errors_total{subsystem="nftables"} 1
nodeagent_sync_errors_total{subsystem="routes"} 2
nodeagent_sync_errors_total{subsystem="sysctls"} 0
nodeagent_sync_errors_total{subsystem="wireguard"} 0
`)); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(m.syncDuration, strings.NewReader(`
# HELP nodeagent_sync_duration_seconds How long a sync took.
# TYPE nodeagent_sync_duration_seconds histogram
nodeagent_sync_duration_seconds_bucket{le="0.001"} 0
nodeagent_sync_duration_seconds_bucket{le="0.0025"} 0
nodeagent_sync_duration_seconds_bucket{le="0.005"} 1
nodeagent_sync_duration_seconds_bucket{le="0.01"} 1
nodeagent_sync_duration_seconds_bucket{le="0.025"} 1
nodeagent_sync_duration_seconds_bucket{le="0.05"} 2
nodeagent_sync_duration_seconds_bucket{le="0.1"} 2
nodeagent_sync_duration_seconds_bucket{le="0.25"} 2
nodeagent_sync_duration_seconds_bucket{le="0.5"} 2
nodeagent_sync_duration_seconds_bucket{le="1"} 2
nodeagent_sync_duration_seconds_bucket{le="2.5"} 3
nodeagent_sync_duration_seconds_bucket{le="5"} 3
nodeagent_sync_duration_seconds_bucket{le="10"} 3
nodeagent_sync_duration_seconds_bucket{le="30"} 3
nodeagent_sync_duration_seconds_bucket{le="+Inf"} 3
nodeagent_sync_duration_seconds_sum 2.043
nodeagent_sync_duration_seconds_count 3
`)); err != nil {
		t.Error(err)
	}
}

func TestDriftRepaired(t *testing.T) {
	m := New()
	m.DriftRepaired("route", 2)
	m.DriftRepaired("route", 1)
	m.DriftRepaired("wireguard_peer", 1)
	m.DriftRepaired("link", 0) // nothing repaired: no change
	m.DriftRepaired("link", -1)

	if err := testutil.CollectAndCompare(m.driftRepairs, strings.NewReader(`
# HELP nodeagent_drift_repairs_total Owned kernel objects restored after something else changed or removed them, by kind.
# TYPE nodeagent_drift_repairs_total counter
nodeagent_drift_repairs_total{kind="address"} 0
nodeagent_drift_repairs_total{kind="link"} 0
nodeagent_drift_repairs_total{kind="nftables"} 0
nodeagent_drift_repairs_total{kind="route"} 3
nodeagent_drift_repairs_total{kind="rule"} 0
nodeagent_drift_repairs_total{kind="sysctl"} 0
nodeagent_drift_repairs_total{kind="wireguard_peer"} 1
`)); err != nil {
		t.Error(err)
	}
}

func TestRolledBack(t *testing.T) {
	m := New()
	m.RolledBack("apiserver")
	m.RolledBack("apiserver")
	m.RolledBack("gateway-arp")
	if got := testutil.ToFloat64(m.rollbacks.WithLabelValues("apiserver")); got != 2 {
		t.Errorf("rollbacks{probe=apiserver} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.rollbacks.WithLabelValues("gateway-arp")); got != 1 {
		t.Errorf("rollbacks{probe=gateway-arp} = %v, want 1", got)
	}
}

func TestGauges(t *testing.T) {
	m := New()
	m.SetTunnelHealthy("wg-pia", true)
	m.SetTunnelHealthy("wg-pia2", true)
	m.SetTunnelHealthy("wg-pia2", false)
	m.SetReady(true)
	m.SetKillSwitchDrops(41)
	m.SetKillSwitchDrops(1234)
	m.SetForwardedPort("wg-pia", 47123)
	m.SetForwardedPort("wg-lost", 1000)
	m.SetForwardedPort("wg-lost", 0) // the port lost: 0, the series kept
	m.SetForwardedPort("wg-off", 2000)
	m.ClearForwardedPort("wg-off") // port forwarding turned off: series gone

	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(`
# HELP nodeagent_forwarded_port The port the VPN provider forwards to this node, by WireGuard device: 0 while port forwarding is on and no port is bound (none yet, or the port lost); no series with port forwarding off.
# TYPE nodeagent_forwarded_port gauge
nodeagent_forwarded_port{device="wg-lost"} 0
nodeagent_forwarded_port{device="wg-pia"} 47123
# HELP nodeagent_killswitch_drops_total Packets the kill switch dropped, from nodeagent's named nftables counter.
# TYPE nodeagent_killswitch_drops_total counter
nodeagent_killswitch_drops_total 1234
# HELP nodeagent_ready Whether the node is ready and not degraded (what nodeagentctl status exits 0 for): 1 or 0.
# TYPE nodeagent_ready gauge
nodeagent_ready 1
# HELP nodeagent_tunnel_healthy Whether a provider's tunnel is healthy, by device and kind (pia: registered, handshaken since, the server answering): 1 or 0. A plain WireGuard device has no series: with peers that come and go (a phone offline) no handshake is not a fault; see nodeagent_wireguard_live_peers.
# TYPE nodeagent_tunnel_healthy gauge
nodeagent_tunnel_healthy{device="wg-pia",kind="pia"} 1
nodeagent_tunnel_healthy{device="wg-pia2",kind="pia"} 0
`), "nodeagent_forwarded_port", "nodeagent_killswitch_drops_total", "nodeagent_ready", "nodeagent_tunnel_healthy"); err != nil {
		t.Error(err)
	}
	m.SetReady(false)
	if got := testutil.ToFloat64(m.ready); got != 0 {
		t.Errorf("ready = %v after SetReady(false), want 0", got)
	}
}

// TestIdleServerDeviceNoTunnelHealth: a remote-access device whose one
// peer (a phone) is offline shows as 1 peer, 0 live, and has no
// tunnel_healthy series at all; the PIA tunnel beside it has its health,
// labelled kind="pia" (what NodeagentTunnelUnhealthy selects).
func TestIdleServerDeviceNoTunnelHealth(t *testing.T) {
	m := New()
	m.SetWireGuard([]api.WireGuardDevice{
		{Name: "wg0", Implementation: "kernel", Peers: []api.WireGuardPeer{{PublicKey: "phone=", HandshakeAgeSeconds: -1}}},
		{Name: "wg-pia", Implementation: "kernel", LivePeers: 1, Peers: []api.WireGuardPeer{{PublicKey: "server=", Endpoint: "192.0.2.9:1337", HandshakeAgeSeconds: 10, Live: true}}},
	})
	m.SetTunnelHealthy("wg-pia", true)
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(`
# HELP nodeagent_tunnel_healthy Whether a provider's tunnel is healthy, by device and kind (pia: registered, handshaken since, the server answering): 1 or 0. A plain WireGuard device has no series: with peers that come and go (a phone offline) no handshake is not a fault; see nodeagent_wireguard_live_peers.
# TYPE nodeagent_tunnel_healthy gauge
nodeagent_tunnel_healthy{device="wg-pia",kind="pia"} 1
# HELP nodeagent_wireguard_live_peers Peers with an endpoint and a handshake younger than 3 minutes.
# TYPE nodeagent_wireguard_live_peers gauge
nodeagent_wireguard_live_peers{device="wg-pia"} 1
nodeagent_wireguard_live_peers{device="wg0"} 0
# HELP nodeagent_wireguard_peers Peers configured on the WireGuard device.
# TYPE nodeagent_wireguard_peers gauge
nodeagent_wireguard_peers{device="wg-pia"} 1
nodeagent_wireguard_peers{device="wg0"} 1
`), "nodeagent_tunnel_healthy", "nodeagent_wireguard_peers", "nodeagent_wireguard_live_peers"); err != nil {
		t.Error(err)
	}
}

func TestWireGuard(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	m := New()
	m.wg.now = func() time.Time { return now }
	at := func(ago time.Duration) *time.Time { t := now.Add(-ago); return &t }

	m.SetWireGuard([]api.WireGuardDevice{
		{Name: "wg0", Implementation: "kernel", LivePeers: 1, Peers: []api.WireGuardPeer{
			{PublicKey: "alice=", Endpoint: "192.0.2.1:51820", LastHandshake: at(30 * time.Second), HandshakeAgeSeconds: 30, Live: true},
			{PublicKey: "bob=", LastHandshake: at(10 * time.Minute), HandshakeAgeSeconds: 600},
			{PublicKey: "carol=", HandshakeAgeSeconds: -1}, // never handshook: omitted
		}},
		{Name: "wg-pia", Implementation: "kernel", LivePeers: 1, Peers: []api.WireGuardPeer{
			// Only an age, no timestamp: still exported.
			{PublicKey: "pia=", Endpoint: "198.51.100.7:1337", HandshakeAgeSeconds: 5, Live: true},
		}},
		// Configured but missing: its counts are still reported.
		{Name: "wg-gone", Problems: []string{"device does not exist"}},
	})
	want := `
# HELP nodeagent_wireguard_live_peers Peers with an endpoint and a handshake younger than 3 minutes.
# TYPE nodeagent_wireguard_live_peers gauge
nodeagent_wireguard_live_peers{device="wg-gone"} 0
nodeagent_wireguard_live_peers{device="wg-pia"} 1
nodeagent_wireguard_live_peers{device="wg0"} 1
# HELP nodeagent_wireguard_latest_handshake_age_seconds Seconds since the device's most recent completed handshake with any peer (for a PIA tunnel, its server); omitted while none has completed.
# TYPE nodeagent_wireguard_latest_handshake_age_seconds gauge
nodeagent_wireguard_latest_handshake_age_seconds{device="wg-pia"} 5
nodeagent_wireguard_latest_handshake_age_seconds{device="wg0"} 30
# HELP nodeagent_wireguard_peers Peers configured on the WireGuard device.
# TYPE nodeagent_wireguard_peers gauge
nodeagent_wireguard_peers{device="wg-gone"} 0
nodeagent_wireguard_peers{device="wg-pia"} 1
nodeagent_wireguard_peers{device="wg0"} 3
`
	if err := testutil.CollectAndCompare(m.wg, strings.NewReader(want), "nodeagent_wireguard_live_peers", "nodeagent_wireguard_latest_handshake_age_seconds", "nodeagent_wireguard_peers"); err != nil {
		t.Error(err)
	}

	// Ages grow between snapshots, as the kernel's do.
	now = now.Add(20 * time.Second)
	if err := testutil.CollectAndCompare(m.wg, strings.NewReader(`
# HELP nodeagent_wireguard_latest_handshake_age_seconds Seconds since the device's most recent completed handshake with any peer (for a PIA tunnel, its server); omitted while none has completed.
# TYPE nodeagent_wireguard_latest_handshake_age_seconds gauge
nodeagent_wireguard_latest_handshake_age_seconds{device="wg-pia"} 25
nodeagent_wireguard_latest_handshake_age_seconds{device="wg0"} 50
`), "nodeagent_wireguard_latest_handshake_age_seconds"); err != nil {
		t.Error(err)
	}

	// bob leaves the register, wg-pia and wg-gone leave the config: their
	// series go with them.
	m.SetWireGuard([]api.WireGuardDevice{
		{Name: "wg0", Implementation: "kernel", LivePeers: 1, Peers: []api.WireGuardPeer{
			{PublicKey: "alice=", LastHandshake: at(0), HandshakeAgeSeconds: 0, Live: true},
			{PublicKey: "carol=", HandshakeAgeSeconds: -1},
		}},
	})
	if err := testutil.CollectAndCompare(m.wg, strings.NewReader(`
# HELP nodeagent_wireguard_live_peers Peers with an endpoint and a handshake younger than 3 minutes.
# TYPE nodeagent_wireguard_live_peers gauge
nodeagent_wireguard_live_peers{device="wg0"} 1
# HELP nodeagent_wireguard_latest_handshake_age_seconds Seconds since the device's most recent completed handshake with any peer (for a PIA tunnel, its server); omitted while none has completed.
# TYPE nodeagent_wireguard_latest_handshake_age_seconds gauge
nodeagent_wireguard_latest_handshake_age_seconds{device="wg0"} 0
# HELP nodeagent_wireguard_peers Peers configured on the WireGuard device.
# TYPE nodeagent_wireguard_peers gauge
nodeagent_wireguard_peers{device="wg0"} 2
`), "nodeagent_wireguard_live_peers", "nodeagent_wireguard_latest_handshake_age_seconds", "nodeagent_wireguard_peers"); err != nil {
		t.Error(err)
	}

	m.SetWireGuard(nil)
	if n := testutil.CollectAndCount(m.wg); n != 0 {
		t.Errorf("%d WireGuard series after SetWireGuard(nil), want 0", n)
	}
}

func TestRegistriesAreIndependent(t *testing.T) {
	a, b := New(), New()
	a.SetReady(true)
	if got := testutil.ToFloat64(b.ready); got != 0 {
		t.Errorf("second Metrics sees ready = %v from the first", got)
	}
}

func TestLint(t *testing.T) {
	m := New()
	m.SetWireGuard([]api.WireGuardDevice{{Name: "wg0", Peers: []api.WireGuardPeer{{PublicKey: "k=", HandshakeAgeSeconds: 1}}}})
	m.SetForwardedPort("wg-pia", 1)
	m.SetTunnelHealthy("wg-pia", true)
	m.RolledBack("apiserver")
	m.SyncDone("start", time.Millisecond, []string{"routes"})
	problems, err := testutil.GatherAndLint(m.Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "nodeagent_") {
			t.Errorf("lint %s: %s", p.Metric, p.Text)
		}
	}
}

func TestServe(t *testing.T) {
	m := New()
	m.SyncDone("start", 5*time.Millisecond, nil)
	m.SetReady(true)
	m.SetWireGuard([]api.WireGuardDevice{{Name: "wg0", Peers: []api.WireGuardPeer{{PublicKey: "k=", HandshakeAgeSeconds: 3}}}})

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.ServeListener(ctx, l, nil) }()

	base := "http://" + l.Addr().String()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	for _, name := range []string{
		"nodeagent_syncs_total", "nodeagent_sync_duration_seconds_bucket", "nodeagent_drift_repairs_total",
		"nodeagent_killswitch_drops_total", "nodeagent_ready 1", "nodeagent_wireguard_peers",
		"nodeagent_wireguard_live_peers", "nodeagent_wireguard_latest_handshake_age_seconds",
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(string(body), name) {
			t.Errorf("scrape lacks %s", name)
		}
	}

	resp, err = http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /: %s, want 404", resp.Status)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeListener after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeListener did not return after cancel")
	}
	if _, err := http.Get(base + "/metrics"); err == nil {
		t.Error("listener still answers after shutdown")
	}
}

func TestServeBadAddr(t *testing.T) {
	err := New().Serve(context.Background(), "127.0.0.1:notaport", "", nil)
	if err == nil || !strings.Contains(err.Error(), "metrics listener 127.0.0.1:notaport") {
		t.Errorf("Serve(bad addr) = %v, want a wrapped listen error", err)
	}
}

// TestPortHook: a device with a hook has its runs at 0 and port_delivered
// 0 from the start; runs count by result; a device whose hook went loses
// its series.
func TestPortHook(t *testing.T) {
	m := New()
	m.StartPortHook("wg-pia")
	m.StartPortHook("wg-old")
	m.PortHookRan("wg-pia", HookTimeout)
	m.PortHookRan("wg-pia", HookFailure)
	m.PortHookRan("wg-pia", HookSuccess)
	m.SetPortDelivered("wg-pia", true)
	m.StartPortHook("wg-pia") // a reload keeps what was delivered
	m.StopPortHook("wg-old")
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(`
# HELP nodeagent_port_delivered Whether a PIA device's portForward.onChange exited 0 for the current port: 1 or 0; only devices with an onChange have the series.
# TYPE nodeagent_port_delivered gauge
nodeagent_port_delivered{device="wg-pia"} 1
# HELP nodeagent_port_hook_runs_total Runs of a PIA device's portForward.onChange, by device and result (success, failure, timeout).
# TYPE nodeagent_port_hook_runs_total counter
nodeagent_port_hook_runs_total{device="wg-pia",result="failure"} 1
nodeagent_port_hook_runs_total{device="wg-pia",result="success"} 1
nodeagent_port_hook_runs_total{device="wg-pia",result="timeout"} 1
`), "nodeagent_port_delivered", "nodeagent_port_hook_runs_total"); err != nil {
		t.Error(err)
	}
}
