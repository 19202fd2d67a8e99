// Package portfwd publishes the ports PIA forwards to the node: it judges
// whether a device's port is still kept or lost, and keeps everything
// that carries the port to its consumers in step with that judgement: the
// port file (DIR/DEVICE.port), the nodeagent_forwarded_port metric (and
// so GET /v1/portforward), the status, and the device's onChange hook
// (hookrun). The DNAT is the firewall's: the daemon builds it from Port.
//
// A port is lost once it has not been kept bound for LostAfter (15 min,
// PIA's own bind interval) since its trouble began: binds refused, the
// tunnel down, a bind due and none good (netcfg/wg/pia's
// PortTroubleSince, which a restart keeps). A lost port is closed
// everywhere (no DNAT, no file, the metric at 0, the endpoint at 0, the
// hook told with NODEAGENT_PIA_PORT_LOST=1); a port bound again opens all
// of it again. Port forwarding turned off, or the device gone, clears the
// metric's series and the file at once.
//
// The Manager is the loop's: only the loop goroutine calls it.
package portfwd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/metrics"
)

// DefaultLostAfter is how long a port may go unkept before it counts as
// lost: PIA removes a port not bound again within 15 minutes.
const DefaultLostAfter = 15 * time.Minute

// Device is one PIA device's port forwarding as the config asks it.
type Device struct {
	// Enabled: the device asks PIA for a port.
	Enabled bool
	// Argv is onChange (nil: no hook), with its timeout and period.
	Argv    []string
	Timeout time.Duration
	Every   time.Duration
}

func (d Device) hooked() bool { return d.Enabled && len(d.Argv) > 0 }

// Bind is what a device's provider says of its port.
type Bind struct {
	// Port is the port last bound (0: none yet, or no provider runs).
	Port int
	// TroubleSince is when the port stopped being kept bound; zero while
	// it is.
	TroubleSince time.Time
	// Notified is the port a hook delivered before a restart (saved).
	Notified int
}

// State is a device's port as published.
type State struct {
	// Port is the port the DNAT, the file, the metric and the endpoint
	// carry: 0 without one, or once it is lost.
	Port int
	// LostPort is the port lost (0: none lost); LostSince when it was
	// judged lost, TroubleSince when its trouble began.
	LostPort     int
	LostSince    time.Time
	TroubleSince time.Time
}

// Lost reports whether the device's port was lost.
func (s State) Lost() bool { return s.LostPort != 0 }

// HookTimers are what tests shorten of a hook's schedule (zero fields:
// hookrun's defaults, which the product keeps).
type HookTimers struct {
	BackoffMin, BackoffMax time.Duration
	RefusedWait            time.Duration
	RefusedMax             int
}

// Options are a Manager's.
type Options struct {
	// Dir holds the port files; "" writes none (a daemon without a
	// socket, in tests).
	Dir string
	// LostAfter is the bound of a port's trouble (DefaultLostAfter; a
	// test shortens it, the product does not).
	LostAfter time.Duration
	Metrics   *metrics.Metrics
	Log       *slog.Logger
	Hooks     HookTimers
	// Ran is called after each run of a device's hook, from the hook's
	// goroutine: it must not block.
	Ran func(device string)
}

// Manager publishes the ports of the PIA devices.
type Manager struct {
	o Options
	// ctx is what the hooks run under (Start); nil: no hook starts yet.
	ctx  context.Context
	devs map[string]*device
	// files is what the port files are known to hold (nil: not known,
	// read them before the next change).
	files Files
	// filesErr is why the port files could not be brought in line (nil
	// once they were): a port not delivered, for the condition.
	filesErr error
	// metric: the devices with a forwarded_port series.
	metric map[string]bool
}

type device struct {
	cfg   Device
	state State
	hook  *hook
}

// New returns a Manager.
func New(o Options) *Manager {
	if o.LostAfter <= 0 {
		o.LostAfter = DefaultLostAfter
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New()
	}
	return &Manager{o: o, devs: map[string]*device{}, metric: map[string]bool{}}
}

