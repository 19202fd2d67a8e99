package agent

import (
	"context"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg"
	"golang.org/x/sys/unix"
)

// trigger is why a sync runs.
type trigger int

// The triggers. Their names are api.Sync.Trigger's and the metrics'.
const (
	trigNone     trigger = iota
	trigStart            // the first sync
	trigConfig           // the config file or a peersDir changed
	trigSignal           // SIGHUP
	trigAPI              // a reload asked over the API
	trigEvent            // a kernel event about an owned object, or WireGuard drift seen by the poll
	trigResync           // the periodic resync, or lost kernel events
	trigRetry            // after a failed sync
	trigReload           // the sync after a reload asked over the API (the config is read already)
	trigProvider         // a PIA provider registered, or gave up a registration
	trigPeers            // register files changed (fileWatch.take names them)
	trigExpiry           // a WireGuard peer's expires came (netcfg.NextExpiry)
)

func (t trigger) String() string {
	switch t {
	case trigStart:
		return "start"
	case trigConfig:
		return "config"
	case trigSignal:
		return "signal"
	case trigAPI:
		return "api"
	case trigEvent:
		return "event"
	case trigResync:
		return "resync"
	case trigRetry:
		return "retry"
	case trigReload:
		return "reload"
	case trigProvider:
		return "provider"
	case trigPeers:
		return "peers"
	case trigExpiry:
		return "expiry"
	}
	return ""
}

// rereads reports whether the sync re-reads the config first.
func (t trigger) rereads() bool {
	return t == trigConfig || t == trigSignal || t == trigAPI || t == trigResync
}

// merge keeps the most telling trigger of a debounced burst: an
// operator's reload (SIGHUP, the API's) beats the rest, so a save that
// came in the same burst is read as the reload asked, never held as a
// file event alone (a script's `cp new.yaml …; systemctl reload`); a
// config change beats the others, so the burst re-reads the config; a
// provider's change beats a kernel event, so that it is not counted as
// drift.
func merge(have, why trigger) trigger {
	// Register files with anything else: the burst re-reads the config,
	// the registers with it, unless the other trigger does already.
	if (have == trigPeers) != (why == trigPeers) && have != trigNone && why != trigNone {
		other := have
		if other == trigPeers {
			other = why
		}
		switch {
		case other == trigStart:
			// The first sync re-reads the config when files changed
			// since it was loaded (sync).
			return trigStart
		case !other.rereads():
			return trigConfig
		}
		return other
	}
	for _, t := range []trigger{trigSignal, trigAPI, trigConfig, trigStart, trigProvider} {
		if have == t || why == t {
			return t
		}
	}
	if have != trigNone {
		return have
	}
	return why
}

