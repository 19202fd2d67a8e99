// Package metrics is nodeagent's Prometheus instrumentation: syncs, drift
// repairs, rollbacks, WireGuard peers, the tunnel, the kill switch and the
// forwarded port. Everything lives on the Metrics' own registry, never the
// global default one, so several agents (tests) can run in one process and
// nothing a library registers globally leaks into the scrape.
//
// The listener is off unless the daemon is given an address; see Serve.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "nodeagent"

// Drift kinds for DriftRepaired: the kinds of kernel object a sync can find
// changed or removed behind nodeagent's back and restore.
const (
	DriftLink          = "link"
	DriftAddress       = "address"
	DriftRoute         = "route"
	DriftRule          = "rule"
	DriftNftables      = "nftables"
	DriftWireGuardPeer = "wireguard_peer"
	DriftSysctl        = "sysctl"
)

// Metrics holds every nodeagent metric. Create it with New; its methods are
// safe for concurrent use.
type Metrics struct {
	// Registry holds nodeagent's metrics plus the Go runtime and process
	// collectors (the memory target in DESIGN §8 is watched through them).
	Registry *prometheus.Registry

	syncs         *prometheus.CounterVec
	syncDuration  prometheus.Histogram
	syncErrors    *prometheus.CounterVec
	driftRepairs  *prometheus.CounterVec
	rollbacks     *prometheus.CounterVec
	tunnelHealthy *prometheus.GaugeVec
	forwardedPort *prometheus.GaugeVec
	hookRuns      *prometheus.CounterVec
	portDelivered *prometheus.GaugeVec
	unprotected   prometheus.Gauge
	ready         prometheus.Gauge
	pending       prometheus.Gauge
	registrations *prometheus.CounterVec
	tokens        *prometheus.CounterVec
	condition     *prometheus.GaugeVec

	// killSwitchDrops is the last value read from the kernel's named nft
	// counter; a CounterFunc exports it as is.
	killSwitchDrops atomic.Uint64

	wg *wireGuardCollector
	// refresh, when set, is run before a scrape (SetRefresh).
	refresh atomic.Pointer[func(context.Context)]
}

