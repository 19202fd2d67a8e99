package pia

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStaleListBacksOff (issue 29 §4): with a stale cached list and a bad
// list at the host, a healthy tunnel fetched the list again every ~30 s
// forever (its backoff was reset by every healthy step), and status showed
// a date moved to fit that schedule as the cache's date. Now the fetch
// backs off exponentially up to the refresh period, and status shows the
// date the cached list was fetched. Two days of a healthy tunnel on the
// test's clock, one pass a second.
func TestStaleListBacksOff(t *testing.T) {
	const age = 7 * time.Hour // past the 6 h refresh
	clk := newFakeClock()
	// (A token lasting the whole run, so the list is all that is asked.)
	r := newRig(t, rigOptions{timers: Timers{TokenRefresh: 100 * time.Hour}, listAge: age, saved: Saved{Token: "s3cr3t-t0ken", TokenAt: clk.Now(), Reg: goodReg(clk.Now().Add(-time.Hour))}},
		func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path == "/list" {
				w.Write([]byte(`{"groups":{},"regions":[]}` + "\n\nbm90IGEgc2lnbmF0dXJl\n")) // signed by no one
			}
		})
	cachedAt := r.clk.Now().Add(-age).UTC().Format(time.RFC3339)
	if r.p.Registration() == nil {
		t.Fatal("the saved registration was not re-adopted")
	}
	ttl := r.p.t.ListRefresh
	var rx int64
	end := r.clk.Now().Add(48 * time.Hour)
	for ; r.clk.Now().Before(end); r.clk.Add(time.Second) {
		// A healthy tunnel: a recent handshake, bytes arriving (no probe).
		rx += 1000
		r.step(Observation{Exists: true, HasPeer: true, LastHandshake: r.clk.Now().Add(-time.Second), RxBytes: rx}, 3)
		if !r.p.Healthy() {
			t.Fatalf("the tunnel is not healthy at %s: %+v", r.clk.Now(), r.p.Status())
		}
	}
	ts := r.hits.times("/list")
	var gaps []time.Duration
	for i := 1; i < len(ts); i++ {
		gaps = append(gaps, ts[i].Sub(ts[i-1]))
	}
	t.Logf("%d fetches in 48h; gaps %v", len(ts), gaps)
	// 30 s doubling to 6 h, ±20%: about a dozen and a half in two days
	// (every ~30 s, as before, is over 5,000).
	if len(ts) < 10 || len(ts) > 24 {
		t.Errorf("%d fetches of the list in 48h, want 10 to 24", len(ts))
	}
	first, last := gaps[0], gaps[len(gaps)-1]
	if first < 24*time.Second || first > 37*time.Second {
		t.Errorf("the first retry after %s, want about 30s", first)
	}
	for _, g := range gaps {
		if g > ttl*12/10+time.Second {
			t.Errorf("a gap of %s, over the cap (the refresh period, %s, +20%%)", g, ttl)
		}
	}
	if last < ttl*8/10 {
		t.Errorf("the last gap %s, want the cap (%s -20%%) by now", last, ttl)
	}
	s := r.p.Status()
	if !strings.Contains(s.List, "using the cached list of "+cachedAt) || !strings.Contains(s.List, "does not verify") || !strings.Contains(s.List, "next try") {
		t.Errorf("status says %q; want the cache's real date %s", s.List, cachedAt)
	}
	if n := r.hits.count("/token") + r.hits.count("/addKey"); n != 0 {
		t.Errorf("%d token or addKey requests: the healthy tunnel was touched", n)
	}
}
