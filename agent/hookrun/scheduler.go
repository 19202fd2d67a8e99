package hookrun

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"
)

// State is what a port hook is to deliver: the port (0 once it was
// lost), the port before it, and whether it was lost.
type State struct {
	Port, Previous int
	Lost           bool
}

// Env is the hook's environment for s on device.
func (s State) Env(device string) []string {
	lost := "0"
	if s.Lost {
		lost = "1"
	}
	return []string{
		"NODEAGENT_PIA_DEVICE=" + device,
		"NODEAGENT_PIA_PORT=" + strconv.Itoa(s.Port),
		"NODEAGENT_PIA_PREVIOUS_PORT=" + strconv.Itoa(s.Previous),
		"NODEAGENT_PIA_PORT_LOST=" + lost,
	}
}

// Backoff after a failed run: BackoffMin, doubling each failure in a row,
// at most BackoffMax.
const (
	BackoffMin = 5 * time.Second
	BackoffMax = 5 * time.Minute
)

// After a refused run (ExitRefused): the next attempt comes RefusedWait
// later at the earliest, and RefusedMax refused runs in a row stop the
// automatic attempts until Retry or a new command. qBittorrent bans an
// address after 5 failed logins (its default) and forgets them only on a
// good login or at the ban's end, so a hook retried on any period would
// get the node banned in the end; 3 leaves a person at a browser on the
// same address 2 tries.
const (
	RefusedWait = 15 * time.Minute
	RefusedMax  = 3
)

// Config is one device's hook.
type Config struct {
	Device  string
	Argv    []string
	Timeout time.Duration
	// Every is how long after a success the hook runs again with the
	// current state; 0: not again until the state changes.
	Every time.Duration
	// BackoffMin, BackoffMax, RefusedWait and RefusedMax default to the
	// package's (tests shorten them; the product keeps them).
	BackoffMin, BackoffMax time.Duration
	RefusedWait            time.Duration
	RefusedMax             int
}

func (c Config) withDefaults() Config {
	if c.BackoffMin <= 0 {
		c.BackoffMin = BackoffMin
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = BackoffMax
	}
	if c.RefusedWait <= 0 {
		c.RefusedWait = RefusedWait
	}
	if c.RefusedMax <= 0 {
		c.RefusedMax = RefusedMax
	}
	return c
}

// Outcome is one finished run, as Done is told of it.
type Outcome struct {
	Device string
	State  State
	Result Result
	// Attempt counts the runs for State since its last success, this one
	// included.
	Attempt int
	// Stale: the run was of a command a reload has replaced since it
	// started; it counts for nothing, and the new command runs now.
	Stale bool
	// Held: this run was the RefusedMax-th refused one in a row; there
	// is no automatic attempt until Retry.
	Held bool
}

// Status is a scheduler's state, for status and metrics.
type Status struct {
	// Want is the state to deliver; HasWant is false until one was set.
	Want    State
	HasWant bool
	// Delivered: the last run for Want succeeded.
	Delivered bool
	Running   bool
	// Failures counts the failed runs for Want since its last success.
	Failures int
	// Refused counts the refused runs (ExitRefused) in a row, whatever
	// state they were for; Held: RefusedMax of them stopped the
	// automatic attempts.
	Refused int
	Held    bool
	// Last is the last finished run (zero Start: none yet).
	Last Result
	// Next is when the hook runs next (zero: not scheduled).
	Next time.Time
}

// Scheduler runs one device's hook until it succeeds for the state it was
// last given, again every Every after that, never two runs at once: a
// state set during a run waits for it, then one run delivers the newest.
// A new command (Reconfigure) has delivered nothing: it runs as soon as a
// run of the old one ended, and inherits neither its success nor its
// backoff.
type Scheduler struct {
	done   func(Outcome)
	kick   chan struct{}
	cancel context.CancelFunc
	exited chan struct{}

	mu        sync.Mutex
	cfg       Config
	gen       int // bumped by each new command
	want      State
	hasWant   bool
	delivered *State // what the last successful run delivered
	failed    bool   // the last run for want failed
	failures  int
	// refused runs in a row; until is the earliest next attempt after
	// the last; held: RefusedMax of them, no automatic attempt.
	refused int
	until   time.Time
	held    bool
	running bool
	again   bool // Retry during a run: run again as soon as it ends
	last    Result
	next    time.Time // zero: not scheduled
}

// Start starts a scheduler; it stops with ctx or Stop. delivered, when not
// nil, is a state a hook already delivered (before a restart): given it
// as the state to deliver, the hook does not run before Every. done is
// called after each run, from the scheduler's goroutine: it must not
// block.
func Start(ctx context.Context, cfg Config, delivered *State, done func(Outcome)) *Scheduler {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(ctx)
	s := &Scheduler{cfg: cfg, done: done, kick: make(chan struct{}, 1), cancel: cancel, exited: make(chan struct{})}
	if delivered != nil {
		d := *delivered
		s.want, s.hasWant, s.delivered = d, true, &d
		if cfg.Every > 0 {
			s.next = time.Now().Add(cfg.Every)
		}
	}
	go s.run(ctx)
	return s
}

// Set makes st the state to deliver. A new state is run for at once (once
// a run under way ended), with the backoff started over, unless refused
// runs hold the hook: a new port does not make refused credentials good.
func (s *Scheduler) Set(st State) {
	s.mu.Lock()
	if s.hasWant && s.want == st {
		s.mu.Unlock()
		return
	}
	s.want, s.hasWant = st, true
	s.failed, s.failures = false, 0
	s.next = s.dueLocked(time.Now())
	s.mu.Unlock()
	s.poke()
}

