package pia

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestWrongClockThenStepped (issue 29 §6): a node whose clock is two
// years behind at start (before PIA's certificates are valid), then
// stepped right. Before, the first registration failed certificate checks
// with a validity error, counted against the server with backoff. Now:
// status says the clock is not synchronised (not a certificate error), no
// request reaches PIA meanwhile (the password is never sent to a host the
// node cannot check), nothing backs off, and once the clock is stepped
// the provider registers at its next step, with one token request.
func TestWrongClockThenStepped(t *testing.T) {
	var r *rig
	r = newRig(t, rigOptions{}, func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/token":
			fmt.Fprint(w, `{"token":"s3cr3t-t0ken"}`)
		case "/addKey":
			w.Write(addKeyAnswer(r.key.PublicKey(), nil))
		}
	})
	r.clk.Step(-2 * 365 * 24 * time.Hour) // 2024: before testCertFrom
	for range 30 {
		r.step(Observation{}, 5)
		r.clk.Add(time.Second)
	}
	s := r.p.Status()
	if !strings.Contains(s.LastError, "the system clock is not synchronised") || strings.Contains(s.LastError, "x509") || strings.Contains(s.LastError, "certificate of") {
		t.Fatalf("with the clock behind, last error %q; want it to say the clock is not synchronised", s.LastError)
	}
	if n := len(r.hits.all()); n != 0 {
		t.Errorf("%d requests reached PIA with the clock behind; want none", n)
	}
	if r.p.backoffN != 0 || len(r.p.fails) != 0 {
		t.Errorf("the clock counted as a failure: backoff %d, server failures %v", r.p.backoffN, r.p.fails)
	}

	// NTP steps the clock right; the provider's next step goes at once.
	r.clk.Step(2 * 365 * 24 * time.Hour)
	for range 4 { // the step seen, then token, region, addKey
		r.step(Observation{}, 5)
		r.clk.Add(time.Second)
	}
	if r.p.Registration() == nil {
		t.Fatalf("not registered within 4 s of the step; status %+v", r.p.Status())
	}
	if n := r.hits.count("/token"); n != 1 {
		t.Errorf("%d token requests; want 1", n)
	}
	if s := r.p.Status(); strings.Contains(s.LastError, "clock") && s.LastErrorAt.After(r.clk.Now().Add(-3*time.Second)) {
		t.Errorf("the clock error is still current: %q", s.LastError)
	}
}

// TestClockStepJudgesNoExpiry (issue 29 §6): a healthy tunnel whose wall
// clock is stepped a year forward, then a year back, is judged by the
// monotonic clock: its handshake is not "a year old", nothing is
// registered again, and the token is not refreshed for the step.
func TestClockStepJudgesNoExpiry(t *testing.T) {
	var r *rig
	r = newRig(t, rigOptions{}, func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/token":
			fmt.Fprint(w, `{"token":"s3cr3t-t0ken"}`)
		case "/addKey":
			w.Write(addKeyAnswer(r.key.PublicKey(), nil))
		}
	})
	for range 3 {
		r.step(Observation{}, 5)
	}
	if r.p.Registration() == nil {
		t.Fatal("not registered")
	}
	hs := r.clk.Now()
	obs := Observation{Exists: true, HasPeer: true, LastHandshake: hs, RxBytes: 1}
	for i := range 5 {
		obs.RxBytes++
		r.step(obs, 5)
		r.clk.Add(time.Second)
		_ = i
	}
	if !r.p.Healthy() {
		t.Fatalf("not healthy: %+v", r.p.Status())
	}
	for _, step := range []time.Duration{365 * 24 * time.Hour, -365 * 24 * time.Hour} {
		r.clk.Step(step)
		for range 5 {
			obs.RxBytes++
			r.step(obs, 5)
			r.clk.Add(time.Second)
		}
		if !r.p.Healthy() || r.p.Status().LastError != "" {
			t.Fatalf("after a step of %s: healthy %v, last error %q", step, r.p.Healthy(), r.p.Status().LastError)
		}
	}
	if n, k := r.hits.count("/addKey"), r.hits.count("/token"); n != 1 || k != 1 {
		t.Errorf("%d addKey and %d token requests across the steps; want 1 and 1", n, k)
	}
}