// Start lets the hooks run, for ctx's lifetime: the daemon's. Before it
// (the start-up's first load) ports are judged and published but no hook
// runs.
func (m *Manager) Start(ctx context.Context) { m.ctx = ctx }

// Configure takes the config's PIA devices: a device gone, or whose port
// forwarding was turned off, loses its series and its file at once (the
// next Publish removes the file) and its hook; a changed hook is
// reconfigured (a new command runs at once).
func (m *Manager) Configure(devs map[string]Device) {
	for name, d := range m.devs {
		nd, ok := devs[name]
		if !ok || !nd.hooked() {
			m.stopHook(name, d)
		}
		if !ok || !nd.Enabled {
			m.clearMetric(name)
			d.state = State{}
		}
		if !ok {
			delete(m.devs, name)
		}
	}
	for name, nd := range devs {
		d, ok := m.devs[name]
		if !ok {
			d = &device{}
			m.devs[name] = d
		}
		d.cfg = nd
		if d.hook != nil {
			d.hook.s.Reconfigure(m.hookConfig(name, nd))
		}
	}
}

func (m *Manager) clearMetric(name string) {
	if m.metric[name] {
		m.o.Metrics.ClearForwardedPort(name)
		delete(m.metric, name)
	}
}

// Judge is dev's port as bound by b, judged at now: lost once its trouble
// lasted LostAfter. It changes nothing.
func (m *Manager) Judge(name string, b Bind, now time.Time) State {
	d, ok := m.devs[name]
	if !ok || !d.cfg.Enabled || b.Port == 0 {
		return State{}
	}
	s := State{Port: b.Port, TroubleSince: b.TroubleSince}
	if !b.TroubleSince.IsZero() && now.Sub(b.TroubleSince) >= m.o.LostAfter {
		s.Port, s.LostPort, s.LostSince = 0, b.Port, b.TroubleSince.Add(m.o.LostAfter)
	}
	return s
}

// Port is the port to DNAT for dev as published (0: none).
func (m *Manager) Port(name string) int {
	if d, ok := m.devs[name]; ok {
		return d.state.Port
	}
	return 0
}

// State is dev's port as published.
func (m *Manager) State(name string) State {
	if d, ok := m.devs[name]; ok {
		return d.state
	}
	return State{}
}

// Publish judges every configured device's port from binds (a device
// without an entry has no port) at now, and brings the port files, the
// metric and the hooks in line. It reports whether a published port
// changed (the DNAT is due for a sync).
func (m *Manager) Publish(binds map[string]Bind, now time.Time) bool {
	changed := false
	for _, name := range slices.Sorted(maps.Keys(m.devs)) {
		d := m.devs[name]
		b := binds[name]
		s := m.Judge(name, b, now)
		if s.Port != d.state.Port {
			changed = true
		}
		switch {
		case s.Lost() && !d.state.Lost():
			m.o.Log.Warn("forwarded port lost: closed (DNAT, port file, metric) and the hook told", "device", name, "port", s.LostPort,
				"trouble_since", s.TroubleSince.UTC().Format(time.RFC3339), "after", m.o.LostAfter)
		case d.state.Lost() && !s.Lost() && s.Port != 0:
			m.o.Log.Info("forwarded port bound again after it was lost", "device", name, "port", s.Port, "lost", d.state.LostPort)
		}
		d.state = s
		if d.cfg.Enabled {
			m.o.Metrics.SetForwardedPort(name, s.Port)
			m.metric[name] = true
		}
		if d.cfg.hooked() && m.ctx != nil {
			if d.hook == nil {
				d.hook = m.startHook(m.ctx, name, d.cfg, b)
			}
			if b.Port != 0 {
				d.hook.want(b.Port, s.Lost())
			}
		}
	}
	m.publishFiles()
	return changed
}