// loop is the one goroutine that converges. It also sends the systemd
// watchdog ping, so a wedged loop stops the pings and systemd notices.
func (d *Daemon) loop(ctx context.Context, sig <-chan os.Signal) error {
	resync := time.NewTicker(d.o.Resync)
	defer resync.Stop()
	wgPoll := time.NewTicker(d.o.WGPoll)
	defer wgPoll.Stop()
	pollEvery := d.o.WGPoll
	var watchdog <-chan time.Time
	if iv := d.notify.WatchdogInterval(); iv > 0 {
		t := time.NewTicker(iv / 2)
		defer t.Stop()
		watchdog = t.C
	}
	// The debounce timer is armed by the first trigger and never pushed
	// back by the ones after it: a stream of harmless events (a watched
	// link's txqueuelen changed every 30 ms) must not starve the sync that
	// puts a deleted kill switch back. A trigger that wants a sync sooner
	// (a resync, a retry) may bring it forward.
	debounce := time.NewTimer(0) // the start-up sync
	due := time.Now()
	arm := func(after time.Duration) {
		at := time.Now().Add(after)
		if !due.IsZero() && !at.Before(due) {
			return
		}
		due = at
		debounce.Reset(after)
	}
	pending := trigStart
	var retry <-chan time.Time
	// waitDue fires when objects waiting for a missing link reach the
	// bound: the sync then degrades the node, not the next resync.
	var waitDue <-chan time.Time
	// expiry fires when a peer's expires comes: the sync then takes it
	// out of its device, not the next resync.
	var expiry <-chan time.Time
	// parked: the poll waits for wgChanged (every device is this
	// process's, in userspace, and converged), its timer only a safety
	// net. A poll that keeps the interval keeps this too.
	parked := false
	var wgChanged <-chan struct{}
	if d.us != nil {
		wgChanged = d.us.Changed()
	}
	poll := func() {
		r := d.pollWG(ctx)
		if d.polled != nil {
			d.polled(r)
		}
		every := r.every
		if every > 0 {
			parked = r.parked
		}
		if every > d.o.Resync/2 {
			// Stretched past half the resync period, a poll would
			// run once between two resyncs, each of which reads every
			// device anyway: leave drift to the resync, and poll only
			// now and then to price the digests again (a device
			// whose peers went makes the poll worth its while again).
			every = repricePolls * d.o.Resync
		}
		if every > 0 {
			pollEvery = every
			wgPoll.Reset(every)
		}
		switch {
		case r.provider:
			pending = merge(pending, trigProvider)
			arm(0)
		case r.drift:
			pending = merge(pending, trigEvent)
			arm(0)
		}
	}
	for {
		d.alive.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			d.notify.Stopping()
			if d.role != nil {
				// The role is handed over: its labels and addresses
				// go, then its Lease, so a standby takes it at once
				// rather than after the Lease runs out.
				hctx, cancel := context.WithTimeout(context.Background(), handOverBound)
				d.role.HandOver(hctx, func(c context.Context) error { return d.sync(c, trigProvider) })
				cancel()
				d.roleStop()
			}
			d.log.Info("stopping; kernel state left in place")
			return nil
		case <-watchdog:
			d.notify.Watchdog()
		case <-d.kick:
			for _, why := range d.kicks() {
				pending = merge(pending, why)
			}
			arm(d.o.Debounce)
		case dur := <-d.stall:
			d.log.Warn("test hook: wedging the reconcile loop", "for", dur)
			time.Sleep(dur)
		case s := <-sig:
			if s == syscall.SIGUSR2 {
				d.stall <- time.Minute
				continue
			}
			d.reloadAt = time.Now()
			pending = merge(pending, trigSignal)
			arm(d.o.Debounce)
		case <-d.neighbours:
			// A neighbour's files or state changed: look again now.
			d.evalHazards()
		case <-resync.C:
			pending = merge(pending, trigResync)
			arm(0)
		case <-retry:
			retry = nil
			pending = merge(pending, trigRetry)
			arm(0)
		case <-waitDue:
			waitDue = nil
			pending = merge(pending, trigResync)
			arm(0)
		case <-expiry:
			expiry = nil
			pending = merge(pending, trigExpiry)
			arm(0)
		case <-wgPoll.C:
			poll()
		case <-wgChanged:
			// Another process used a userspace device's UAPI socket (wg
			// set, wg show), or a device exited. A parked poll looks now;
			// a ticking one sees it at its next tick, as before: a script
			// running wg show in a loop must not drive a poll (and, with
			// PIA, a provider step) per call.
			if parked {
				poll()
			}
		case h := <-d.hookEv:
			d.hookDone(h)
		case ev := <-d.piaEv:
			if ev.Probe() {
				poll()
			}
			if d.handlePIA(ctx, ev) {
				pending = merge(pending, trigProvider)
				arm(0)
			}
		case r := <-d.reqs:
			r.serve(ctx, d)
		case <-debounce.C:
			due = time.Time{}
			if pending == trigNone {
				continue
			}
			why := pending
			pending = trigNone
			sync := d.sync
			if why == trigPeers {
				sync = d.syncPeers
			}
			began := time.Now()
			err := sync(ctx, why)
			if next := netcfg.NextExpiry(d.desired, time.Now()); !next.IsZero() {
				expiry = time.After(time.Until(next) + 10*time.Millisecond)
			} else {
				expiry = nil
			}
			if err != nil {
				d.failures++
				backoff := min(time.Second<<min(d.failures-1, 5), maxBackoff)
				retry = time.After(backoff)
				d.log.Warn("sync failed; retrying", "in", backoff, "err", err)
			} else {
				d.failures = 0
				if left, ok := d.waitsDue(); ok {
					waitDue = time.After(left + 10*time.Millisecond)
				}
				switch {
				case parked:
					// The sync may have changed which devices there are
					// (a kernel one, which nothing signals): one poll at
					// the base interval decides whether to park again.
					parked, pollEvery = false, d.o.WGPoll
					wgPoll.Reset(pollEvery)
				case why != trigPeers && pollEvery <= d.o.Resync/2:
					// The sync read every device: the next poll is one
					// interval after it began. (A poll left to the
					// resyncs keeps its own slow schedule.)
					wgPoll.Reset(max(pollEvery-time.Since(began), time.Millisecond))
				}
			}
		}
	}
}

// handOverBound bounds a stop's hand-over of the gateway role (systemd's
// stop timeout is longer).
const handOverBound = 10 * time.Second

// pollResult is what a WireGuard poll found and when the next is due.
type pollResult struct {
	// provider: a PIA provider changed its device; drift: a device's
	// peers differ from the desired state.
	provider, drift bool
	// every is the next interval, or 0 to keep the current one.
	every time.Duration
	// parked: nothing changed and every device is one whose digest only
	// Userspace.Changed can move, so the next poll waits for that signal;
	// every is then a safety net.
	parked bool
}