// New returns a Metrics with every metric registered on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "syncs_total",
			Help: "Syncs (observe, plan, apply, observe) run, by what triggered them.",
		}, []string{"trigger"}),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "sync_duration_seconds",
			Help: "How long a sync took.",
			// A no-op sync is ~2 ms (DESIGN §8); a cold converge of a
			// thousand objects or a slow safe-apply probe takes seconds.
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		syncErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "sync_errors_total",
			Help: "Syncs in which a subsystem failed, by subsystem.",
		}, []string{"subsystem"}),
		driftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "drift_repairs_total",
			Help: "Owned kernel objects restored after something else changed or removed them, by kind.",
		}, []string{"kind"}),
		rollbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rollbacks_total",
			Help: "Changes safe apply rolled back, by the probe that failed after them.",
		}, []string{"probe"}),
		tunnelHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "tunnel_healthy",
			Help: "Whether a provider's tunnel is healthy, by device and kind (pia: registered, handshaken since, the server answering): 1 or 0. A plain WireGuard device has no series: with peers that come and go (a phone offline) no handshake is not a fault; see nodeagent_wireguard_live_peers.",
		}, []string{"device", "kind"}),
		forwardedPort: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "forwarded_port",
			Help: "The port the VPN provider forwards to this node, by WireGuard device: 0 while port forwarding is on and no port is bound (none yet, or the port lost); no series with port forwarding off.",
		}, []string{"device"}),
		hookRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "port_hook_runs_total",
			Help: "Runs of a PIA device's portForward.onChange, by device and result (success, failure, timeout).",
		}, []string{"device", "result"}),
		portDelivered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "port_delivered",
			Help: "Whether a PIA device's portForward.onChange exited 0 for the current port: 1 or 0; only devices with an onChange have the series.",
		}, []string{"device"}),
		unprotected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "forwarding_unprotected",
			Help: "1 while packet forwarding is on and a configured kill switch is not in the kernel (nftables failed), else 0.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "ready",
			Help: "Whether the node is ready and not degraded (what nodeagentctl status exits 0 for): 1 or 0.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "pending_objects",
			Help: "Objects that wait for a link the config does not create (a parent NIC, a device a route names): 0 on a converged node.",
		}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "pia_registrations_total",
			Help: "PIA addKey registrations, by device and result (ok, login_failed, error).",
		}, []string{"device", "result"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "pia_tokens_total",
			Help: "PIA token requests, by device and result (issued, refreshed, rejected, error).",
		}, []string{"device", "result"}),
		condition: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "condition",
			Help: "The daemon's conditions (Ready, Converged, ConfigLoaded, KillSwitchArmed, SafeApply, ARPReachable, PeersConfigured, TunnelHealthy, LabelsSynced, PortDelivered, Coexistence, Conflict, GatewayRole): 1 True, 0 False; absent while not reported or Unknown.",
		}, []string{"condition"}),
		wg: newWireGuardCollector(time.Now),
	}
	// The known label values start at 0, so rate() and increase() work from
	// the first scrape rather than from the first sync of each kind. The
	// triggers are api.Sync.Trigger's.
	for _, t := range []string{"start", "config", "signal", "event", "resync", "retry", "api"} {
		m.syncs.WithLabelValues(t)
	}
	for _, k := range []string{DriftLink, DriftAddress, DriftRoute, DriftRule, DriftNftables, DriftWireGuardPeer, DriftSysctl} {
		m.driftRepairs.WithLabelValues(k)
	}
	// The subsystems, as plan names them, so an alert on increase() sees a
	// first error.
	for _, sub := range []string{"links", "wireguard", "sysctls", "routes", "nftables"} {
		m.syncErrors.WithLabelValues(sub)
	}
	killSwitchDrops := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: namespace, Name: "killswitch_drops_total",
		Help: "Packets the kill switch dropped, from nodeagent's named nftables counter.",
	}, func() float64 { return float64(m.killSwitchDrops.Load()) })

	m.Registry.MustRegister(
		m.syncs, m.syncDuration, m.syncErrors, m.driftRepairs, m.rollbacks,
		m.tunnelHealthy, m.forwardedPort, m.hookRuns, m.portDelivered, m.unprotected, m.ready, m.pending, m.registrations, m.tokens, m.condition, killSwitchDrops, m.wg,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// SyncDone records a finished sync: what triggered it, how long it took and
// which subsystems failed in it (none for a clean sync).
func (m *Metrics) SyncDone(trigger string, d time.Duration, failedSubsystems []string) {
	m.syncs.WithLabelValues(trigger).Inc()
	m.syncDuration.Observe(d.Seconds())
	for _, s := range failedSubsystems {
		m.syncErrors.WithLabelValues(s).Inc()
	}
}

// DriftRepaired records n repaired objects of a kind (one of the Drift
// constants).
func (m *Metrics) DriftRepaired(kind string, n int) {
	if n <= 0 {
		return
	}
	m.driftRepairs.WithLabelValues(kind).Add(float64(n))
}

// RolledBack records a change safe apply undid because probe failed after it.
func (m *Metrics) RolledBack(probe string) {
	m.rollbacks.WithLabelValues(probe).Inc()
}

// SetWireGuard replaces the WireGuard series with devs, every configured
// device with its peers: a peer or device that is no longer in devs loses its
// series at once. Handshake ages are computed at scrape time from
// LastHandshake, so they keep growing between syncs as they do in the kernel.
func (m *Metrics) SetWireGuard(devs []api.WireGuardDevice) {
	m.wg.set(devs)
}

// TunnelPIA is the kind label of a PIA tunnel's health.
const TunnelPIA = "pia"

// SetTunnelHealthy sets whether the PIA tunnel on device is healthy. Only
// a provider's tunnel has a health to export: a plain WireGuard device (a
// remote-access server) is idle, not unhealthy, while no peer is connected,
// so it is never given the series.
func (m *Metrics) SetTunnelHealthy(device string, healthy bool) {
	m.tunnelHealthy.WithLabelValues(device, TunnelPIA).Set(boolFloat(healthy))
}

// SetCondition exports a condition: status True is 1, False 0; anything
// else removes it.
func (m *Metrics) SetCondition(typ, status string) {
	switch status {
	case api.True:
		m.condition.WithLabelValues(typ).Set(1)
	case api.False:
		m.condition.WithLabelValues(typ).Set(0)
	default:
		m.condition.DeleteLabelValues(typ)
	}
}

// PIA counts a PIA provider's event: what is "registration" or "token",
// result its outcome.
func (m *Metrics) PIA(device, what, result string) {
	switch what {
	case "registration":
		m.registrations.WithLabelValues(device, result).Inc()
	case "token":
		m.tokens.WithLabelValues(device, result).Inc()
	}
}

// StartPIA makes a PIA device's counters known at 0.
func (m *Metrics) StartPIA(device string) {
	for _, r := range []string{"ok", "login_failed", "error"} {
		m.registrations.WithLabelValues(device, r)
	}
	for _, r := range []string{"issued", "refreshed", "rejected", "error"} {
		m.tokens.WithLabelValues(device, r)
	}
}

// SetKillSwitchDrops sets the kill switch's drop count as last read from the
// kernel. The kernel owns the counter; this only mirrors it, so a recreated
// table (counter back to 0) shows as an ordinary counter reset.
func (m *Metrics) SetKillSwitchDrops(n uint64) {
	m.killSwitchDrops.Store(n)
}

// SetForwardedPort sets the port forwarded to device, a device with port
// forwarding on: 0 while none is bound (none yet, or the port lost), so
// that an alert sees "on, and no port" as a value, which an absent series
// cannot say.
func (m *Metrics) SetForwardedPort(device string, port int) {
	m.forwardedPort.WithLabelValues(device).Set(float64(max(port, 0)))
}

// ClearForwardedPort removes device's series: port forwarding turned off,
// or the device gone.
func (m *Metrics) ClearForwardedPort(device string) {
	m.forwardedPort.DeleteLabelValues(device)
}

// Port hook results for PortHookRan.
const (
	HookSuccess = "success"
	HookFailure = "failure"
	HookTimeout = "timeout"
)

// StartPortHook makes a device's port hook series known: its run counts
// at 0 and port_delivered at 0 until the hook delivers.
func (m *Metrics) StartPortHook(device string) {
	for _, r := range []string{HookSuccess, HookFailure, HookTimeout} {
		m.hookRuns.WithLabelValues(device, r)
	}
	m.portDelivered.WithLabelValues(device)
}

// PortHookRan counts one run of device's port hook (result: HookSuccess,
// HookFailure or HookTimeout).
func (m *Metrics) PortHookRan(device, result string) {
	m.hookRuns.WithLabelValues(device, result).Inc()
}

// SetPortDelivered sets whether device's port hook delivered the current
// port.
func (m *Metrics) SetPortDelivered(device string, delivered bool) {
	m.portDelivered.WithLabelValues(device).Set(boolFloat(delivered))
}

// StopPortHook removes a device's port hook series (its onChange or the
// device is gone).
func (m *Metrics) StopPortHook(device string) {
	m.portDelivered.DeleteLabelValues(device)
	for _, r := range []string{HookSuccess, HookFailure, HookTimeout} {
		m.hookRuns.DeleteLabelValues(device, r)
	}
}

// SetForwardingUnprotected sets whether forwarding is on while a
// configured kill switch is not armed.
func (m *Metrics) SetForwardingUnprotected(on bool) {
	m.unprotected.Set(boolFloat(on))
}

// SetReady sets whether the node is ready.
func (m *Metrics) SetReady(ready bool) {
	m.ready.Set(boolFloat(ready))
}

// SetPendingObjects sets how many objects wait for a link the config does
// not create.
func (m *Metrics) SetPendingObjects(n int) {
	m.pending.Set(float64(n))
}

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	h := promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{
		// A failing collector (say /proc unreadable) should cost its own
		// series, not the whole scrape.
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.refreshNow(r.Context())
		h.ServeHTTP(w, r)
	})
}

