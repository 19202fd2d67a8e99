package agent

import (
	"context"
	"crypto/rsa"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
)

// This file is the daemon's side of the PIA providers (netcfg/wg/pia):
// one per PIA device, stepped by the loop. What a provider decides (the
// device's key, address and server peer) is laid over the desired state
// before every plan, so the WireGuard subsystem converges it like any
// other device; the providers never write the kernel.

// piaSetup is what one PIA device's provider is made from, read off the
// loop with the config.
type piaSetup struct {
	cfg  pia.Config
	boot pia.Boot
	// id is what a provider is for: a config change that alters it starts
	// a new provider (which re-adopts the saved registration if it fits).
	id string
	// err is why no provider can run (a CA file that cannot be read).
	err error
}

// piaTunnel is one running provider, or why none runs.
type piaTunnel struct {
	p   *pia.Provider
	id  string
	err error
}

// dialIn dials from h's namespace.
func dialIn(h *host.Host) pia.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := h.Do(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// readPIA reads what each PIA device's provider starts from: trust
// anchors, key, saved registration, cached server list.
func readPIA(c *config.Config, o Options, h *host.Host, timers pia.Timers) map[string]piaSetup {
	out := map[string]piaSetup{}
	for _, w := range c.WireGuard {
		if w.PIA == nil {
			continue
		}
		s := piaSetup{id: fmt.Sprintf("%s|%s|%+v|%s", w.Name, w.PrivateKeyFile, *w.PIA, o.StateDir)}
		s.cfg, s.err = piaConfig(w, o, h, timers)
		if s.err == nil {
			s.boot = pia.ReadBoot(s.cfg)
		}
		out[w.Name] = s
	}
	return out
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// piaConfig is the provider configuration of a PIA device.
func piaConfig(w config.WireGuard, o Options, h *host.Host, timers pia.Timers) (pia.Config, error) {
	p := w.PIA
	a := &pia.API{
		Dial: dialIn(h), Roots: pia.DefaultRoots(), ListKey: pia.DefaultListKey(),
		ListURL: orDefault(p.ServerList, pia.DefaultServerList), TokenURL: orDefault(p.TokenURL, pia.DefaultTokenURL),
	}
	var err error
	if p.CAFile != "" {
		if a.Roots, err = pia.LoadRoots(p.CAFile); err != nil {
			return pia.Config{}, fmt.Errorf("caFile: %w", err)
		}
	}
	if p.WebCAFile != "" {
		if a.WebRoots, err = pia.LoadRoots(p.WebCAFile); err != nil {
			return pia.Config{}, fmt.Errorf("webCAFile: %w", err)
		}
	}
	if p.ServerListKeyFile != "" {
		if a.ListKey, err = pia.LoadListKey(p.ServerListKeyFile); err != nil {
			return pia.Config{}, fmt.Errorf("serverListKeyFile: %w", err)
		}
	}
	return pia.Config{
		Device: w.Name, KeyFile: w.PrivateKeyFile, Region: p.Region, PortForward: p.PortForward,
		CredentialsFile: p.CredentialsFile, API: a, Store: pia.StoreAt(o.StateDir), Host: h,
		Timers: timers,
	}, nil
}

// setPIA starts a provider for each new or changed PIA device and drops
// those of devices gone from the config.
func (d *Daemon) setPIA(setups map[string]piaSetup) {
	if d.pia == nil {
		d.pia = map[string]*piaTunnel{}
	}
	for name := range d.pia {
		if _, ok := setups[name]; !ok {
			delete(d.pia, name)
		}
	}
	for name, s := range setups {
		if t, ok := d.pia[name]; ok && t.id == s.id && t.err == nil && s.err == nil {
			continue
		}
		t := &piaTunnel{id: s.id, err: s.err}
		if s.err == nil {
			cfg := s.cfg
			cfg.Count = func(what, result string) { d.metrics.PIA(name, what, result) }
			t.p = pia.New(cfg, s.boot, d.piaEv, d.log)
			d.metrics.StartPIA(name)
		} else {
			d.log.Error("PIA provider cannot start", "device", name, "err", s.err)
		}
		d.pia[name] = t
	}
}

// withPIA is des with every PIA device as its provider has it.
func (d *Daemon) withPIA(des netcfg.Desired) netcfg.Desired {
	if len(d.pia) == 0 {
		return des
	}
	des.WG.Devices = slices.Clone(des.WG.Devices)
	for i, dev := range des.WG.Devices {
		t, ok := d.pia[dev.Name]
		switch {
		case !ok:
		case t.err != nil:
			des.WG.Devices[i].Broken = "pia: " + t.err.Error()
		default:
			des.WG.Devices[i] = t.p.Device(dev)
		}
	}
	return des
}

// stepPIA moves every provider on with its device as observed in o; it
// reports whether a device's desired state changed.
func (d *Daemon) stepPIA(ctx context.Context, o wg.Observed) bool {
	changed := false
	for name, t := range d.pia {
		if t.p == nil {
			continue
		}
		var obs pia.Observation
		if od, ok := o.Devices[name]; ok && od.Impl != "" {
			obs.Exists = true
			if peer, ok := od.Peers[t.p.ServerKey()]; ok && t.p.Registration() != nil {
				obs.HasPeer, obs.LastHandshake, obs.RxBytes = true, peer.LastHandshake, peer.RxBytes
			}
		}
		if t.p.Step(ctx, obs) {
			changed = true
		}
	}
	d.publishPIA()
	return changed
}

// handlePIA passes a call's result to the provider that made it.
func (d *Daemon) handlePIA(ctx context.Context, ev pia.Event) bool {
	changed := false
	for _, t := range d.pia {
		if t.p != nil && t.p.Handle(ctx, ev) {
			changed = true
		}
	}
	d.publishPIA()
	return changed
}

// kickPIA retries now whatever the providers wait to retry.
func (d *Daemon) kickPIA() {
	for _, t := range d.pia {
		if t.p != nil {
			t.p.Kick()
		}
	}
}

// publishPIA puts the providers' state in status, the TunnelHealthy
// condition and the metrics.
func (d *Daemon) publishPIA() {
	if len(d.pia) == 0 {
		d.mu.Lock()
		had := d.status.PIA != nil
		d.status.PIA = nil
		d.mu.Unlock()
		if had {
			d.removeCondition(api.CondTunnelHealthy)
		}
		return
	}
	now := time.Now()
	var tunnels []api.PIATunnel
	var sick []string
	reason := "Healthy"
	names := make([]string, 0, len(d.pia))
	for name := range d.pia {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t := d.pia[name]
		if t.p == nil {
			tunnels = append(tunnels, api.PIATunnel{Device: name, Phase: "broken", LastError: t.err.Error(), HandshakeAgeSeconds: -1})
			sick = append(sick, fmt.Sprintf("%s: %v", name, t.err))
			reason = "ProviderBroken"
			d.metrics.SetTunnelHealthy(name, false)
			continue
		}
		s := t.p.Status()
		tunnels = append(tunnels, tunnelStatus(s, now))
		d.metrics.SetTunnelHealthy(name, s.Healthy)
		if !s.Healthy {
			msg := fmt.Sprintf("%s: %s", name, s.Phase)
			if s.LastError != "" {
				msg += ": " + s.LastError
			}
			if !s.RetryAt.IsZero() {
				msg += fmt.Sprintf(" (retry in %s)", s.RetryAt.Sub(now).Round(time.Second))
			}
			sick = append(sick, msg)
			if reason == "Healthy" {
				reason = "Phase" + strings.ToUpper(string(s.Phase[:1])) + string(s.Phase[1:])
			}
		}
	}
	d.mu.Lock()
	d.status.PIA = tunnels
	d.mu.Unlock()
	if len(sick) == 0 {
		d.setCondition(api.CondTunnelHealthy, api.True, "Healthy", fmt.Sprintf("%d PIA tunnel(s) up", len(tunnels)))
	} else {
		d.setCondition(api.CondTunnelHealthy, api.False, reason, strings.Join(sick, "; "))
	}
	d.refreshHealth()
}

func tunnelStatus(s pia.Status, now time.Time) api.PIATunnel {
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		u := t.UTC()
		return &u
	}
	out := api.PIATunnel{
		Device: s.Device, Phase: string(s.Phase), Healthy: s.Healthy, Region: s.Region,
		ServerCN: s.Server.CN, ServerIP: s.Server.IP,
		RegisteredSince: opt(s.Registered), LastHandshake: opt(s.Handshake), HandshakeAgeSeconds: -1,
		NextTokenRefresh: opt(s.NextToken), ServerList: s.List, LastError: s.LastError,
		LastErrorAt: opt(s.LastErrorAt), RetryAt: opt(s.RetryAt), ProbeFailures: s.ProbeFails,
	}
	if s.ServerVIP.IsValid() {
		out.ServerVIP = s.ServerVIP.String()
	}
	if s.PeerIP.IsValid() {
		out.PeerIP = s.PeerIP.String()
	}
	if !s.Handshake.IsZero() {
		out.HandshakeAgeSeconds = int64(now.Sub(s.Handshake) / time.Second)
	}
	return out
}

// piaHealthy reports whether dev is a PIA device and, if so, whether its
// tunnel is healthy.
func (d *Daemon) piaHealthy(dev string) (isPIA, healthy bool) {
	t, ok := d.pia[dev]
	if !ok {
		return false, false
	}
	return true, t.p != nil && t.p.Healthy()
}

// listKeyOf is the key a PIA section's server list is signed with.
func listKeyOf(p config.PIA) (*rsa.PublicKey, error) {
	if p.ServerListKeyFile == "" {
		return pia.DefaultListKey(), nil
	}
	return pia.LoadListKey(p.ServerListKeyFile)
}

// cachedRegion judges a PIA region against the server list cached under
// stateDir, for validate and plan: an unknown region is an error at its
// line. With no cached list (a new node, or not readable without root)
// nothing is judged; the daemon reports it when the list arrives.
func cachedRegion(stateDir string) func(config.PIA) string {
	return func(p config.PIA) string {
		key, err := listKeyOf(p)
		if err != nil {
			return ""
		}
		l, at, err := pia.StoreAt(stateDir).LoadList(orDefault(p.ServerList, pia.DefaultServerList), key)
		if err != nil || l == nil {
			return ""
		}
		r, ok := l.Region(p.Region)
		switch {
		case !ok:
			return fmt.Sprintf("%q is not a region of PIA's server list (cached %s); nodeagent plan lists none, see PIA's region ids", p.Region, at.UTC().Format("2006-01-02"))
		case p.PortForward && !r.PortForward:
			return fmt.Sprintf("region %s has no port forwarding (PIA's server list, cached %s); choose another region or portForward: false", p.Region, at.UTC().Format("2006-01-02"))
		}
		return ""
	}
}

// planPIA is des for a one-shot plan: each PIA device as its saved
// registration has it, read without writing anything (no key is
// generated; a node that never ran the daemon plans the device bare).
func planPIA(c *config.Config, des netcfg.Desired, o Options) netcfg.Desired {
	des.WG.Devices = slices.Clone(des.WG.Devices)
	store := pia.StoreAt(o.StateDir)
	for i, dev := range des.WG.Devices {
		idx := slices.IndexFunc(c.WireGuard, func(w config.WireGuard) bool { return w.Name == dev.Name && w.PIA != nil })
		if idx < 0 {
			continue
		}
		w := c.WireGuard[idx]
		key := dev.PrivateKey
		if w.PrivateKeyFile == "" {
			key, _ = store.PeekKey(dev.Name)
		}
		saved, _ := store.Load(dev.Name)
		reg := saved.Reg
		if reg != nil && (key.IsZero() || reg.PublicKey != key.PublicKey().String()) {
			reg = nil
		}
		if key.IsZero() {
			if w.PrivateKeyFile == "" {
				des.WG.Devices[i].Broken = "created and registered with PIA by nodeagent run (no key saved yet)"
			}
			continue
		}
		des.WG.Devices[i] = pia.Overlay(dev, key, reg)
	}
	return des
}
