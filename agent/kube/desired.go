package kube

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/peerlive"
)

// track is one conditional label's hysteresis state: the condition as last
// observed (raw) and the label's state on the Node (effective), which
// follows raw only once raw has stayed put for the hold time.
type track struct {
	when string
	// raw is the condition; rawSince is when it last changed.
	raw, rawKnown bool
	rawSince      time.Time
	// eff reports whether the label is in the desired set. It starts
	// unknown and is taken from the Node (does nodeagent own the label?)
	// at the first successful read, so a restarted agent does not remove
	// and re-add a label while its conditions settle.
	eff, effKnown bool
}

// hysteresis is the tracks by label key.
type hysteresis map[string]*track

// configure makes h track exactly cls. A label whose When is unchanged
// keeps its state; a new or changed one starts over.
func (h hysteresis) configure(cls []config.ConditionalLabel) {
	keep := map[string]bool{}
	for _, cl := range cls {
		keep[cl.Key] = true
		if t, ok := h[cl.Key]; !ok || t.when != cl.When {
			h[cl.Key] = &track{when: cl.When}
		}
	}
	for k := range h {
		if !keep[k] {
			delete(h, k)
		}
	}
}

// observe records the conditions seen at at. A condition missing from
// conds is false: the daemon reports only what exists.
func (h hysteresis) observe(conds map[string]bool, at time.Time) {
	for _, t := range h {
		v := conds[t.when]
		if !t.rawKnown || v != t.raw {
			t.raw, t.rawKnown, t.rawSince = v, true, at
		}
	}
}

// needsInit reports whether a track has not learnt the Node's state yet.
func (h hysteresis) needsInit() bool {
	for _, t := range h {
		if !t.effKnown {
			return true
		}
	}
	return false
}

// init sets the effective state of the tracks that have none from the
// labels nodeagent owns on the Node.
func (h hysteresis) init(owned map[string]bool) {
	for k, t := range h {
		if !t.effKnown {
			t.eff, t.effKnown = owned[k], true
		}
	}
}

// settle moves each effective state to its condition once the condition
// has held for hold, and returns the earliest time a pending change is due,
// or the zero time.
func (h hysteresis) settle(now time.Time, hold time.Duration) time.Time {
	var next time.Time
	for _, t := range h {
		if !t.effKnown || !t.rawKnown || t.raw == t.eff {
			continue
		}
		due := t.rawSince.Add(hold)
		if !now.Before(due) {
			t.eff = t.raw
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return next
}

// desired is what nodeagent applies to its Node.
type desired struct {
	Labels      map[string]string
	Annotations map[string]string
}

func (d desired) equal(o desired) bool {
	return maps.Equal(d.Labels, o.Labels) && maps.Equal(d.Annotations, o.Annotations)
}

// desiredState returns what cfg and s ask for, with h's effective states;
// a label whose state is not known yet is left out. A disabled config asks
// for nothing, which removes everything nodeagent applied before.
func desiredState(cfg Config, s Snapshot, h hysteresis) desired {
	d := desired{Labels: map[string]string{}, Annotations: map[string]string{}}
	if !cfg.Enabled {
		return d
	}
	maps.Copy(d.Labels, cfg.Labels)
	for _, cl := range cfg.Conditional {
		if t := h[cl.Key]; t != nil && t.effKnown && t.eff {
			d.Labels[cl.Key] = cl.Value
		}
	}
	if sum := summary(s.Summary); sum != "" {
		d.Annotations[AnnotationStatus] = sum
	}
	if v := piaPorts(s.PIAPorts); v != "" {
		d.Annotations[AnnotationPIAPort] = v
	}
	if len(cfg.WireGuardServers) > 0 {
		list, total := wireGuardLive(cfg.WireGuardServers, s.WireGuard, s.At)
		d.Annotations[AnnotationWireGuardLive] = list
		d.Annotations[AnnotationWireGuardLivePeers] = strconv.Itoa(total)
	}
	return d
}

// piaPorts is AnnotationPIAPort's value for ports, "" for none.
func piaPorts(ports map[string]int) string {
	devs := slices.Sorted(maps.Keys(ports))
	switch len(devs) {
	case 0:
		return ""
	case 1:
		return strconv.Itoa(ports[devs[0]])
	}
	parts := make([]string, len(devs))
	for i, d := range devs {
		parts[i] = d + "=" + strconv.Itoa(ports[d])
	}
	return strings.Join(parts, ",")
}

// summary is s on one line, cut to maxSummary bytes without splitting a
// character.
func summary(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxSummary {
		return s
	}
	return strings.ToValidUTF8(s[:maxSummary], "")
}

// wireGuardLive formats the live peers of the server devices, "wg0=2/5"
// sorted by name and joined with ",", and sums them. A server missing from
// devs (not created yet) counts 0/0.
func wireGuardLive(servers []string, devs []api.WireGuardDevice, at time.Time) (string, int) {
	names := slices.Clone(servers)
	slices.Sort(names)
	var parts []string
	total := 0
	for _, n := range names {
		live, all := 0, 0
		if i := slices.IndexFunc(devs, func(d api.WireGuardDevice) bool { return d.Name == n }); i >= 0 {
			for _, p := range devs[i].Peers {
				all++
				if peerLive(p, at) {
					live++
				}
			}
		}
		total += live
		parts = append(parts, fmt.Sprintf("%s=%d/%d", n, live, all))
	}
	return strings.Join(parts, ","), total
}

// peerLive reports whether p has an endpoint and a handshake younger than
// peerlive.Stale at at. The handshake time is re-checked against at, so
// an observation handed in late does not overstate liveness; without
// either time, p.Live as observed counts.
func peerLive(p api.WireGuardPeer, at time.Time) bool {
	if p.LastHandshake == nil || at.IsZero() {
		return p.Live
	}
	return peerlive.Live(p.Endpoint != "", *p.LastHandshake, at)
}
