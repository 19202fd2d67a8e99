package agent

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/nodeagent/nodeagent/netcfg/nft"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/filecheck"
	"github.com/nodeagent/nodeagent/agent/hookrun"
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
	// hook runs onChange; nil without one, or until the loop's first
	// step starts it. It outlives the tunnel across reloads.
	hook *portHook
	// written is the port the port file holds (0: no file; portUnknown:
	// not known, a file of an earlier run may be there).
	written int
}

// portUnknown is piaTunnel.written before the port file was first written
// or removed by this daemon.
const portUnknown = -1

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
// those of devices gone from the config.
func (d *Daemon) setPIA(setups map[string]piaSetup) {
	if d.pia == nil {
		d.pia = map[string]*piaTunnel{}
	}
	for name, t := range d.pia {
		if _, ok := setups[name]; !ok {
			d.stopHook(name, t)
			delete(d.pia, name)
		}
	}
	// Port files of devices that are not PIA devices any more (removed
	// while the daemon ran, or before it started): a reader would take a
	// port that no longer reaches anything.
	d.removeStalePortFiles(setups)
	for name, s := range setups {
		if t, ok := d.pia[name]; ok && t.id == s.id && t.err == nil && s.err == nil {
			// The node's prefixes may have moved; a registration that
			// now takes one of them is given up.
			t.p.SetReserved(s.cfg.Reserved)
			t.pf = s.pf
			continue
		}
		t := &piaTunnel{id: s.id, err: s.err, pf: s.pf, to: s.to, dns: s.dns, written: portUnknown}
		if old, ok := d.pia[name]; ok {
			t.written, t.hook = old.written, old.hook
		}
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
	for name, t := range d.pia {
		d.piaDevices[name] = true
		switch {
		case t.hook == nil:
		case !t.hooked():
			d.stopHook(name, t)
		default:
			t.hook.s.Reconfigure(hookConfig(name, t.pf))
		}
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
			// No provider, no tunnel: DNS is redirected all the same, to
			// PIA's default resolver, where the kill switch holds it
			// back. Without the redirect the VLAN's DNS to the node
			// would be answered by the node's own resolver.
			des.Nft = t.firewall(dev.Name, des.Nft, 0, pia.DefaultDNS)
		default:
			des.WG.Devices[i] = t.p.Device(dev)
			des.Nft = t.firewall(dev.Name, des.Nft, t.p.Port(), t.p.DNS())
		}
	}
	return des
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
		if t.hook == nil && t.hooked() {
			d.startHook(ctx, name, t)
		}
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

// standbyPIA puts the PIA providers of the gateway role's devices on
// standby while this node does not hold the role, and takes them off it
// when it does (pia.Provider.SetStandby).
func (d *Daemon) standbyPIA() {
	if d.role == nil {
		return
	}
	want := d.role.Want()
	for name, t := range d.pia {
		if t.p != nil && d.role.Moves(name) {
			t.p.SetStandby(!want)
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
		d.publishDelivered(nil)
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
		d.publishPort(name, d.pia[name], now)
		tunnels[i].PortHook = d.pia[name].hookStatus()
	}
	d.mu.Lock()
	d.status.PIA = tunnels
	d.mu.Unlock()
	d.publishDelivered(names)
	if len(sick) == 0 {
		d.setCondition(api.CondTunnelHealthy, api.True, "Healthy", fmt.Sprintf("%d PIA tunnel(s) up", len(tunnels)))
	} else {
		d.setCondition(api.CondTunnelHealthy, api.False, reason, strings.Join(sick, "; "))
	}
	d.refreshHealth()
}

// portDir is where the port files go: beside the API socket, in pia/
// (/run/nodeagent/pia by default); "" when the daemon serves no socket.
func (d *Daemon) portDir() string {
	if d.o.Socket == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(d.o.Socket), "pia")
}

// publishPort keeps the port's file and metric current and gives the
// port hook the state to deliver. The file holds the forwarded port while
// there is one; without one (port forwarding off, no provider) there is
// no file.
func (d *Daemon) publishPort(name string, t *piaTunnel, now time.Time) {
	port := 0
	if t.p != nil && t.pf.Enabled {
		port = t.p.Port()
		// 0 while none is bound: an alert can tell "port forwarding on,
		// no port" from a device that never forwards one.
		d.metrics.SetForwardedPort(name, port)
	}
	if dir := d.portDir(); dir != "" && port != t.written {
		var err error
		if port == 0 {
			err = removePortFile(dir, name)
		} else if err = os.MkdirAll(dir, 0o755); err == nil {
			err = fsafe.WriteFile(filepath.Join(dir, name+".port"), []byte(strconv.Itoa(port)+"\n"), 0o644)
		}
		if err != nil {
			d.log.Warn("writing the forwarded port's file", "device", name, "err", err)
		} else {
			t.written = port
		}
	}
	if t.hook == nil || port == 0 {
		return
	}
	// Measured from the last good bind, or from the hook's start when
	// this daemon has not bound yet (a restart with a saved port).
	s := t.p.Status()
	failing := s.PortError != "" || !s.Healthy
	lost := failing && now.Sub(latest(s.LastBind, t.hook.started)) > portLostAfter
	t.hook.want(port, lost)
}

// portFileExt ends a port file's name: DEVICE.port.
const portFileExt = ".port"

// removePortFile removes dev's port file from dir; none is no error.
func removePortFile(dir, dev string) error {
	err := os.Remove(filepath.Join(dir, dev+portFileExt))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// removeStalePortFiles removes the port files of devices that are not in
// setups (the PIA devices of the config just loaded).
func (d *Daemon) removeStalePortFiles(setups map[string]piaSetup) {
	dir := d.portDir()
	if dir == "" {
		return
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), portFileExt)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if _, ok := setups[name]; ok {
			continue
		}
		if err := removePortFile(dir, name); err != nil {
			d.log.Warn("removing the port file of a device that is gone", "device", name, "err", err)
		} else {
			d.log.Info("removed the port file of a device that is no PIA device now", "device", name)
		}
	}
}

