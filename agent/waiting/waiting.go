// Package waiting follows the objects that wait for a link the config
// does not create: a parent NIC that is not there yet (a late driver, udev
// still renaming it) or one that never will be (a typo, a NIC that died).
// A short wait is normal at boot; a long one is a fault that must not read
// as ready.
package waiting

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// DefaultBound is how long objects may wait for a link the config does not
// create before the node is degraded for it.
const DefaultBound = 30 * time.Second

// maxObjects bounds the objects one Wait names in its text.
const maxObjects = 5

// Wait is the objects that wait for one missing link.
type Wait struct {
	// Missing is the link waited for.
	Missing string
	// Objects name what waits for it, as the plan names them.
	Objects []string
	// Since is when the wait began (the first sync that found it).
	Since time.Time
	// Over: the wait has lasted longer than the bound.
	Over bool
	// Suggest is an existing link whose name is a plausible typo of
	// Missing's, or "".
	Suggest string
}

// String says what waits, for what, how long, and what was perhaps meant.
func (w Wait) String() string {
	objs := w.Objects
	more := ""
	if len(objs) > maxObjects {
		more = fmt.Sprintf(" and %d more", len(objs)-maxObjects)
		objs = objs[:maxObjects]
	}
	s := fmt.Sprintf("%s%s wait(s) for %s, which does not exist and which the config does not create", strings.Join(objs, ", "), more, w.Missing)
	if w.Suggest != "" {
		s += fmt.Sprintf("; did you mean %s?", w.Suggest)
	}
	return s
}

// Tracker remembers since when each missing link has been waited for.
// Only the loop goroutine uses it.
type Tracker struct {
	// Bound is how long a wait may last before it is Over.
	Bound time.Duration
	since map[string]time.Time
	// warned holds the waits already reported as over, so that each is
	// logged once, not at every sync.
	warned map[string]bool
}

// Update takes one sync's report. creates says whether the config makes a
// link of that name (a wait for one is a step of the sync, not a fault);
// links lists the names of the links the node has, for suggestions; it is
// called at most once, and only when a wait is over the bound. It
// returns every current wait for a link the config does not create,
// sorted by the missing name, and those that went over the bound since
// the last Update (to be logged once).
func (t *Tracker) Update(now time.Time, rep plan.Report, creates func(string) bool, links func() []string) (waits, newlyOver []Wait) {
	byMissing := collect(rep, creates)
	if t.since == nil {
		t.since, t.warned = map[string]time.Time{}, map[string]bool{}
	}
	for m := range t.since {
		if _, still := byMissing[m]; !still {
			delete(t.since, m)
			delete(t.warned, m)
		}
	}
	bound := t.Bound
	if bound <= 0 {
		bound = DefaultBound
	}
	var names []string
	listed := false
	for _, m := range slices.Sorted(maps.Keys(byMissing)) {
		since, ok := t.since[m]
		if !ok {
			since = now
			t.since[m] = now
		}
		w := Wait{Missing: m, Objects: byMissing[m], Since: since, Over: now.Sub(since) >= bound}
		if w.Over {
			if !listed {
				names, listed = links(), true
			}
			w.Suggest = config.Suggest(m, names)
			if !t.warned[m] {
				t.warned[m] = true
				newlyOver = append(newlyOver, w)
			}
		}
		waits = append(waits, w)
	}
	return waits, newlyOver
}

// Find is every wait in rep for a link the config does not create, each
// with a suggestion, for a one-shot command (apply --once), which has no
// time to wait: such a wait is a failure there.
func Find(rep plan.Report, creates func(string) bool, links func() []string) []Wait {
	byMissing := collect(rep, creates)
	if len(byMissing) == 0 {
		return nil
	}
	names := links()
	var out []Wait
	for _, m := range slices.Sorted(maps.Keys(byMissing)) {
		out = append(out, Wait{Missing: m, Objects: byMissing[m], Suggest: config.Suggest(m, names)})
	}
	return out
}

// collect groups the pending entries of rep that wait for a link the
// config does not create by that link.
func collect(rep plan.Report, creates func(string) bool) map[string][]string {
	byMissing := map[string][]string{}
	for _, e := range rep {
		var pe *host.PendingError
		if !errors.As(e.Err, &pe) || pe.Missing == "" || creates(pe.Missing) {
			continue
		}
		if !slices.Contains(byMissing[pe.Missing], e.Object) {
			byMissing[pe.Missing] = append(byMissing[pe.Missing], e.Object)
		}
	}
	return byMissing
}

// Due reports how long until the earliest current wait goes over the
// bound (a sync then is what degrades the node), and false when no wait
// is still under it.
func (t *Tracker) Due(now time.Time) (time.Duration, bool) {
	bound := t.Bound
	if bound <= 0 {
		bound = DefaultBound
	}
	var next time.Duration
	found := false
	for m, since := range t.since {
		if t.warned[m] {
			continue
		}
		left := max(since.Add(bound).Sub(now), 0)
		if !found || left < next {
			next, found = left, true
		}
	}
	return next, found
}
