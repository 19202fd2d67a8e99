package pia

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// budget bounds the HTTP requests one provider sends to PIA: at most n in
// any window, whatever PIA's answers ask (a Retry-After of 0, an instant
// 500, a "Login failed" that wants a new token at once). It counts every
// request of every call (token, list, addKey, getSignature, bindPort), so
// no path of the state machine, present or future, can storm PIA with the
// account's password or token.
type budget struct {
	n      int
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	sent []time.Time // the sends within the window, oldest first
}

func newBudget(n int, window time.Duration, now func() time.Time) *budget {
	return &budget{n: n, window: window, now: now}
}

// prune drops the sends that left the window. b.mu is held.
func (b *budget) prune(now time.Time) {
	i := 0
	for i < len(b.sent) && !now.Before(b.sent[i].Add(b.window)) {
		i++
	}
	b.sent = b.sent[i:]
}

// take spends one request if the window has room; else it reports when
// the next one may go.
func (b *budget) take() (ok bool, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.prune(now)
	if len(b.sent) >= b.n {
		return false, b.sent[0].Add(b.window)
	}
	b.sent = append(b.sent, now)
	return true, time.Time{}
}

// free reports when a request may next go: now, or when the oldest send
// leaves the window.
func (b *budget) free(now time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now)
	if len(b.sent) < b.n {
		return now
	}
	return b.sent[0].Add(b.window)
}

// BudgetError is a request not sent: the provider's budget of requests to
// PIA is spent until Until.
type BudgetError struct {
	N      int
	Window time.Duration
	Until  time.Time
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("not sent: %d requests to PIA within %s is the most allowed; next at %s", e.N, e.Window, e.Until.UTC().Format(time.RFC3339))
}

// budgetOf returns the BudgetError in err, if any.
func budgetOf(err error) (*BudgetError, bool) {
	var be *BudgetError
	ok := errors.As(err, &be)
	return be, ok
}

// gated is a transport that sends a request only when the budget has room.
type gated struct {
	rt http.RoundTripper
	b  *budget
}

func (g gated) RoundTrip(r *http.Request) (*http.Response, error) {
	if ok, until := g.b.take(); !ok {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, &BudgetError{N: g.b.n, Window: g.b.window, Until: until}
	}
	return g.rt.RoundTrip(r)
}

// Budget is a provider's budget of requests to PIA, to hand to the
// provider that replaces it (Config.Budget): a reload that changes a
// device's PIA settings makes a new provider, and a fresh budget with it
// would let reloads, one after another, send more than the cap.
type Budget struct{ b *budget }

// Budget returns p's budget, for the provider that replaces it.
func (p *Provider) Budget() Budget { return Budget{p.budget} }