// RemovePortFiles removes every port file in dir (teardown: no device
// forwards a port any more); a missing dir is no error.
func RemovePortFiles(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), portFileExt); ok && e.Type().IsRegular() {
			errs = append(errs, removePortFile(dir, name))
		}
	}
	return errors.Join(errs...)
}

// portLostAfter is how long port forwarding may fail (binds refused,
// the tunnel down) after the last good bind before the port counts as
// lost and the hook is told so: PIA's own bind interval, after which the
// server may give the port away.
const portLostAfter = 15 * time.Minute

// portHook is a PIA device's onChange: its scheduler, and the state it
// was last given.
type portHook struct {
	s   *hookrun.Scheduler
	st  hookrun.State
	has bool
	// started is when this daemon started the hook.
	started time.Time
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// want gives the hook the device's port (the last bound, lost or not).
// NODEAGENT_PIA_PREVIOUS_PORT is the last bound port before this one (0
// when none): for a lost port the port lost; for a port bound again
// after it was lost, the port lost.
func (h *portHook) want(port int, lost bool) {
	st := hookrun.State{Port: port}
	switch {
	case lost && h.has && h.st.Lost:
		st = h.st
	case lost:
		st = hookrun.State{Previous: port, Lost: true}
	case !h.has:
	case h.st.Lost:
		st.Previous = h.st.Previous
	case h.st.Port != port:
		st.Previous = h.st.Port
	default:
		st = h.st
	}
	if h.has && st == h.st {
		return
	}
	h.st, h.has = st, true
	h.s.Set(st)
}

// hookConfig is the scheduler's config for a device's portForward.
func hookConfig(name string, pf config.PortForward) hookrun.Config {
	return hookrun.Config{Device: name, Argv: slices.Clone(pf.OnChange), Timeout: pf.HookTimeoutOrDefault(), Every: pf.HookEvery()}
}

// hookResult tells the loop that a device's hook finished a run; the
// outcome itself is read from the scheduler.
type hookResult struct{ device string }

// startHook starts a device's port hook for the daemon's lifetime (ctx).
// A port the hook delivered before a restart (the provider's saved
// Notified) is not delivered again before every.
func (d *Daemon) startHook(ctx context.Context, name string, t *piaTunnel) {
	var delivered *hookrun.State
	h := &portHook{started: time.Now()}
	if t.p != nil && t.p.Port() != 0 && t.p.Notified() == t.p.Port() {
		h.st, h.has = hookrun.State{Port: t.p.Port()}, true
		delivered = &h.st
	}
	log := d.log.With("device", name)
	h.s = hookrun.Start(ctx, hookConfig(name, t.pf), delivered, func(o hookrun.Outcome) {
		r := o.Result
		d.metrics.PortHookRan(name, r.Outcome())
		attrs := []any{"port", o.State.Port, "previous_port", o.State.Previous, "lost", o.State.Lost, "attempt", o.Attempt,
			"took", r.Took.Round(time.Millisecond), "exit", r.ExitStatus(), "output", r.Output}
		if r.OK() {
			log.Info("port hook delivered", attrs...)
		} else {
			log.Error("port hook failed; retried with backoff", append(attrs, "err", r.Err)...)
		}
		// Never blocks: a full channel already has the loop look again.
		select {
		case d.hookEv <- hookResult{device: name}:
		default:
		}
	})
	t.hook = h
	d.metrics.StartPortHook(name)
}

// stopHook stops a device's port hook (a run under way is killed) and
// drops its series.
func (d *Daemon) stopHook(name string, t *piaTunnel) {
	if t.hook == nil {
		return
	}
	t.hook.s.Stop()
	t.hook = nil
	d.metrics.StopPortHook(name)
}

// hookDone takes a finished run of a device's hook: a delivered port is
// saved as such (not delivered again after a restart until every), and
// status, condition and metric follow.
func (d *Daemon) hookDone(r hookResult) {
	t, ok := d.pia[r.device]
	if !ok || t.hook == nil {
		return
	}
	if st := t.hook.s.Status(); t.p != nil && st.Delivered && !st.Want.Lost && st.Want.Port == t.p.Port() {
		t.p.SetNotified(st.Want.Port)
	}
	d.publishPIA()
}

// hooked reports whether the device has a port hook to run.
func (t *piaTunnel) hooked() bool { return t.pf.Enabled && len(t.pf.OnChange) > 0 }

// hookStatus is the hook's state for status; nil without onChange.
func (t *piaTunnel) hookStatus() *api.PortHook {
	if !t.hooked() {
		return nil
	}
	if t.hook == nil {
		return &api.PortHook{}
	}
	st := t.hook.s.Status()
	h := &api.PortHook{Port: st.Want.Port, Lost: st.Want.Lost, Delivered: st.Delivered, Running: st.Running, Attempts: st.Failures}
	if !st.Last.Start.IsZero() {
		at := st.Last.Start.UTC()
		h.LastRun, h.LastExit, h.LastError = &at, st.Last.ExitStatus(), st.Last.FirstLine()
	}
	if !st.Next.IsZero() {
		at := st.Next.UTC()
		h.NextRun = &at
	}
	return h
}

// publishDelivered sets the PortDelivered condition and metric from the
// hooks of names (sorted): absent when no device has an onChange.
func (d *Daemon) publishDelivered(names []string) {
	var failed, pending, ok []string
	for _, name := range names {
		t := d.pia[name]
		h := t.hookStatus()
		if h == nil {
			continue
		}
		if t.hook != nil {
			d.metrics.SetPortDelivered(name, h.Delivered)
		}
		what := fmt.Sprintf("%s: port %d", name, h.Port)
		if h.Lost {
			what = fmt.Sprintf("%s: port lost (was %d)", name, t.hook.st.Previous)
		}
		switch {
		case t.hook == nil || !t.hook.has:
			pending = append(pending, name+": no port bound yet")
		case h.Delivered:
			ok = append(ok, what)
		case h.Attempts > 0:
			failed = append(failed, fmt.Sprintf("%s: %s (%d attempts)", what, h.LastError, h.Attempts))
		case h.Running:
			pending = append(pending, what+": the hook runs")
		default:
			pending = append(pending, what+": the hook is due")
		}
	}
	switch {
	case len(failed)+len(pending)+len(ok) == 0:
		if d.condition(api.CondPortDelivered) != nil {
			d.removeCondition(api.CondPortDelivered)
		}
	case len(failed) > 0:
		d.setCondition(api.CondPortDelivered, api.False, "HookFailed", strings.Join(append(failed, pending...), "; "))
	case len(pending) > 0:
		d.setCondition(api.CondPortDelivered, api.False, "Pending", strings.Join(pending, "; "))
	default:
		d.setCondition(api.CondPortDelivered, api.True, "Delivered", strings.Join(ok, "; "))
	}
}

// piaPorts are the forwarded ports, by device, for the Node annotation.
func (d *Daemon) piaPorts() map[string]int {
	out := map[string]int{}
	for name, t := range d.pia {
		if t.p != nil && t.p.Port() != 0 {
			out[name] = t.p.Port()
		}
	}
	return out
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