// Serve serves /metrics, and the forwarded port (PortPaths, behind
// apiKey when it is not ""), on addr (e.g. "127.0.0.1:9477") until ctx
// ends; it binds once. The daemon opens a listener only when given an
// address (the metrics are read-only and secret-free, peers named by
// public key, but a listener is still something an operator should choose
// to open), waits for that address to be on the node (agent/bindwait),
// and serves it with ServeListenerKey.
func (m *Metrics) Serve(ctx context.Context, addr, apiKey string, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener %s: %w", addr, err)
	}
	return m.ServeListenerKey(ctx, l, apiKey, log)
}

// ServeListener is Serve on a listener the caller opened, without an API
// key; it closes l.
func (m *Metrics) ServeListener(ctx context.Context, l net.Listener, log *slog.Logger) error {
	return m.ServeListenerKey(ctx, l, "", log)
}

// ServeListenerKey is Serve on a listener the caller opened; it closes l.
func (m *Metrics) ServeListenerKey(ctx context.Context, l net.Listener, apiKey string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	pf := m.PortForwardHandler(apiKey)
	for _, p := range PortPaths {
		mux.Handle(p, pf)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	log.Info("serving metrics", "addr", l.Addr().String())

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics listener %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics listener %s: %w", l.Addr(), err)
	}
	return nil
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// wireGuardCollector exports the last SetWireGuard snapshot as const
// metrics. Replacing the snapshot whole (rather than Reset-and-refill a
// GaugeVec) means a scrape never sees a half-updated set, and peers or
// devices that went away simply stop being emitted.
type wireGuardCollector struct {
	now func() time.Time

	handshakeAge *prometheus.Desc
	peers        *prometheus.Desc
	livePeers    *prometheus.Desc
	peerRx       *prometheus.Desc
	peerTx       *prometheus.Desc
	peerAge      *prometheus.Desc
	peerState    *prometheus.Desc
	byState      *prometheus.Desc

	mu sync.Mutex
	// devs is the last snapshot, reduced to what the metrics need.
	devs []wgDevice
}

type wgDevice struct {
	name      string
	peers     int
	livePeers int
	// own are the peers with series of their own (MaxPeerSeries in all);
	// other sums the rest, nOther of them.
	own    []wgPeer
	other  wgPeer
	nOther int
	// states counts the peers by state.
	states map[string]int
	// latest is the device's most recent handshake with any peer (zero:
	// none); when only an age was given, it is derived from it at set time
	// so the age still grows until the next snapshot.
	latest time.Time
}

func newWireGuardCollector(now func() time.Time) *wireGuardCollector {
	return &wireGuardCollector{
		now: now,
		// Per device, not per peer: a remote-access server has thousands
		// of peers, and a label per key would be a series each.
		peerRx: prometheus.NewDesc(namespace+"_wireguard_peer_receive_bytes_total",
			fmt.Sprintf("Bytes received from the peer, by device and peer name (the first %d peers by device and name; the rest summed under peer=%q).", MaxPeerSeries, OtherPeers),
			[]string{"device", "peer"}, nil),
		peerTx: prometheus.NewDesc(namespace+"_wireguard_peer_transmit_bytes_total",
			fmt.Sprintf("Bytes sent to the peer, by device and peer name (the first %d peers by device and name; the rest summed under peer=%q).", MaxPeerSeries, OtherPeers),
			[]string{"device", "peer"}, nil),
		peerAge: prometheus.NewDesc(namespace+"_wireguard_peer_handshake_age_seconds",
			fmt.Sprintf("Seconds since the peer's last completed handshake (the first %d peers by device and name); omitted while it has none.", MaxPeerSeries),
			[]string{"device", "peer"}, nil),
		peerState: prometheus.NewDesc(namespace+"_wireguard_peer_state",
			fmt.Sprintf("The peer's state, 1 for the one it is in: live (a handshake younger than 3 minutes), idle, disabled or expired (the first %d peers by device and name).", MaxPeerSeries),
			[]string{"device", "peer", "state"}, nil),
		byState: prometheus.NewDesc(namespace+"_wireguard_peers_by_state",
			"Peers of the device in each state (live, idle, disabled, expired), every peer counted.",
			[]string{"device", "state"}, nil),
		handshakeAge: prometheus.NewDesc(namespace+"_wireguard_latest_handshake_age_seconds",
			"Seconds since the device's most recent completed handshake with any peer (for a PIA tunnel, its server); omitted while none has completed.",
			[]string{"device"}, nil),
		peers: prometheus.NewDesc(namespace+"_wireguard_peers",
			"Peers configured on the WireGuard device.",
			[]string{"device"}, nil),
		livePeers: prometheus.NewDesc(namespace+"_wireguard_live_peers",
			"Peers with an endpoint and a handshake younger than 3 minutes.",
			[]string{"device"}, nil),
	}
}

func (c *wireGuardCollector) set(devs []api.WireGuardDevice) {
	now := c.now()
	snap := make([]wgDevice, 0, len(devs))
	budget := MaxPeerSeries
	for _, d := range devs {
		sd := wgDevice{name: d.Name, livePeers: d.LivePeers, states: map[string]int{}}
		budget = sd.addPeers(d.Peers, now, budget)
		for _, p := range d.Peers {
			if p.State != "" {
				continue // held out of the device
			}
			sd.peers++
			var at time.Time
			switch {
			case p.LastHandshake != nil && !p.LastHandshake.IsZero():
				at = *p.LastHandshake
			case p.HandshakeAgeSeconds >= 0 && p.LastHandshake == nil:
				at = now.Add(-time.Duration(p.HandshakeAgeSeconds) * time.Second)
			default:
				continue // never handshook: no age to report
			}
			if at.After(sd.latest) {
				sd.latest = at
			}
		}
		snap = append(snap, sd)
	}
	c.mu.Lock()
	c.devs = snap
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *wireGuardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.handshakeAge
	ch <- c.peers
	ch <- c.livePeers
	ch <- c.peerRx
	ch <- c.peerTx
	ch <- c.peerAge
	ch <- c.peerState
	ch <- c.byState
}

// Collect implements prometheus.Collector.
func (c *wireGuardCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	devs := c.devs
	c.mu.Unlock()
	// devs is never modified after set, so it is read without the lock.
	now := c.now()
	for _, d := range devs {
		ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(d.peers), d.name)
		ch <- prometheus.MustNewConstMetric(c.livePeers, prometheus.GaugeValue, float64(d.livePeers), d.name)
		if !d.latest.IsZero() {
			age := max(now.Sub(d.latest).Seconds(), 0) // a clock step must not export a negative age
			ch <- prometheus.MustNewConstMetric(c.handshakeAge, prometheus.GaugeValue, age, d.name)
		}
		c.collectPeers(ch, d, now)
	}
}
