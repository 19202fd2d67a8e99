// Package fight keeps nodeagent out of an endless fight with another
// program over one object. A DHCP client that re-adds its lease's form of
// nodeagent's address, a NetworkManager profile that re-commits, a udev
// rule that renames a link: each meets nodeagent's repair, and without a
// bound the two take turns for ever.
//
// A Tracker counts the repairs of each object (by kind and name, as the
// sync's report names them). An object repaired Bound times within Window
// is backed off: from then on it is repaired at most once per resync (the
// daemon's periodic look, every 30 s by default) instead of at once, and
// the daemon says so (the Conflict condition: the object, the rate, the
// program most likely doing it) and reads degraded. Once a repair has
// held for Window, the object is let go and repaired at once again.
//
// The kill switch is never backed off: the caller leaves its objects out
// (netcfg.Plans.Guarded), so they are repaired at once however often.
package fight

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// Defaults for a Tracker's bound.
const (
	DefaultBound  = 10
	DefaultWindow = time.Minute
)

// Tracker counts repairs per object. It is the daemon loop's alone.
type Tracker struct {
	// Bound repairs of one object within Window back it off.
	Bound  int
	Window time.Duration

	objs map[string]*object
	// tick is the last periodic resync: a backed-off object may be
	// repaired once after it.
	tick time.Time
}

type object struct {
	kind, name string
	// text is the last repair's plan line (it says the form found).
	text    string
	repairs []time.Time
	// backedOff is since when; zero when not. attempt is its last repair
	// since, total the repairs while backed off.
	backedOff time.Time
	attempt   time.Time
	rate      string
	total     int
}

// Fight is one object backed off.
type Fight struct {
	Kind, Object string
	// Text is the last repair's plan line.
	Text string
	// Rate is how often it was repaired before it was backed off.
	Rate string
	// Since is when it was backed off; Repairs the repairs since.
	Since   time.Time
	Repairs int
}

func (t *Tracker) bound() (int, time.Duration) {
	b, w := t.Bound, t.Window
	if b <= 0 {
		b = DefaultBound
	}
	if w <= 0 {
		w = DefaultWindow
	}
	return b, w
}

func key(kind, name string) string { return kind + "\x00" + name }

// Tick records a periodic resync at now: each backed-off object may be
// repaired once after it.
func (t *Tracker) Tick(now time.Time) { t.tick = now }

// Hold reports whether the entry's object is backed off and was repaired
// since the last resync tick: its repair waits for the next.
func (t *Tracker) Hold(e plan.Entry) bool {
	o := t.objs[key(e.Kind, e.Object)]
	return o != nil && !o.backedOff.IsZero() && !o.attempt.Before(t.tick)
}

// Record counts the repairs of a drift sync's report at now (entries that
// write; guarded ones, the kill switch's, are left out), and returns the
// objects it newly backed off.
func (t *Tracker) Record(r plan.Report, guarded func(plan.Entry) bool, now time.Time) []Fight {
	if t.objs == nil {
		t.objs = map[string]*object{}
	}
	bound, window := t.bound()
	seen := map[string]bool{}
	var out []Fight
	for _, e := range r {
		if !e.Writes() || e.Kind == plan.KindFile || e.Err != nil || (guarded != nil && guarded(e)) {
			continue
		}
		k := key(e.Kind, e.Object)
		if seen[k] {
			continue
		}
		seen[k] = true
		o := t.objs[k]
		if o == nil {
			o = &object{kind: e.Kind, name: e.Object}
			t.objs[k] = o
		}
		o.text = e.Text
		o.repairs = append(prune(o.repairs, now, window), now)
		if !o.backedOff.IsZero() {
			o.attempt = now
			o.total++
			continue
		}
		if len(o.repairs) >= bound {
			o.backedOff, o.attempt = now, now
			o.rate = fmt.Sprintf("%d repairs in %s", len(o.repairs), now.Sub(o.repairs[0]).Round(time.Second))
			out = append(out, o.fight())
		}
	}
	return out
}

func prune(ts []time.Time, now time.Time, window time.Duration) []time.Time {
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= window {
		i++
	}
	return ts[i:]
}

func (o *object) fight() Fight {
	return Fight{Kind: o.kind, Object: o.name, Text: o.text, Rate: o.rate, Since: o.backedOff, Repairs: o.total}
}

// Expire lets go of the objects whose last repair held for Window (and
// forgets those with no repair within it); it returns those let go.
func (t *Tracker) Expire(now time.Time) []Fight {
	_, window := t.bound()
	var out []Fight
	for k, o := range t.objs {
		o.repairs = prune(o.repairs, now, window)
		switch {
		case !o.backedOff.IsZero() && now.Sub(o.attempt) >= window:
			out = append(out, o.fight())
			delete(t.objs, k)
		case o.backedOff.IsZero() && len(o.repairs) == 0:
			delete(t.objs, k)
		}
	}
	slices.SortFunc(out, func(a, b Fight) int { return strings.Compare(a.Object, b.Object) })
	return out
}

// Reset forgets every object: a new config may have settled the fight.
func (t *Tracker) Reset() { t.objs = nil }

// Fights are the objects backed off now, by name.
func (t *Tracker) Fights() []Fight {
	var out []Fight
	for _, k := range slices.Sorted(maps.Keys(t.objs)) {
		if o := t.objs[k]; !o.backedOff.IsZero() {
			out = append(out, o.fight())
		}
	}
	return out
}

// Describe says what f is, how often it was repaired, what nodeagent does
// now and who most likely does it (manager).
func (t *Tracker) Describe(f Fight, manager string) string {
	_, window := t.bound()
	s := fmt.Sprintf("%s: changed back by another program %s (last: %s); backed off: repaired once per resync instead of at once, until a repair holds for %s",
		f.Object, f.Rate, strings.TrimSpace(f.Text), window)
	if f.Repairs > 0 {
		s += fmt.Sprintf(" (%d repairs since)", f.Repairs)
	}
	return s + "; most likely " + manager
}
