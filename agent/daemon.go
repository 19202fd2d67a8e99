package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/apiserver"
	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/agent/metrics"
	"github.com/nodeagent/nodeagent/agent/notify"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// RunOptions are what the daemon runs with.
type RunOptions struct {
	Options
	// Socket is the local API's unix socket; "" disables it (tests that
	// drive the daemon directly).
	Socket string
	// SocketGroup may read the socket (default "nodeagent").
	SocketGroup string
	// MetricsAddr serves Prometheus metrics on this TCP address; "" is off.
	MetricsAddr string
	// Resync is the period of the full resync (default 30s).
	Resync time.Duration
	// Debounce gathers a burst of triggers into one sync (default 100ms).
	Debounce time.Duration
	// WGPoll is how often WireGuard peers are checked for drift, since the
	// kernel sends no notification when one is changed (default 500ms).
	WGPoll  time.Duration
	Version string
	Log     *slog.Logger
	// Host is the namespace to converge; nil means the process's own.
	Host *host.Host
	// StallBound is how long the loop may go without completing a pass
	// before /healthz fails (default: the systemd watchdog timeout, else
	// DefaultStallBound).
	StallBound time.Duration
	// TestHooks turns on SIGUSR2, which wedges the reconcile loop for a
	// minute, so tests can prove the watchdog notices.
	TestHooks bool
}

// Daemon is the long-running agent: one goroutine owns convergence (the
// loop); everything else (event sources, the API server) only sends it
// triggers or reads the status it publishes.
type Daemon struct {
	o       RunOptions
	log     *slog.Logger
	host    *host.Host
	cv      *netcfg.Converger
	us      *wg.Userspace
	notify  *notify.Notifier
	metrics *metrics.Metrics
	// labeler labels the Node in its own goroutine: labels are eventually
	// consistent and never hold up networking.
	labeler *kube.Labeler
	kick    chan string
	want    atomic.Pointer[interest]
	// reading is a config read still under way (see read).
	reading chan loaded
	files   *fileWatch
	// alive is the last time the loop went round, for /healthz.
	alive atomic.Int64

	// Loop-owned state: only the loop goroutine touches these.
	cfg      *config.Config
	desired  netcfg.Desired
	hash     string
	lastGood *netcfg.Desired // the last desired state applied without breaking a probe
	badHash  string          // a config rolled back by safe apply, not retried until it changes
	ready    bool
	failures int // consecutive failed syncs, for the retry backoff
	// skipped is what the last sync left out (bad peer files), so each is
	// logged once when it appears, not on every sync.
	skipped map[string]bool
	// syncedHash is the config hash the last sync applied: a sync of the
	// same config repairs drift, one of a new config does not.
	syncedHash string
	// forwarding is what the last sync said about forwarding while the
	// kill switch was down ("" when armed), logged when it changes.
	forwarding string

	// stall wedges the loop for the given time (the test hook, also sent
	// by SIGUSR2 when TestHooks is on).
	stall chan time.Duration

	// mu guards status and the request channel used by the API.
	mu     sync.Mutex
	status api.Status
	reqs   chan request
}

// request is an API call the loop answers (a plan, or a reload), so that
// only the loop goroutine ever touches the converger.
type request struct {
	kind  string // "plan", "reload"
	reply chan any
}

// Defaults.
const (
	DefaultResync   = 30 * time.Second
	DefaultDebounce = 100 * time.Millisecond
	DefaultWGPoll   = 500 * time.Millisecond
	maxBackoff      = 30 * time.Second
)

