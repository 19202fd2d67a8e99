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

// Config is one device's hook.
type Config struct {
	Device  string
	Argv    []string
	Timeout time.Duration
	// Every is how long after a success the hook runs again with the
	// current state; 0: not again until the state changes.
	Every time.Duration
	// BackoffMin and BackoffMax default to the package's (tests shorten
	// them).
	BackoffMin, BackoffMax time.Duration
}

// Outcome is one finished run, as Done is told of it.
type Outcome struct {
	Device string
	State  State
	Result Result
	// Attempt counts the runs for State since its last success, this one
	// included.
	Attempt int
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
	// Last is the last finished run (zero Start: none yet).
	Last Result
	// Next is when the hook runs next (zero: not scheduled).
	Next time.Time
}

// Scheduler runs one device's hook until it succeeds for the state it was
// last given, again every Every after that, never two runs at once: a
// state set during a run waits for it, then one run delivers the newest.
type Scheduler struct {
	done   func(Outcome)
	kick   chan struct{}
	cancel context.CancelFunc
	exited chan struct{}

	mu        sync.Mutex
	cfg       Config
	want      State
	hasWant   bool
	delivered *State // what the last successful run delivered
	failed    bool   // the last run for want failed
	failures  int
	running   bool
	last      Result
	next      time.Time // zero: not scheduled
}

// Start starts a scheduler; it stops with ctx or Stop. delivered, when not
// nil, is a state a hook already delivered (before a restart): given it
// as the state to deliver, the hook does not run before Every. done is
// called after each run, from the scheduler's goroutine: it must not
// block.
func Start(ctx context.Context, cfg Config, delivered *State, done func(Outcome)) *Scheduler {
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = BackoffMin
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = BackoffMax
	}
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
// a run under way ended), with the backoff started over.
func (s *Scheduler) Set(st State) {
	s.mu.Lock()
	if s.hasWant && s.want == st {
		s.mu.Unlock()
		return
	}
	s.want, s.hasWant = st, true
	s.failed, s.failures = false, 0
	s.next = time.Now()
	s.mu.Unlock()
	s.poke()
}

// Reconfigure takes a reloaded config: a new command has delivered
// nothing yet and runs at once; a new timeout or period applies from the
// next run.
func (s *Scheduler) Reconfigure(cfg Config) {
	s.mu.Lock()
	cfg.BackoffMin, cfg.BackoffMax = s.cfg.BackoffMin, s.cfg.BackoffMax
	if !slices.Equal(cfg.Argv, s.cfg.Argv) {
		s.delivered, s.failed, s.failures = nil, false, 0
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

// Stop stops the scheduler, killing a run under way; Done is closed when
// its goroutine ended.
func (s *Scheduler) Stop() { s.cancel() }

// Done is closed once the scheduler stopped and no hook of its runs.
func (s *Scheduler) Done() <-chan struct{} { return s.exited }

// Status reports the scheduler's state.
func (s *Scheduler) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{Want: s.want, HasWant: s.hasWant, Delivered: s.upToDate(), Running: s.running,
		Failures: s.failures, Last: s.last, Next: s.next}
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
		st, cfg := s.want, s.cfg
		s.running, s.next = true, time.Time{}
		s.mu.Unlock()

		r := Run(ctx, cfg.Argv, st.Env(cfg.Device), cfg.Timeout)
		if ctx.Err() != nil {
			s.mu.Lock()
			s.running = false
			s.mu.Unlock()
			return
		}

		s.mu.Lock()
		s.running, s.last = false, r
		now := time.Now()
		var o Outcome
		switch {
		case s.want != st:
			// Set during the run: the newest state is due now, whatever
			// became of this one.
			s.next = now
			if r.OK() {
				d := st
				s.delivered = &d
			}
			o = Outcome{Device: cfg.Device, State: st, Result: r, Attempt: s.failures + 1}
		case r.OK():
			o = Outcome{Device: cfg.Device, State: st, Result: r, Attempt: s.failures + 1}
			d := st
			s.delivered, s.failed, s.failures = &d, false, 0
			if s.cfg.Every > 0 {
				s.next = now.Add(s.cfg.Every)
			}
		default:
			s.failed = true
			s.failures++
			s.next = now.Add(backoff(s.failures, s.cfg.BackoffMin, s.cfg.BackoffMax))
			o = Outcome{Device: cfg.Device, State: st, Result: r, Attempt: s.failures}
		}
		s.mu.Unlock()
		if s.done != nil {
			s.done(o)
		}
	}
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
