package pia

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestRetryAfterZeroGetsOurBackoff (issue 29 §2): a 429 whose Retry-After
// is 0 was obeyed as it stood, so the token was asked for again at once,
// in a loop, each time with the password (4,087 requests in 5 s). Now the
// wait is the longer of Retry-After and the provider's own backoff: one
// request, then a wait of at least the backoff's least (BackoffMin less
// its jitter), on a clock that does not move.
func TestRetryAfterZeroGetsOurBackoff(t *testing.T) {
	for _, tt := range []struct {
		retryAfter string
		least      time.Duration
	}{
		{"0", 800 * time.Millisecond}, // BackoffMin 1s, -20% jitter
		{"1", time.Second},
		{"7", 7 * time.Second},
		{"", 59 * time.Second}, // none: PIA's documented default
	} {
		t.Run("Retry-After "+tt.retryAfter, func(t *testing.T) {
			r := newRig(t, rigOptions{}, func(w http.ResponseWriter, req *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(http.StatusTooManyRequests)
			})
			r.step(Observation{}, 3)
			if n := len(r.hits.all()); n != 1 {
				t.Fatalf("%d requests at one instant, want 1", n)
			}
			s := r.p.Status()
			if wait := s.RetryAt.Sub(r.clk.Now()); wait < tt.least {
				t.Errorf("retry after %s, want at least %s", wait, tt.least)
			}
			if !strings.Contains(s.LastError, "HTTP 429") {
				t.Errorf("last error %q", s.LastError)
			}
		})
	}
}

// TestBudgetCapsRequests (issue 29 §2): whatever PIA answers, a provider
// sends at most MaxRequests requests in any RequestWindow. The backoff is
// made as short as it goes (1 ns), so that only the budget can hold the
// provider back; the clock moves 10 ms a pass for three minutes (18,000
// passes: without the budget as many requests). Counted at the server, on
// the same clock.
func TestBudgetCapsRequests(t *testing.T) {
	timers := Timers{BackoffMin: time.Nanosecond, BackoffMax: time.Nanosecond, CredentialsBackoff: time.Nanosecond}
	token := func(w http.ResponseWriter) { fmt.Fprint(w, `{"token":"s3cr3t-t0ken"}`) }
	for _, tt := range []struct {
		name string
		h    func(r *rig) http.HandlerFunc
	}{
		{"token 429 Retry-After 0", func(*rig) http.HandlerFunc {
			return func(w http.ResponseWriter, req *http.Request) {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusTooManyRequests)
			}
		}},
		{"everything 500", func(*rig) http.HandlerFunc {
			return func(w http.ResponseWriter, req *http.Request) { w.WriteHeader(http.StatusInternalServerError) }
		}},
		{"addKey 500 (then the list again, 500)", func(*rig) http.HandlerFunc {
			return func(w http.ResponseWriter, req *http.Request) {
				if req.URL.Path == "/token" {
					token(w)
					return
				}
				w.WriteHeader(http.StatusInternalServerError)
			}
		}},
		{"addKey Login failed (a new token at once)", func(*rig) http.HandlerFunc {
			return func(w http.ResponseWriter, req *http.Request) {
				if req.URL.Path == "/token" {
					token(w)
					return
				}
				fmt.Fprint(w, `{"status":"ERROR","message":"Login failed!"}`)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var r *rig
			r = newRig(t, rigOptions{timers: timers}, func(w http.ResponseWriter, req *http.Request) { tt.h(r)(w, req) })
			n, window := r.p.t.MaxRequests, r.p.t.RequestWindow
			for end := r.clk.Now().Add(3 * window); r.clk.Now().Before(end); r.clk.Add(10 * time.Millisecond) {
				r.step(Observation{}, 2*n)
			}
			ts := r.hits.all()
			t.Logf("%d requests in %s, at most %d in %s", len(ts), 3*window, n, window)
			for i := 0; i+n < len(ts); i++ {
				if d := ts[i+n].Sub(ts[i]); d < window {
					t.Fatalf("requests %d to %d (%d of them) within %s, want at most %d in %s", i, i+n, n+1, d, n, window)
				}
			}
			// A cap, not a stop: the budget fills again.
			if len(ts) <= 2*n || len(ts) > 3*n {
				t.Errorf("%d requests in three windows, want more than %d and at most %d", len(ts), 2*n, 3*n)
			}
		})
	}
}

