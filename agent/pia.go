package agent

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/nft"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/filecheck"
	"github.com/nodeagent/nodeagent/agent/portfwd"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/route"
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
	pf  config.PortForward
	to  netip.Addr
	dns []netip.Prefix
}

// piaTunnel is one running provider, or why none runs, with what the
// config asks of its port and DNS.
type piaTunnel struct {
	p   *pia.Provider
	id  string
	err error
	pf  config.PortForward
	to  netip.Addr // pf.To parsed; invalid when unset
	dns []netip.Prefix
}

// readPIA reads what each PIA device's provider starts from: trust
// anchors, key, saved registration, cached server list.
func readPIA(c *config.Config, o Options, h *host.Host, timers pia.Timers) map[string]piaSetup {
	out := map[string]piaSetup{}
	var node map[string][]netip.Prefix
	var nodeErr error
	if slices.ContainsFunc(c.WireGuard, func(w config.WireGuard) bool { return w.PIA != nil }) {
		node, nodeErr = nodePrefixes(h)
	}
	for _, w := range c.WireGuard {
		if w.PIA == nil {
			continue
		}
		// The hook's fields are not the provider's: a changed onChange,
		// every or hookTimeout keeps the provider (and its registration).
		id := *w.PIA
		id.PortForward.OnChange, id.PortForward.Every, id.PortForward.HookTimeout = nil, nil, 0
		s := piaSetup{id: fmt.Sprintf("%s|%s|%+v|%s", w.Name, w.PrivateKeyFile, id, o.StateDir), pf: w.PIA.PortForward}
		s.to, _ = netip.ParseAddr(w.PIA.PortForward.To)
		for _, f := range w.PIA.DNS.For {
			if p, err := netip.ParsePrefix(f); err == nil {
				s.dns = append(s.dns, p.Masked())
			}
		}
		s.cfg, s.err = piaConfig(w, o, h, timers)
		if s.err == nil {
			s.cfg.Reserved = reservedPrefixes(c, w.Name, node)
			s.boot = pia.ReadBoot(s.cfg)
			if nodeErr != nil {
				s.boot.Err = errors.Join(s.boot.Err, fmt.Errorf("the node's addresses (only the config's prefixes are kept from PIA's addresses): %w", nodeErr))
			}
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
		Dial: h.DialContext, Roots: pia.DefaultRoots(), ListKey: pia.DefaultListKey(),
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
		Device: w.Name, KeyFile: w.PrivateKeyFile, Region: p.Region, PortForward: p.PortForward.Enabled, DNS: len(p.DNS.For) > 0,
		CredentialsFile: p.CredentialsFile, API: a, Store: pia.StoreAt(o.StateDir), Host: h,
		Timers: timers,
	}, nil
}

// setPIA starts a provider for each new or changed PIA device and drops
// those of devices gone from the config; the ports' publisher takes the
// devices' port forwarding (a device gone or port forwarding off loses
// its port's file and series, a changed hook runs at once).
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
			// The node's prefixes may have moved; a registration that
			// now takes one of them is given up.
			t.p.SetReserved(s.cfg.Reserved)
			t.pf = s.pf
			continue
		}
		t := &piaTunnel{id: s.id, err: s.err, pf: s.pf, to: s.to, dns: s.dns}
		if s.err == nil {
			cfg := s.cfg
			cfg.Count = func(what, result string) { d.metrics.PIA(name, what, result) }
			if old, ok := d.pia[name]; ok && old.p != nil {
				cfg.Budget = old.p.Budget()
			}
			t.p = pia.New(cfg, s.boot, d.piaEv, d.log)
			d.metrics.StartPIA(name)
		} else {
			d.log.Error("PIA provider cannot start", "device", name, "err", s.err)
		}
		d.pia[name] = t
	}
	d.piaDevices = map[string]bool{}
	for name := range d.pia {
		d.piaDevices[name] = true
	}
	d.portPublisher().Configure(d.portDevices())
}

// portDevices is the PIA devices' port forwarding as the ports' publisher
// takes it. A device standing by for a gateway role another node holds
// forwards no port here: no port file, no series, no hook (the port is
// the holder's, whose hook delivers it).
func (d *Daemon) portDevices() map[string]portfwd.Device {
	devs := make(map[string]portfwd.Device, len(d.pia))
	for name, t := range d.pia {
		pf := t.pf
		standby := t.p != nil && t.p.Standby()
		devs[name] = portfwd.Device{Enabled: pf.Enabled && !standby, Argv: slices.Clone(pf.OnChange), Timeout: pf.HookTimeoutOrDefault(), Every: pf.HookEvery()}
	}
	return devs
}

// portPublisher is the daemon's ports publisher, made at the first load.
func (d *Daemon) portPublisher() *portfwd.Manager {
	if d.ports == nil {
		d.ports = portfwd.New(portfwd.Options{Dir: d.portDir(), LostAfter: d.o.PortLostAfter, Metrics: d.metrics,
			Log: d.log.With("subsystem", "portforward"), Hooks: d.o.PortHookTimers,
			Ran: func(device string) {
				// Never blocks: a full channel already has the loop look
				// again.
				select {
				case d.hookEv <- hookResult{device: device}:
				default:
				}
			}})
	}
	return d.ports
}