// NewDaemon loads the config and prepares the daemon. An invalid config at
// start is an error: there is no previous config to keep running.
func NewDaemon(o RunOptions) (*Daemon, error) {
	if o.Resync == 0 {
		o.Resync = DefaultResync
	}
	if o.Debounce == 0 {
		o.Debounce = DefaultDebounce
	}
	if o.WGPoll == 0 {
		o.WGPoll = DefaultWGPoll
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Register == nil {
		o.Register = &register.Cache{}
	}
	d := &Daemon{
		o: o, log: o.Log, kick: make(chan string, 16), reqs: make(chan request), stall: make(chan time.Duration, 1),
		notify: notify.New(o.Log), metrics: metrics.New(),
	}
	if err := d.load(); err != nil {
		return nil, err
	}
	d.host = o.Host
	if d.host == nil {
		h, err := host.Current()
		if err != nil {
			return nil, err
		}
		d.host = h
	}
	kc, err := kube.FromConfig(d.cfg)
	if err != nil {
		return nil, err
	}
	d.labeler = kube.New(kc, d.log)
	d.us = wg.NewUserspace(d.log.With("subsystem", "wireguard"))
	d.cv = &netcfg.Converger{Host: d.host, Log: d.log, Userspace: d.us}
	d.status = api.Status{Version: o.Version, ConfigFile: o.Config, Started: time.Now().UTC(), Conditions: []api.Condition{}}
	d.setCondition(api.CondReady, api.False, "Starting", "the first sync has not finished")
	return d, nil
}

// load reads and validates the config and derives the desired state,
// replacing the running one only when all of it is valid. The reading
// (config, registers, key files) runs off the loop with a deadline: a file
// on a wedged filesystem must not stop convergence of what is loaded.
func (d *Daemon) load() error {
	r, err := d.read()
	if err != nil {
		return err
	}
	if u := Unsupported(r.cfg); len(u) > 0 {
		return &InvalidError{fmt.Errorf("%s: uses sections this build cannot converge yet: %s", d.o.Config, strings.Join(u, ", "))}
	}
	sum := sha256.Sum256(r.raw)
	d.cfg, d.desired, d.hash = r.cfg, r.des, hex.EncodeToString(sum[:8])
	d.want.Store(interestOf(r.des))
	return nil
}

// loaded is what one read of the config produced.
type loaded struct {
	cfg *config.Config
	des netcfg.Desired
	raw []byte
	err error
}

// loadDeadline bounds how long the loop waits for the config, its
// registers and key files to be read (local files take milliseconds).
const loadDeadline = 10 * time.Second

// read reads the config in a goroutine and waits for it up to
// loadDeadline. A read that overruns is not abandoned: the next read
// waits for it rather than start another, and whatever it returns then is
// followed by a fresh read, since the files may have changed meanwhile.
func (d *Daemon) read() (loaded, error) {
	stale := d.reading != nil
	if !stale {
		ch := make(chan loaded, 1)
		o := d.o.Options
		go func() {
			c, des, raw, err := load(o)
			ch <- loaded{c, des, raw, err}
		}()
		d.reading = ch
	}
	select {
	case r := <-d.reading:
		d.reading = nil
		if stale {
			d.kickNow("config")
		}
		return r, r.err
	case <-time.After(loadDeadline):
		return loaded{}, fmt.Errorf("reading %s and its peer registers and key files did not finish within %s (a file on a filesystem that does not answer?); the running config stays", d.o.Config, loadDeadline)
	}
}

func interestOf(des netcfg.Desired) *interest {
	in := &interest{names: map[string]bool{}}
	for _, l := range des.Link.Links {
		in.names[l.Name] = true
		in.names[l.Parent] = true
	}
	for _, dev := range des.WG.Devices {
		in.names[dev.Name] = true
	}
	return in
}

// kickNow asks the loop for a sync; it never blocks (a full channel means
// a sync is due already).
func (d *Daemon) kickNow(why string) {
	select {
	case d.kick <- why:
	default:
	}
}

// Run runs the daemon until ctx ends. A clean stop leaves every kernel
// object in place, so a restart does not drop the tunnel.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer d.us.Close()
	defer d.cv.Close()
	if d.o.Host == nil {
		defer d.host.Close()
	}
	kick := d.kickNow
	if err := watchNetlink(ctx, d.host, &d.want, kick, d.log); err != nil {
		return fmt.Errorf("rtnetlink events: %w", err)
	}
	if err := watchNftables(ctx, d.host, kick); err != nil {
		return fmt.Errorf("nftables events: %w", err)
	}
	fw, err := watchFiles(ctx, d.o.Config, kick, d.log)
	if err != nil {
		return fmt.Errorf("file watch: %w", err)
	}
	d.files = fw
	d.files.set(d.peerDirs(), d.log)
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGHUP)
	if d.o.TestHooks {
		signal.Notify(sig, syscall.SIGUSR2)
	}
	defer signal.Stop(sig)
	var wg sync.WaitGroup
	defer wg.Wait()
	if d.o.Socket != "" {
		l, err := apiserver.Listen(apiserver.Options{Socket: d.o.Socket, Group: d.o.SocketGroup, Log: d.log})
		if err != nil {
			return fmt.Errorf("local API: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := apiserver.Serve(ctx, l, d, d.log); err != nil {
				d.log.Error("local API", "err", err)
			}
		}()
	}
	if d.o.MetricsAddr != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.metrics.Serve(ctx, d.o.MetricsAddr, d.log); err != nil {
				d.log.Error("metrics", "err", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.labeler.Run(ctx)
	}()
	return d.loop(ctx, sig)
}