// dueLocked is when a run wanted now may go: now, or when the refused
// runs allow (zero while held).
func (s *Scheduler) dueLocked(now time.Time) time.Time {
	switch {
	case s.held:
		return time.Time{}
	case s.until.After(now):
		return s.until
	}
	return now
}

// Reconfigure takes a reloaded config: a new command has delivered
// nothing yet, owes nothing to the old one's failures or refusals, and
// runs at once (once a run of the old one under way ended); a new timeout
// or period applies from the next run.
func (s *Scheduler) Reconfigure(cfg Config) {
	s.mu.Lock()
	cfg.BackoffMin, cfg.BackoffMax, cfg.RefusedWait, cfg.RefusedMax = s.cfg.BackoffMin, s.cfg.BackoffMax, s.cfg.RefusedWait, s.cfg.RefusedMax
	if !slices.Equal(cfg.Argv, s.cfg.Argv) {
		s.gen++
		s.delivered, s.failed, s.failures = nil, false, 0
		s.refused, s.until, s.held = 0, time.Time{}, false
		if s.hasWant {
			s.next = time.Now()
		}
	} else if cfg.Every != s.cfg.Every && s.upToDate() {
		s.next = time.Time{}
		if cfg.Every > 0 {
			s.next = time.Now().Add(cfg.Every)
		}
	}
	s.cfg = cfg
	s.mu.Unlock()
	s.poke()
}

// Retry runs the hook now (once a run under way ended) for the state it
// has, lifting a refusal's wait or hold: an operator says the cause is
// fixed. With failedOnly, a hook whose last run delivered the state is
// left alone (a reload retries only what failed). It reports whether a
// run was scheduled.
func (s *Scheduler) Retry(failedOnly bool) bool {
	s.mu.Lock()
	defer s.poke()
	defer s.mu.Unlock()
	if !s.hasWant || failedOnly && !s.failed && !s.held && !s.until.After(time.Now()) {
		return false
	}
	s.refused, s.until, s.held = 0, time.Time{}, false
	s.next = time.Now()
	if s.running {
		s.again = true
	}
	return true
}

// Stop stops the scheduler, killing a run under way (its process group:
// SIGTERM, SIGKILL KillGrace later); Done is closed once that run is over
// and the scheduler's goroutine ended.
func (s *Scheduler) Stop() { s.cancel() }

// Done is closed once the scheduler stopped and no hook of its runs.
func (s *Scheduler) Done() <-chan struct{} { return s.exited }

// Status reports the scheduler's state.
func (s *Scheduler) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{Want: s.want, HasWant: s.hasWant, Delivered: s.upToDate(), Running: s.running,
		Failures: s.failures, Refused: s.refused, Held: s.held, Last: s.last, Next: s.next}
}

func (s *Scheduler) upToDate() bool {
	return s.hasWant && !s.failed && s.delivered != nil && *s.delivered == s.want
}

func (s *Scheduler) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Scheduler) run(ctx context.Context) {
	defer close(s.exited)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		next := s.next
		s.mu.Unlock()
		var due <-chan time.Time
		if !next.IsZero() {
			timer.Reset(max(0, time.Until(next)))
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			timer.Stop()
			continue
		case <-due:
		}
		s.mu.Lock()
		if s.next.IsZero() || time.Now().Before(s.next) {
			s.mu.Unlock()
			continue
		}
		st, cfg, gen := s.want, s.cfg, s.gen
		s.running, s.next, s.again = true, time.Time{}, false
		s.mu.Unlock()

		r := Run(ctx, cfg.Argv, st.Env(cfg.Device), cfg.Timeout)
		if ctx.Err() != nil {
			s.mu.Lock()
			s.running = false
			s.mu.Unlock()
			return
		}

		s.mu.Lock()
		o := s.finishLocked(r, st, gen, time.Now())
		s.mu.Unlock()
		if s.done != nil {
			s.done(o)
		}
	}
}

// finishLocked takes a finished run of command generation gen for st and
// schedules the next.
func (s *Scheduler) finishLocked(r Result, st State, gen int, now time.Time) Outcome {
	s.running, s.last = false, r
	o := Outcome{Device: s.cfg.Device, State: st, Result: r, Attempt: s.failures + 1, Stale: gen != s.gen}
	current := s.want == st
	if !o.Stale {
		switch {
		case r.OK():
			d := st
			s.delivered = &d
			s.refused, s.until, s.held = 0, time.Time{}, false
			if current {
				s.failed, s.failures = false, 0
				s.next = time.Time{}
				if s.cfg.Every > 0 {
					s.next = now.Add(s.cfg.Every)
				}
			}
		case r.Refused():
			s.refused++
			wait := s.cfg.RefusedWait
			if current {
				s.failed = true
				s.failures++
				o.Attempt = s.failures
				wait = max(wait, backoff(s.failures, s.cfg.BackoffMin, s.cfg.BackoffMax))
			}
			s.until = now.Add(wait)
			if s.refused >= s.cfg.RefusedMax {
				s.held, s.until, o.Held = true, time.Time{}, true
			}
			s.next = s.dueLocked(now)
		default:
			if current {
				s.failed = true
				s.failures++
				o.Attempt = s.failures
				s.next = now.Add(backoff(s.failures, s.cfg.BackoffMin, s.cfg.BackoffMax))
				if s.until.After(s.next) {
					s.next = s.until
				}
				if s.held {
					s.next = time.Time{}
				}
			}
		}
	}
	// Something newer than this run is due: a new command, a new state,
	// or an operator's retry during the run.
	if (o.Stale || !current || s.again) && s.hasWant {
		s.again = false
		s.next = s.dueLocked(now)
	}
	return o
}

// backoff is the wait after the n-th failure in a row: lo, doubling, at
// most hi.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}