// bind is what a tunnel's provider says of its port (nothing without a
// provider, or with port forwarding off).
func (t *piaTunnel) bind() portfwd.Bind {
	if t.p == nil || !t.pf.Enabled {
		return portfwd.Bind{}
	}
	return portfwd.Bind{Port: t.p.Port(), TroubleSince: t.p.PortTroubleSince(time.Now()), Notified: t.p.Notified()}
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
			// No provider, no tunnel: DNS is redirected all the same, to
			// PIA's default resolver, where the kill switch holds it
			// back. Without the redirect the VLAN's DNS to the node
			// would be answered by the node's own resolver.
			des.Nft = t.firewall(dev.Name, des.Nft, 0, pia.DefaultDNS)
		default:
			des.WG.Devices[i] = t.p.Device(dev)
			des.Route.Routes = routesWait(des.Route.Routes, des.WG.Devices[i])
			// The port as published now: none once it is lost.
			port := d.portPublisher().Judge(dev.Name, t.bind(), time.Now()).Port
			des.Nft = t.firewall(dev.Name, des.Nft, port, t.p.DNS())
		}
	}
	return des
}

// routesWait is rs without the IPv4 routes through dev while dev has no
// IPv4 address (a PIA device before its registration: a take-over of the
// gateway role, a start). Forwarded traffic routed into the device then
// would be masqueraded to another interface's address, since the device
// has none of its own, and conntrack would keep that for the flow: the
// VLAN's connections stayed stuck after the tunnel came up. Meanwhile
// the kill switch's unreachable route answers them, and nothing is
// masqueraded. (PIA gives no IPv6 address; IPv6 routes are left as the
// config has them.)
func routesWait(rs []route.Route, dev wg.Device) []route.Route {
	if slices.ContainsFunc(dev.Addrs, func(a netip.Prefix) bool { return a.Addr().Is4() }) {
		return rs
	}
	return slices.DeleteFunc(slices.Clone(rs), func(r route.Route) bool {
		return r.Dev == dev.Name && r.To.Addr().Is4()
	})
}

// firewall is n with the tunnel's forwarded port DNATed to pf.to, and
// the DNS of pf.dns sent to its resolver. Without a port (none bound
// yet) nothing is forwarded; DNS is redirected whatever the tunnel's
// state, so that while it is down DNS is dropped by the kill switch
// rather than answered by the node's own resolver.
func (t *piaTunnel) firewall(dev string, n nft.Desired, port int, dns netip.Addr) nft.Desired {
	if port != 0 && t.to.IsValid() {
		to := t.pf.ToPort
		if to == 0 {
			to = port
		}
		n.PortForward = append(slices.Clone(n.PortForward), nft.PortForward{In: dev, Port: uint16(port), To: t.to, ToPort: uint16(to)})
	}
	if len(t.dns) > 0 {
		n.DNS = append(slices.Clone(n.DNS), nft.DNSRedirect{From: t.dns, To: dns})
	}
	return n
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
	// A port judged lost (or bound again) changes the DNAT.
	return d.publishPIA() || changed
}

// handlePIA passes a call's result to the provider that made it.
func (d *Daemon) handlePIA(ctx context.Context, ev pia.Event) bool {
	changed := false
	for _, t := range d.pia {
		if t.p != nil && t.p.Handle(ctx, ev) {
			changed = true
		}
	}
	return d.publishPIA() || changed
}

// kickPIA retries now whatever the providers wait to retry, and every
// port hook whose last run failed or was refused (an operator's reload:
// the runbook's "fix it, then reload").
func (d *Daemon) kickPIA() {
	for _, t := range d.pia {
		if t.p != nil {
			t.p.Kick()
		}
	}
	d.portPublisher().RetryFailed()
}

// standbyPIA puts the PIA providers of the gateway role's devices on
// standby while this node does not hold the role, and takes them off it
// when it does (pia.Provider.SetStandby).
func (d *Daemon) standbyPIA() {
	if d.role == nil {
		return
	}
	want := d.role.Want()
	changed := false
	for name, t := range d.pia {
		if t.p != nil && d.role.Moves(name) && t.p.SetStandby(!want) {
			changed = true
		}
	}
	if changed {
		d.portPublisher().Configure(d.portDevices())
	}
}

