package portfwd

import (
	"context"
	"slices"
	"time"

	"github.com/nodeagent/nodeagent/agent/hookrun"
)

// hook is a device's onChange: its scheduler, and the state it was last
// given.
type hook struct {
	s   *hookrun.Scheduler
	st  hookrun.State
	has bool
}

// want gives the hook the device's port (the last bound, lost or not).
// NODEAGENT_PIA_PREVIOUS_PORT is the last bound port before this one (0
// when none): for a lost port the port lost; for a port bound again
// after it was lost, the port lost.
func (h *hook) want(port int, lost bool) {
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

// lastRefused reports whether the hook's last run was refused.
func (h *hook) lastRefused() bool { return h.s.Status().Last.Refused() }

// hookConfig is the scheduler's config for a device's hook.
func (m *Manager) hookConfig(name string, d Device) hookrun.Config {
	t := m.o.Hooks
	return hookrun.Config{Device: name, Argv: slices.Clone(d.Argv), Timeout: d.Timeout, Every: d.Every,
		BackoffMin: t.BackoffMin, BackoffMax: t.BackoffMax, RefusedWait: t.RefusedWait, RefusedMax: t.RefusedMax}
}

// startHook starts a device's hook for ctx's lifetime. A port the hook
// delivered before a restart (b.Notified, saved) is not delivered again
// before every.
func (m *Manager) startHook(ctx context.Context, name string, d Device, b Bind) *hook {
	var delivered *hookrun.State
	h := &hook{}
	if b.Port != 0 && b.Notified == b.Port {
		h.st, h.has = hookrun.State{Port: b.Port}, true
		delivered = &h.st
	}
	log := m.o.Log.With("device", name)
	h.s = hookrun.Start(ctx, m.hookConfig(name, d), delivered, func(o hookrun.Outcome) {
		r := o.Result
		m.o.Metrics.PortHookRan(name, r.Outcome())
		attrs := []any{"port", o.State.Port, "previous_port", o.State.Previous, "lost", o.State.Lost, "attempt", o.Attempt,
			"took", r.Took.Round(time.Millisecond), "exit", r.ExitStatus(), "output", r.Output}
		switch {
		case o.Stale:
			log.Info("port hook of the replaced command ended; the new command runs now", attrs...)
		case r.OK():
			log.Info("port hook delivered", attrs...)
		case o.Held:
			log.Error("port hook: credentials refused again; no more automatic attempts until nodeagentctl port --retry or a reload", append(attrs, "err", r.Err)...)
		case r.Refused():
			log.Error("port hook: credentials refused; next attempt no sooner than the refusal's wait", append(attrs, "err", r.Err)...)
		default:
			log.Error("port hook failed; retried with backoff", append(attrs, "err", r.Err)...)
		}
		if m.o.Ran != nil {
			m.o.Ran(name)
		}
	})
	m.o.Metrics.StartPortHook(name)
	return h
}

// stopHook stops a device's hook (a run under way is killed) and drops
// its series.
func (m *Manager) stopHook(name string, d *device) {
	if d.hook == nil {
		return
	}
	d.hook.s.Stop()
	d.hook = nil
	m.o.Metrics.StopPortHook(name)
}
