package pia

import (
	"path/filepath"
	"testing"
	"time"
)

// TestPortTroubleSince: when the forwarded port stopped being kept bound,
// from the provider's state: a failed call, the tunnel going down, or a
// bind that was due and never came (a stopped daemon), whichever first;
// not before the last good bind; nothing without a port.
func TestPortTroubleSince(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for _, c := range []struct {
		name    string
		port    int
		healthy bool
		bound   time.Time
		failed  time.Time
		sick    time.Time
		now     time.Time
		want    time.Time
	}{
		{"no port", 0, false, time.Time{}, at(1), at(1), at(60), time.Time{}},
		{"bound and healthy", 47000, true, at(0), time.Time{}, time.Time{}, at(14), time.Time{}},
		{"a failed re-bind", 47000, true, at(0), at(15), time.Time{}, at(16), at(15)},
		{"the tunnel down after the bind", 47000, false, at(0), time.Time{}, at(5), at(6), at(5)},
		{"the tunnel down before the bind counts from the bind", 47000, false, at(10), time.Time{}, at(5), at(12), at(10)},
		{"a bind due and none good (a stopped daemon)", 47000, true, at(0), time.Time{}, time.Time{}, at(60), at(15)},
		{"a bind not due yet", 47000, true, at(0), time.Time{}, time.Time{}, at(15), time.Time{}},
		{"the earliest of them", 47000, false, at(0), at(20), at(18), at(30), at(15)},
		{"a port restored from a saved state that was never bound here", 47000, false, time.Time{}, time.Time{}, at(3), at(4), at(3)},
	} {
		p := &Provider{t: Timers{}.withDefaults(), port: c.port, healthy: c.healthy, bound: c.bound, pfTrouble: c.failed, sickSince: c.sick}
		if got := p.PortTroubleSince(c.now); !got.Equal(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPortStateSurvivesARestart: the last good bind and the start of the
// trouble are saved with the port and read back.
func TestPortStateSurvivesARestart(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "pia")}
	bound := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	failing := bound.Add(15 * time.Minute)
	if err := s.Save("wg-pia", Saved{PF: &SavedPF{Port: 47047, Notified: 47047, LastBind: bound, FailingSince: failing}}); err != nil {
		t.Fatal(err)
	}
	v, err := s.Load("wg-pia")
	if err != nil {
		t.Fatal(err)
	}
	if v.PF == nil || v.PF.Port != 47047 || !v.PF.LastBind.Equal(bound) || !v.PF.FailingSince.Equal(failing) {
		t.Fatalf("read back %+v", v.PF)
	}
	p := New(Config{Device: "wg-pia", PortForward: true, Store: s}, Boot{Saved: v}, nil, nil)
	p.now = func() time.Time { return failing.Add(time.Minute) }
	if got := p.PortTroubleSince(p.now()); !got.Equal(failing) {
		t.Errorf("a restarted provider's trouble since %v, want the saved %v", got, failing)
	}
}