// pollWG looks at the WireGuard devices: the PIA providers judge their
// tunnels' health by what it sees, and drift reports whether a device's
// peers differ from the desired state (the kernel sends no event when
// someone runs `wg set`). A device whose digest has not moved since a
// poll found it converged is not read, so with thousands of peers and
// nothing changing a poll walks no peer; PIA devices (a peer each) are
// read on every poll.
//
// When only this process's userspace devices are polled and nothing
// moved, the poll parks (pollResult.parked): their digests move only
// through another process's UAPI connection or a device's exit, which
// Userspace.Changed signals, so the daemon waits for that rather than
// waking twice a second for nothing.
func (d *Daemon) pollWG(ctx context.Context) pollResult {
	if len(d.desired.WG.Devices) == 0 {
		return pollResult{}
	}
	des := d.desired
	if len(d.pia) > 0 {
		des = d.converging()
	}
	// The poll's cost is the CPU time of this thread, where the digests'
	// dumps are made and read (the kernel's share included), not the time
	// it took: a poll that waited for a busy CPU cost nothing meanwhile.
	runtime.LockOSThread()
	cpu0 := threadCPU()
	p, looked, err := d.cv.PollWG(ctx, des, d.piaDevices)
	cost := threadCPU() - cpu0
	runtime.UnlockOSThread()
	if err != nil {
		return pollResult{}
	}
	if !looked {
		if d.cv.WGEventDriven(des, d.piaDevices) {
			// The timer, a safety net since every resync reads each
			// device whole anyway, runs as a poll left to the resyncs.
			return pollResult{every: repricePolls * d.o.Resync, parked: true}
		}
		// Only digests were read: that cost sets the interval.
		return pollResult{every: pollInterval(d.o.WGPoll, d.pollCost.add(cost))}
	}
	if len(d.pia) > 0 && d.stepPIA(ctx, p.Observed) {
		return pollResult{provider: true}
	}
	if p.Writes() {
		// Someone is changing the devices: look again soon, whatever the
		// digests cost, so a second change is not left for a stretched
		// interval.
		return pollResult{drift: true, every: d.o.WGPoll}
	}
	return pollResult{}
}

// pollBudget is the share of one core the WireGuard poll may take when
// nothing changes (1/pollBudget), and maxPoll the longest interval it
// stretches to: a kernel device's digest costs a dump of every peer, so
// with many thousands of peers on a slow machine the poll backs off rather
// than keep a core busy; a `wg set` by hand is then seen within maxPoll,
// the default resync period, whose sync reads every device too. A poll
// stretched past half the resync period is left to the resync (loop).
const (
	pollBudget = 500
	maxPoll    = DefaultResync
	// repricePolls is, in resync periods, how often a poll left to the
	// resyncs still runs, to price the digests again.
	repricePolls = 4
)

// pollInterval is the WireGuard poll's next interval after a poll that
// read only digests and took cost: base, or stretched so the poll takes at
// most 1/pollBudget of a core, up to maxPoll.
func pollInterval(base, cost time.Duration) time.Duration {
	return min(max(base, cost*pollBudget), max(base, maxPoll))
}

// pollCosts holds what the last few digest-only polls cost. The interval
// is set from the cheapest of them: one poll that ran long (a collection
// it paid for, a cold cache, an emulator's stall) does not stretch the
// interval for minutes, while a device that grew is priced within a few
// polls.
type pollCosts struct {
	last [4]time.Duration
	n    int
}

// add records cost and returns the smallest of the costs held.
func (c *pollCosts) add(cost time.Duration) time.Duration {
	c.last[c.n%len(c.last)] = cost
	c.n++
	low := cost
	for _, v := range c.last[:min(c.n, len(c.last))] {
		low = min(low, v)
	}
	return low
}

// threadCPU is the CPU time the calling thread has used, user and
// system; 0 if the clock cannot be read.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// converging is the desired state a sync converges to: the config's, as
// the daemon converges it (effective).
func (d *Daemon) converging() netcfg.Desired { return d.effective(d.desired) }

// request is an API call the loop answers, so that only the loop goroutine
// ever touches the converger.
type request interface {
	serve(ctx context.Context, d *Daemon)
}

// planRequest asks what a sync would change now.
type planRequest struct{ reply chan<- api.Plan }

func (r planRequest) serve(ctx context.Context, d *Daemon) {
	p, err := d.cv.Plan(ctx, d.converging())
	out := api.Plan{Lines: p.Report().Lines(), Warnings: d.Status().Warnings}
	if err != nil {
		out.Error = err.Error()
	}
	r.reply <- out
}

// reloadRequest asks for the config to be read again and, if it is
// accepted, a sync.
type reloadRequest struct{ reply chan<- api.Reload }

func (r reloadRequest) serve(ctx context.Context, d *Daemon) {
	old := d.hash
	d.reloadAt = time.Now()
	d.reload(trigAPI)
	d.mu.Lock()
	rej := d.status.LastRejected
	d.mu.Unlock()
	res := api.Reload{Applied: true, ConfigHash: d.hash}
	if c := d.condition(api.CondConfigLoaded); c != nil && c.Status == api.False {
		res.Applied = false
		if rej != nil {
			res.Errors = rej.Errors
		}
	}
	r.reply <- res
	if res.Applied {
		if err := d.sync(ctx, trigReload); err != nil {
			d.log.Warn("sync after reload", "err", err, "previous", old)
		}
	}
}

// ask sends a request made by mk to the loop and waits for its answer.
func ask[T any](ctx context.Context, d *Daemon, mk func(chan T) request) (T, error) {
	reply := make(chan T, 1)
	var zero T
	select {
	case d.reqs <- mk(reply):
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case v := <-reply:
		return v, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}