// publishFiles brings the port files in line with the published ports;
// the directory is read again only when they are to change (or after a
// failed write).
func (m *Manager) publishFiles() {
	if m.o.Dir == "" {
		return
	}
	want := Files{}
	for name, d := range m.devs {
		if d.state.Port != 0 {
			want[name] = d.state.Port
		}
	}
	if m.files != nil && maps.Equal(want, m.files) {
		return
	}
	have, err := ObserveFiles(m.o.Dir)
	if err != nil {
		m.o.Log.Warn("reading the forwarded ports' files", "dir", m.o.Dir, "err", err)
		m.files, m.filesErr = nil, fmt.Errorf("reading the port files in %s: %w", m.o.Dir, err)
		return
	}
	ops := MakeFilesPlan(want, have)
	for _, op := range ops {
		if _, ok := m.devs[op.Device]; !ok && op.Port == 0 {
			m.o.Log.Info("removed the port file of a device that is no PIA device now", "device", op.Device)
		}
	}
	reached, err := ApplyFiles(m.o.Dir, have, ops)
	if err != nil {
		m.o.Log.Warn("writing the forwarded ports' files", "err", err)
		m.files, m.filesErr = nil, err
		return
	}
	m.files, m.filesErr = reached, nil
}

// Ports are the published ports by device (for the Node's annotation).
func (m *Manager) Ports() map[string]int {
	out := map[string]int{}
	for name, d := range m.devs {
		if d.state.Port != 0 {
			out[name] = d.state.Port
		}
	}
	return out
}

// Stop stops every hook, killing a run under way (its process group,
// SIGTERM then SIGKILL); Wait waits for them.
func (m *Manager) Stop() {
	for _, d := range m.devs {
		if d.hook != nil {
			d.hook.s.Stop()
		}
	}
}

// Wait waits up to d for every stopped hook to be over; it reports
// whether they all are.
func (m *Manager) Wait(d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for _, dev := range m.devs {
		if dev.hook == nil {
			continue
		}
		select {
		case <-dev.hook.s.Done():
		case <-deadline.C:
			return false
		}
	}
	return true
}

// ErrNoHook is Retry's error for a device without a hook to run.
var ErrNoHook = errors.New("no portForward.onChange to run")

// Retry runs the hook of device name now (every device's with name "")
// for the port it has, lifting a refusal's wait or hold: the operator
// says the cause is fixed. It returns the devices whose hook was
// scheduled.
func (m *Manager) Retry(name string) ([]string, error) {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(m.devs)) {
		if name != "" && n != name {
			continue
		}
		d := m.devs[n]
		if d.hook == nil {
			if name != "" {
				return nil, fmt.Errorf("%s: %w", n, ErrNoHook)
			}
			continue
		}
		if d.hook.s.Retry(false) {
			out = append(out, n)
		}
	}
	if name != "" {
		if _, ok := m.devs[name]; !ok {
			return nil, fmt.Errorf("%s is not a PIA device", name)
		}
	}
	return out, nil
}

// RetryFailed runs now every hook whose last run failed or was refused
// (an operator's reload: the runbook's "fix it, then reload").
func (m *Manager) RetryFailed() {
	for name, d := range m.devs {
		if d.hook != nil && d.hook.s.Retry(true) {
			m.o.Log.Info("port hook retried for the reload", "device", name)
		}
	}
}

// Delivered is the hook's delivered state for SetNotified: the port the
// device's hook last delivered, when that is the device's current,
// unlost port.
func (m *Manager) Delivered(name string) (int, bool) {
	d, ok := m.devs[name]
	if !ok || d.hook == nil {
		return 0, false
	}
	st := d.hook.s.Status()
	if st.Delivered && !st.Want.Lost && st.Want.Port != 0 && st.Want.Port == d.state.Port {
		return st.Want.Port, true
	}
	return 0, false
}