// loop is the one goroutine that converges. It also sends the systemd
// watchdog ping, so a wedged loop stops the pings and systemd notices.
func (d *Daemon) loop(ctx context.Context, sig <-chan os.Signal) error {
	resync := time.NewTicker(d.o.Resync)
	defer resync.Stop()
	wgPoll := time.NewTicker(d.o.WGPoll)
	defer wgPoll.Stop()
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
	reason := "start"
	var retry <-chan time.Time
	for {
		d.alive.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			d.notify.Stopping()
			d.log.Info("stopping; kernel state left in place")
			return nil
		case <-watchdog:
			d.notify.Watchdog()
		case why := <-d.kick:
			reason = merge(reason, why)
			arm(d.o.Debounce)
		case dur := <-d.stall:
			d.log.Warn("test hook: wedging the reconcile loop", "for", dur)
			time.Sleep(dur)
		case s := <-sig:
			if s == syscall.SIGUSR2 {
				d.stall <- time.Minute
				continue
			}
			reason = merge(reason, "signal")
			arm(d.o.Debounce)
		case <-resync.C:
			reason = merge(reason, "resync")
			arm(0)
		case <-retry:
			retry = nil
			reason = merge(reason, "retry")
			arm(0)
		case <-wgPoll.C:
			if d.wgDrifted(ctx) {
				reason = merge(reason, "event")
				arm(0)
			}
		case r := <-d.reqs:
			d.answer(ctx, r)
		case <-debounce.C:
			due = time.Time{}
			if reason == "" {
				continue
			}
			why := reason
			reason = ""
			if err := d.sync(ctx, why); err != nil {
				d.failures++
				backoff := min(time.Second<<min(d.failures-1, 5), maxBackoff)
				retry = time.After(backoff)
				d.log.Warn("sync failed; retrying", "in", backoff, "err", err)
			} else {
				d.failures = 0
			}
		}
	}
}

// merge keeps the most telling reason of a debounced burst: a config
// change beats the rest, so the burst re-reads the config.
func merge(have, why string) string {
	for _, r := range []string{"config", "signal", "api", "start"} {
		if have == r || why == r {
			return r
		}
	}
	if have != "" {
		return have
	}
	return why
}

// wgDrifted reports whether a WireGuard device's peers differ from the
// desired state: the kernel sends no event when someone runs `wg set`.
func (d *Daemon) wgDrifted(ctx context.Context) bool {
	if len(d.desired.WG.Devices) == 0 {
		return false
	}
	p, err := d.cv.PlanWG(ctx, d.desired)
	return err == nil && p.Writes()
}

// sync is one pass: reload the config if the trigger asks for it, plan,
// apply with safe apply around it, observe again, publish the status.
func (d *Daemon) sync(ctx context.Context, trigger string) error {
	start := time.Now()
	if trigger == "config" || trigger == "signal" || trigger == "api" || trigger == "resync" {
		d.reload(trigger)
	}
	des := d.desired
	var applied netcfg.Plans
	var syncErr error
	if d.hash == d.badHash && d.lastGood != nil {
		// Rolled back: keep the previous state until the config changes.
		des = *d.lastGood
	}
	pre, perr := d.cv.Plan(ctx, des)
	if perr == nil && pre.Empty() {
		applied = pre
	} else {
		applied, syncErr = d.apply(ctx, des, pre)
	}
	post, postErr := d.cv.Plan(ctx, des)
	if postErr != nil && syncErr == nil {
		syncErr = postErr
	}
	if trigger == "start" || trigger == "resync" {
		d.checkARP(ctx)
	}
	pending, skipped, failed := netcfg.Split(syncErr)
	if perr != nil {
		_, _, f := netcfg.Split(perr)
		failed = append(failed, f...)
	}
	d.publish(trigger, start, applied, post, pending, skipped, failed)
	if len(failed) > 0 {
		return errors.Join(failed...)
	}
	if !d.ready {
		d.ready = true
		d.notify.Ready(d.summary())
	} else {
		d.notify.Status(d.summary())
	}
	return nil
}