// TestBudgetCoversPortForwarding: getSignature and bindPort go through the
// same budget as the rest (the provider's copy of the API carries it);
// a request over it is not sent and says when the next may go.
func TestBudgetCoversPortForwarding(t *testing.T) {
	ca := newTestCA(t)
	clk := newFakeClock()
	payload := base64.StdEncoding.EncodeToString([]byte(`{"token":"s3cr3t-t0ken","port":47047,"expires_at":"2099-01-01T00:00:00Z"}`))
	a, served := serve(t, ca.leaf(t, "amsterdam401", []string{"amsterdam401"}, nil), func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/getSignature":
			fmt.Fprintf(w, `{"status":"OK","payload":%q,"signature":"c2ln"}`, payload)
		default:
			fmt.Fprint(w, `{"status":"OK","message":"port scheduled for add"}`)
		}
	})
	a.Roots = ca.pool
	a.budget = newBudget(5, time.Minute, clk.Now)
	vip := netip.MustParseAddr("10.10.0.1")
	ctx := context.Background()
	var refused []error
	for i := range 10 {
		var err error
		if i < 3 {
			_, err = a.GetSignature(ctx, a.Dial, "amsterdam401", vip, "s3cr3t-t0ken")
		} else {
			err = a.BindPort(ctx, a.Dial, "amsterdam401", vip, Signature{Payload: Secret(payload), Signature: "c2ln"})
		}
		if err != nil {
			refused = append(refused, err)
		}
	}
	if *served != 5 || len(refused) != 5 {
		t.Fatalf("%d requests served and %d refused; want 5 and 5", *served, len(refused))
	}
	for _, err := range refused {
		be, ok := budgetOf(err)
		if !ok || !be.Until.Equal(clk.Now().Add(time.Minute)) {
			t.Errorf("refused with %v, want a BudgetError until %s", err, clk.Now().Add(time.Minute))
		}
		if strings.Contains(err.Error(), "s3cr3t-t0ken") || strings.Contains(err.Error(), payload) {
			t.Errorf("the refusal quotes a secret: %v", err)
		}
	}
	clk.Add(time.Minute)
	if err := a.BindPort(ctx, a.Dial, "amsterdam401", vip, Signature{Payload: Secret(payload), Signature: "c2ln"}); err != nil || *served != 6 {
		t.Errorf("a minute on: %v, %d served", err, *served)
	}
}

// TestBudgetRefusalIsNoFailure: a call the budget did not let through
// asked PIA nothing: it counts against no server, uses no retry, and
// waits until the budget has room.
func TestBudgetRefusalIsNoFailure(t *testing.T) {
	r := newRig(t, rigOptions{}, func(w http.ResponseWriter, req *http.Request) {})
	p := r.p
	until := r.clk.Now().Add(42 * time.Second)
	be := &BudgetError{N: 30, Window: time.Minute, Until: until}
	p.seq = 1
	p.handle(context.Background(), addKeyResult{err: fmt.Errorf("addKey at amsterdam401: %w", be)})
	if len(p.fails) != 0 || p.backoffN != 0 || !p.retryAt.Equal(until) || p.lastErr != "" {
		t.Errorf("after a refused addKey: fails %v, backoff %d, retry %s (want %s), last error %q", p.fails, p.backoffN, p.retryAt, until, p.lastErr)
	}
	sig := &Signature{Payload: "p", Signature: "s", Port: 47047, Server: testServer.CN}
	p.sig, p.reg = sig, goodReg(r.clk.Now())
	p.handlePF(bindResult{s: sig, err: fmt.Errorf("bindPort at amsterdam401: %w", be)})
	if p.pfTried || p.pfN != 0 || p.sig != sig || !p.pfAt.Equal(until) {
		t.Errorf("after a refused bind: tried %v, failures %d, signature kept %v, next %s (want %s)", p.pfTried, p.pfN, p.sig == sig, p.pfAt, until)
	}
}

// TestAddKey429IsNoServerFault: addKey answering 429 (found in review:
// it was a server fault, so enough of them failed over, and Retry-After
// was not read) waits the longer of Retry-After and the backoff, and is
// not counted against the server.
func TestAddKey429IsNoServerFault(t *testing.T) {
	r := newRig(t, rigOptions{}, func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/token":
			fmt.Fprint(w, `{"token":"s3cr3t-t0ken"}`)
		case "/addKey":
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	for range 3 {
		r.step(Observation{}, 5)
	}
	if r.hits.count("/addKey") != 1 {
		t.Fatalf("%d addKey requests, want 1", r.hits.count("/addKey"))
	}
	s := r.p.Status()
	if wait := s.RetryAt.Sub(r.clk.Now()); wait < 30*time.Second {
		t.Errorf("retry after %s, want at least Retry-After's 30s", wait)
	}
	if len(r.p.fails) != 0 {
		t.Errorf("a 429 counted against the server: %v", r.p.fails)
	}
}

// TestBudgetOutlivesTheProvider (found in review): a provider made anew
// for the same device (a reload that changed its PIA settings) takes over
// the old one's budget, so reloads cannot add up to more than the cap.
func TestBudgetOutlivesTheProvider(t *testing.T) {
	r := newRig(t, rigOptions{}, func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	for range 40 {
		if ok, _ := r.p.budget.take(); !ok {
			break
		}
	}
	next := New(Config{Device: "wgpia0", Budget: r.p.Budget()}, Boot{}, nil, nil)
	next.now = r.clk.Now
	if ok, until := next.budget.take(); ok {
		t.Fatal("the new provider got a fresh budget")
	} else if until.IsZero() {
		t.Fatal("no time given for the next request")
	}
}