// Hook is dev's hook's state for status; nil without onChange.
func (m *Manager) Hook(name string) *api.PortHook {
	d, ok := m.devs[name]
	if !ok || !d.cfg.hooked() {
		return nil
	}
	if d.hook == nil {
		return &api.PortHook{}
	}
	st := d.hook.s.Status()
	h := &api.PortHook{Port: st.Want.Port, Lost: st.Want.Lost, Delivered: st.Delivered, Running: st.Running, Attempts: st.Failures,
		Refused: st.Refused, Held: st.Held}
	if st.Want.Lost {
		h.LostPort = st.Want.Previous
	}
	if !st.Last.Start.IsZero() {
		at := st.Last.Start.UTC()
		h.LastRun, h.LastExit, h.LastError = &at, st.Last.ExitStatus(), st.Last.FirstLine()
		took := st.Last.Took.Round(time.Millisecond).Seconds()
		h.LastTookSeconds = &took
	}
	if !st.Next.IsZero() {
		at := st.Next.UTC()
		h.NextRun = &at
	}
	return h
}

// Condition is the PortDelivered condition over the devices with a hook
// and the port files: ok false when no device has a hook and the files
// were written (the condition is absent). A delivery that failed (the
// hook exited non-zero, timed out or had its credentials refused; a port
// file not written) is False, which degrades the node; nothing to deliver
// yet (no port bound, the first run for it due or running) is Unknown,
// which does not.
func (m *Manager) Condition(now time.Time) (c api.Condition, ok bool) {
	var refused, failed, pending, done []string
	fileFailed := m.filesErr != nil
	if fileFailed {
		failed = append(failed, "port files: "+strings.ReplaceAll(m.filesErr.Error(), "\n", "; "))
	}
	for _, name := range slices.Sorted(maps.Keys(m.devs)) {
		d := m.devs[name]
		h := m.Hook(name)
		if h == nil {
			continue
		}
		if d.hook != nil {
			m.o.Metrics.SetPortDelivered(name, h.Delivered)
		}
		what := fmt.Sprintf("%s: port %d", name, h.Port)
		if h.Lost {
			what = fmt.Sprintf("%s: port lost (was %d)", name, h.LostPort)
		}
		switch {
		case d.hook == nil || !d.hook.has:
			pending = append(pending, name+": no port bound yet")
		case h.Delivered:
			done = append(done, what)
		case h.Held:
			refused = append(refused, fmt.Sprintf("%s: credentials refused %d times in a row (%s); no automatic attempt until they are fixed and `nodeagentctl port --retry` (or a reload) runs the hook", what, h.Refused, h.LastError))
		case h.Refused > 0 && d.hook.lastRefused():
			next := ""
			if h.NextRun != nil {
				next = fmt.Sprintf("; next attempt in %s", h.NextRun.Sub(now).Round(time.Second))
			}
			refused = append(refused, fmt.Sprintf("%s: credentials refused (%s)%s", what, h.LastError, next))
		case h.Attempts > 0:
			failed = append(failed, fmt.Sprintf("%s: %s (%d attempts)", what, h.LastError, h.Attempts))
		case h.Running:
			pending = append(pending, what+": the hook runs")
		default:
			pending = append(pending, what+": the hook is due")
		}
	}
	switch {
	case len(refused)+len(failed)+len(pending)+len(done) == 0:
		return api.Condition{}, false
	case len(refused) > 0:
		return api.Condition{Type: api.CondPortDelivered, Status: api.False, Reason: "CredentialsRefused", Message: strings.Join(slices.Concat(refused, failed, pending), "; ")}, true
	case len(failed) == 1 && fileFailed:
		return api.Condition{Type: api.CondPortDelivered, Status: api.False, Reason: "PortFileFailed", Message: strings.Join(append(failed, pending...), "; ")}, true
	case len(failed) > 0:
		return api.Condition{Type: api.CondPortDelivered, Status: api.False, Reason: "HookFailed", Message: strings.Join(append(failed, pending...), "; ")}, true
	case len(pending) > 0:
		return api.Condition{Type: api.CondPortDelivered, Status: api.Unknown, Reason: "Pending", Message: strings.Join(pending, "; ")}, true
	}
	return api.Condition{Type: api.CondPortDelivered, Status: api.True, Reason: "Delivered", Message: strings.Join(done, "; ")}, true
}