// apply converges to des, with safe apply around changes to links, routes,
// rules, nftables or WireGuard devices: probes that pass before are run
// again after, and one that fails rolls back to the last good state.
func (d *Daemon) apply(ctx context.Context, des netcfg.Desired, pre netcfg.Plans) (netcfg.Plans, error) {
	touches := !pre.Nft.Empty() || !pre.Link.Empty() || !pre.Route.Empty() || pre.WG.Writes()
	var probes []Probe
	passed := map[string]bool{}
	if d.cfg.Checks.SafeApplyOn() && touches && d.lastGood != nil && d.hash != d.badHash {
		probes = Probes(d.host, d.cfg)
		failedBefore := runProbes(ctx, probes)
		for _, p := range probes {
			passed[p.Name] = failedBefore[p.Name] == nil
		}
	}
	applied, err := d.cv.Sync(ctx, des)
	if len(passed) > 0 {
		deadline := d.cfg.Checks.ProbeDeadline
		if deadline == 0 {
			deadline = 10 * time.Second
		}
		if name, perr := recheck(ctx, probes, passed, deadline); name != "" {
			d.log.Error("safe apply: a probe that passed before the change fails after it; rolling back", "probe", name, "err", perr, "config", d.hash)
			back, berr := d.cv.Sync(ctx, *d.lastGood)
			d.badHash = d.hash
			d.metrics.RolledBack(name)
			d.mu.Lock()
			d.status.LastRollback = &api.Rollback{Time: time.Now().UTC(), Probe: name, Message: perr.Error(), ConfigHash: d.hash}
			d.mu.Unlock()
			d.setCondition(api.CondSafeApply, api.False, "RolledBack", fmt.Sprintf("probe %s failed after applying config %s (%v); rolled back, not retried until the config changes", name, d.hash, perr))
			return back, berr
		}
	}
	// The state to roll back to is the last config that applied without
	// breaking a probe, whether or not some object of it failed (a
	// conflict on one link must not switch safe apply off for good).
	if d.hash != d.badHash {
		good := des
		d.lastGood = &good
		if d.status.LastRollback != nil {
			d.setCondition(api.CondSafeApply, api.True, "Applied", "the running config applied with every probe passing")
		}
	}
	return applied, err
}

// reload re-reads the config. An invalid one is rejected whole: nothing
// changes, the running config stays, and status says which file and line.
func (d *Daemon) reload(trigger string) {
	if trigger != "resync" {
		// systemd wants READY=1 again once a reload is done.
		d.notify.Reloading()
		defer func() {
			if d.ready {
				d.notify.Ready(d.summary())
			} else {
				d.notify.Status(d.summary())
			}
		}()
	}
	old := d.hash
	err := d.load()
	var invalid *InvalidError
	switch {
	case errors.As(err, &invalid):
		lines := capLines(strings.Split(strings.TrimSpace(invalid.Error()), "\n"), maxRejectedLines,
			"nodeagent validate -c "+d.o.Config+" lists the rest")
		d.log.Error("config rejected; the running config stays", "file", d.o.Config, "errors", strings.Join(lines, "; "))
		d.mu.Lock()
		d.status.LastRejected = &api.Rejected{Time: time.Now().UTC(), File: d.o.Config, Errors: lines}
		d.mu.Unlock()
		d.setCondition(api.CondConfigLoaded, api.False, "Rejected", fmt.Sprintf("%s rejected, running config %s: %s", d.o.Config, old, lines[0]))
		d.refreshHealth()
	case err != nil:
		d.log.Error("config unreadable; the running config stays", "err", err)
		d.setCondition(api.CondConfigLoaded, api.False, "Unreadable", err.Error())
		d.refreshHealth()
	default:
		if d.hash != old {
			d.log.Info("config loaded", "hash", d.hash, "trigger", trigger)
		}
		d.setCondition(api.CondConfigLoaded, api.True, "Loaded", "config "+d.hash)
		d.refreshHealth()
		if kc, err := kube.FromConfig(d.cfg); err == nil && d.labeler != nil {
			d.labeler.SetConfig(kc)
		}
		if d.files != nil {
			d.files.set(d.peerDirs(), d.log)
		}
	}
}

// maxRejectedLines bounds the errors a rejected reload keeps in status and
// the log: the first ones say what to fix.
const maxRejectedLines = 20

