package metrics

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/peerlive"
	"github.com/prometheus/client_golang/prometheus"
)

// MaxPeerSeries is how many WireGuard peers, over all devices, get series
// of their own (bytes, handshake age, state; four each at most): the
// first by device and peer name. The rest of a device's peers are summed
// under the peer label OtherPeers, and every peer is counted in
// nodeagent_wireguard_peers_by_state, so a register of thousands of
// phones costs a bounded number of series.
const MaxPeerSeries = 100

// OtherPeers is the peer label of the sum of the peers past
// MaxPeerSeries.
const OtherPeers = "_other"

// The peer states of the per-peer series.
const (
	PeerLive     = "live"
	PeerIdle     = "idle"
	PeerDisabled = "disabled"
	PeerExpired  = "expired"
)

// wgPeer is one peer's figures (or the sum of several).
type wgPeer struct {
	name, state string
	rx, tx      int64
	// last is the last handshake (zero: none).
	last time.Time
}

// peerState is p's state for the metrics.
func peerState(p api.WireGuardPeer) string {
	switch {
	case p.State != "":
		return p.State
	case p.Live:
		return PeerLive
	}
	return PeerIdle
}

// addPeers takes peers' figures into d: series of their own for up to
// budget of them (by name), the sum of the rest; it returns the budget
// left.
func (d *wgDevice) addPeers(peers []api.WireGuardPeer, now time.Time, budget int) int {
	named := make([]wgPeer, 0, len(peers))
	for _, p := range peers {
		wp := wgPeer{name: p.Name, state: peerState(p), rx: p.RxBytes, tx: p.TxBytes}
		if wp.name == "" {
			wp.name = shortKey(p.PublicKey)
		}
		switch {
		case p.LastHandshake != nil && !p.LastHandshake.IsZero():
			wp.last = *p.LastHandshake
		case p.HandshakeAgeSeconds >= 0:
			wp.last = now.Add(-time.Duration(p.HandshakeAgeSeconds) * time.Second)
		}
		d.states[wp.state]++
		named = append(named, wp)
	}
	slices.SortFunc(named, func(a, b wgPeer) int { return strings.Compare(a.name, b.name) })
	seen := map[string]bool{}
	for i, p := range named {
		if i >= budget {
			d.other.rx += p.rx
			d.other.tx += p.tx
			d.nOther++
			continue
		}
		// Two peers of one name (a name: in two files) must not give one
		// series twice: the scrape would fail.
		for n := 2; seen[p.name]; n++ {
			p.name = named[i].name + "#" + strconv.Itoa(n)
		}
		seen[p.name] = true
		d.own = append(d.own, p)
	}
	return max(budget-len(named), 0)
}

// shortKey is the start of a public key, a peer's name when it has none.
func shortKey(k string) string {
	if len(k) > 8 {
		return k[:8]
	}
	return k
}

// collectPeers sends d's per-peer series.
func (c *wireGuardCollector) collectPeers(ch chan<- prometheus.Metric, d wgDevice, now time.Time) {
	for _, p := range d.own {
		ch <- prometheus.MustNewConstMetric(c.peerRx, prometheus.CounterValue, float64(p.rx), d.name, p.name)
		ch <- prometheus.MustNewConstMetric(c.peerTx, prometheus.CounterValue, float64(p.tx), d.name, p.name)
		if !p.last.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.peerAge, prometheus.GaugeValue, max(now.Sub(p.last).Seconds(), 0), d.name, p.name)
		}
		state := p.state
		if state == PeerLive && now.Sub(p.last) >= peerlive.Stale {
			state = PeerIdle // the snapshot aged since it was taken
		}
		ch <- prometheus.MustNewConstMetric(c.peerState, prometheus.GaugeValue, 1, d.name, p.name, state)
	}
	if d.nOther > 0 {
		ch <- prometheus.MustNewConstMetric(c.peerRx, prometheus.CounterValue, float64(d.other.rx), d.name, OtherPeers)
		ch <- prometheus.MustNewConstMetric(c.peerTx, prometheus.CounterValue, float64(d.other.tx), d.name, OtherPeers)
	}
	for _, s := range []string{PeerLive, PeerIdle, PeerDisabled, PeerExpired} {
		ch <- prometheus.MustNewConstMetric(c.byState, prometheus.GaugeValue, float64(d.states[s]), d.name, s)
	}
}

// SetRefresh gives the scrape a function that brings the WireGuard
// figures up to date first (the daemon reads its devices; at most once a
// second), so bytes and handshakes are as of the scrape, not of the last
// resync. It is given refreshTimeout.
func (m *Metrics) SetRefresh(f func(ctx context.Context)) { m.refresh.Store(&f) }

// refreshTimeout bounds a scrape's refresh: a busy loop delays the
// scrape by at most this, and then the last figures are served.
const refreshTimeout = 2 * time.Second

func (m *Metrics) refreshNow(ctx context.Context) {
	if f := m.refresh.Load(); f != nil {
		ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
		defer cancel()
		(*f)(ctx)
	}
}