// publishPIA puts the providers' state in status, the TunnelHealthy
// condition and the metrics, and publishes their ports; it reports
// whether a published port changed (the DNAT is due for a sync).
func (d *Daemon) publishPIA() bool {
	now := time.Now()
	binds := map[string]portfwd.Bind{}
	for name, t := range d.pia {
		binds[name] = t.bind()
	}
	portChanged := d.portPublisher().Publish(binds, now)
	if len(d.pia) == 0 {
		d.mu.Lock()
		had := d.status.PIA != nil
		d.status.PIA = nil
		d.mu.Unlock()
		if had {
			d.removeCondition(api.CondTunnelHealthy)
		}
		d.publishDelivered(now)
		return portChanged
	}
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
		if !s.Healthy && s.Phase != pia.PhaseStandby {
			// (A standby's tunnel is another node's to run: no fault.)
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
	for i, name := range names {
		ps := d.ports.State(name)
		tu := &tunnels[i]
		tu.ForwardedPort = ps.Port
		tu.PortTroubleSince = nil
		if !ps.TroubleSince.IsZero() {
			at := ps.TroubleSince.UTC()
			tu.PortTroubleSince = &at
		}
		if ps.Lost() {
			tu.PortLost = &api.PortLost{Port: ps.LostPort, Since: ps.LostSince.UTC()}
		}
		tu.PortHook = d.ports.Hook(name)
	}
	d.mu.Lock()
	d.status.PIA = tunnels
	d.mu.Unlock()
	d.publishDelivered(now)
	if len(sick) == 0 {
		d.setCondition(api.CondTunnelHealthy, api.True, "Healthy", fmt.Sprintf("%d PIA tunnel(s) up", len(tunnels)))
	} else {
		d.setCondition(api.CondTunnelHealthy, api.False, reason, strings.Join(sick, "; "))
	}
	d.refreshHealth()
	return portChanged
}

// portDir is where the port files go: beside the API socket, in pia/
// (/run/nodeagent/pia by default); "" when the daemon serves no socket.
func (d *Daemon) portDir() string {
	if d.o.Socket == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(d.o.Socket), "pia")
}

// hookResult tells the loop that a device's hook finished a run; the
// outcome itself is read from the publisher.
type hookResult struct{ device string }

// hookDone takes a finished run of a device's hook: a delivered port is
// saved as such (not delivered again after a restart until every), and
// status, condition and metric follow.
func (d *Daemon) hookDone(r hookResult) {
	t, ok := d.pia[r.device]
	if !ok {
		return
	}
	if port, ok := d.portPublisher().Delivered(r.device); ok && t.p != nil && port == t.p.Port() {
		t.p.SetNotified(port)
	}
	d.publishPIA()
}

// publishDelivered sets the PortDelivered condition from the devices'
// hooks: absent when no device has an onChange.
func (d *Daemon) publishDelivered(now time.Time) {
	c, ok := d.portPublisher().Condition(now)
	switch {
	case ok:
		d.setCondition(c.Type, c.Status, c.Reason, c.Message)
	case d.condition(api.CondPortDelivered) != nil:
		d.removeCondition(api.CondPortDelivered)
	}
}

// piaPorts are the forwarded ports, by device, for the Node annotation:
// the published ones (a lost port is no port).
func (d *Daemon) piaPorts() map[string]int {
	return d.portPublisher().Ports()
}

// portRetryRequest asks for a device's port hook (every device's, with
// device "") to run now: nodeagentctl port --retry.
type portRetryRequest struct {
	device string
	reply  chan<- api.PortRetry
}

func (r portRetryRequest) serve(_ context.Context, d *Daemon) {
	devs, err := d.portPublisher().Retry(r.device)
	out := api.PortRetry{Devices: devs}
	if err != nil {
		out.Error = err.Error()
	} else if len(devs) == 0 {
		out.Error = "no PIA device has a port hook with a port to deliver"
	}
	if len(devs) > 0 {
		d.log.Info("port hook retried on request", "devices", strings.Join(devs, ","))
	}
	r.reply <- out
}

// RetryPortHook implements apiserver.Backend: the port hook of device
// (every device's for "") runs now.
func (d *Daemon) RetryPortHook(ctx context.Context, device string) api.PortRetry {
	r, err := ask(ctx, d, func(reply chan api.PortRetry) request { return portRetryRequest{device, reply} })
	if err != nil {
		return api.PortRetry{Error: err.Error()}
	}
	return r
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
	out.ForwardedPort, out.PortExpires, out.LastBind, out.PortError = s.Port, opt(s.PortExpires), opt(s.LastBind), s.PortError
	if s.DNS.IsValid() {
		out.DNS = s.DNS.String()
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
// nothing is judged here (filecheck says so); the daemon reports it when
// the list arrives.
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
			hint := "nodeagent regions lists them"
			if s := filecheck.SuggestRegion(l, p.Region); s != "" {
				hint = "did you mean " + s + "? (" + hint + ")"
			}
			return fmt.Sprintf("%q is not a region of PIA's server list (cached %s); %s", p.Region, at.UTC().Format("2006-01-02"), hint)
		case p.PortForward.Enabled && !r.PortForward:
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
		// The firewall as the daemon would have it from the saved state:
		// the saved port forwarded.
		t := &piaTunnel{pf: w.PIA.PortForward}
		t.to, _ = netip.ParseAddr(w.PIA.PortForward.To)
		for _, f := range w.PIA.DNS.For {
			if p, err := netip.ParsePrefix(f); err == nil {
				t.dns = append(t.dns, p.Masked())
			}
		}
		port := 0
		if saved.PF != nil && w.PIA.PortForward.Enabled {
			port = saved.PF.Port
		}
		// DNS as a daemon starting now has it: PIA's default resolver
		// until one of the registration's answers through the tunnel.
		des.Nft = t.firewall(dev.Name, des.Nft, port, pia.DefaultDNS)
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