// capLines keeps the first n lines and a last one counting the rest.
func capLines(lines []string, n int, rest string) []string {
	if len(lines) <= n {
		return lines
	}
	return append(lines[:n:n], fmt.Sprintf("and %d more; %s", len(lines)-n, rest))
}

// checkARP resolves every checks.arpReachable address and reports the
// ARPReachable condition (the seeds' outage: a node that could not ARP a
// VIP it announced itself).
func (d *Daemon) checkARP(ctx context.Context) {
	probes := ARPProbes(d.host, d.cfg)
	if len(probes) == 0 {
		return
	}
	failed := runProbes(ctx, probes)
	if len(failed) == 0 {
		d.setCondition(api.CondARPReachable, api.True, "Resolved", fmt.Sprintf("%d address(es) answer ARP", len(probes)))
		d.refreshHealth()
		return
	}
	var msgs []string
	for _, p := range probes {
		if err := failed[p.Name]; err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	d.setCondition(api.CondARPReachable, api.False, "Unresolved", strings.Join(msgs, "; "))
	d.refreshHealth()
}

func (d *Daemon) peerDirs() []string {
	var dirs []string
	for _, w := range d.cfg.WireGuard {
		if w.PeersDir != "" {
			dirs = append(dirs, w.PeersDir)
		}
	}
	return dirs
}

// answer serves an API request inside the loop.
func (d *Daemon) answer(ctx context.Context, r request) {
	switch r.kind {
	case "plan":
		p, err := d.cv.Plan(ctx, d.desired)
		out := api.Plan{Lines: []string{}}
		for _, l := range strings.Split(strings.TrimSpace(p.String()), "\n") {
			if l != "" {
				out.Lines = append(out.Lines, l)
			}
		}
		if err != nil {
			out.Error = err.Error()
		}
		r.reply <- out
	case "reload":
		old := d.hash
		d.reload("api")
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
			if err := d.sync(ctx, "reload"); err != nil {
				d.log.Warn("sync after reload", "err", err, "previous", old)
			}
		}
	}
}

// ask sends a request to the loop and waits for the answer.
func (d *Daemon) ask(ctx context.Context, kind string) (any, error) {
	r := request{kind: kind, reply: make(chan any, 1)}
	select {
	case d.reqs <- r:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case v := <-r.reply:
		return v, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Status implements apiserver.Backend. LabelsSynced is reported but counts
// toward neither Ready nor Degraded: labels never gate networking.
func (d *Daemon) Status() api.Status {
	d.mu.Lock()
	s := d.status
	s.Conditions = append([]api.Condition(nil), s.Conditions...)
	d.mu.Unlock()
	if d.labeler != nil {
		s.Conditions = append(s.Conditions, d.labeler.Condition())
	}
	return s
}

// Plan implements apiserver.Backend.
func (d *Daemon) Plan(ctx context.Context) api.Plan {
	v, err := d.ask(ctx, "plan")
	if err != nil {
		return api.Plan{Lines: []string{}, Error: err.Error()}
	}
	return v.(api.Plan)
}

// Reload implements apiserver.Backend.
func (d *Daemon) Reload(ctx context.Context) api.Reload {
	v, err := d.ask(ctx, "reload")
	if err != nil {
		return api.Reload{Errors: []string{err.Error()}}
	}
	return v.(api.Reload)
}

// Healthy implements apiserver.Backend: the loop completed a pass within
// the stall bound, which is what systemd's watchdog checks too (the loop
// sends its pings), so /healthz and the watchdog agree.
func (d *Daemon) Healthy() bool {
	return time.Since(time.Unix(0, d.alive.Load())) < d.stallBound()
}

// DefaultStallBound is how long the loop may go without completing a pass
// before /healthz fails, when systemd sets no watchdog.
const DefaultStallBound = 30 * time.Second

// stallBound is RunOptions.StallBound, else systemd's watchdog timeout
// (WatchdogSec=: the loop pings every half of it, and systemd restarts a
// loop that misses two pings), else DefaultStallBound.
func (d *Daemon) stallBound() time.Duration {
	switch {
	case d.o.StallBound > 0:
		return d.o.StallBound
	case d.notify.WatchdogInterval() > 0:
		return d.notify.WatchdogInterval()
	}
	return DefaultStallBound
}

// Metrics returns the daemon's metrics.
func (d *Daemon) Metrics() *metrics.Metrics { return d.metrics }
