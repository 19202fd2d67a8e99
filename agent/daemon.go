package agent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/apiserver"
	"github.com/nodeagent/nodeagent/agent/bindwait"
	"github.com/nodeagent/nodeagent/agent/clientapi"
	"github.com/nodeagent/nodeagent/agent/fight"
	"github.com/nodeagent/nodeagent/agent/gateway"
	"github.com/nodeagent/nodeagent/agent/hookrun"
	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/agent/metrics"
	"github.com/nodeagent/nodeagent/agent/neighbours"
	"github.com/nodeagent/nodeagent/agent/notify"
	"github.com/nodeagent/nodeagent/agent/portfwd"
	"github.com/nodeagent/nodeagent/agent/waiting"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
)

// This file is the daemon's frame: its options and state, how it starts,
// and what the local API asks of it. The loop is in loop.go, a sync with
// safe apply around it in sync.go, reading the config in load.go, and
// status in status.go.

// RunOptions are what the daemon runs with.
type RunOptions struct {
	Options
	// Socket is the local API's unix socket; "" disables it (tests that
	// drive the daemon directly).
	Socket string
	// SocketGroup may read the socket (default "nodeagent").
	SocketGroup string
	// MetricsAddr serves Prometheus metrics on this TCP address, with the
	// forwarded port in gluetun's shape; "" is off. An address not on the
	// node yet is waited for (agent/bindwait).
	MetricsAddr string
	// MetricsAPIKeyFile, when set, holds the key (one line; root's, mode
	// 0600 or stricter) the forwarded port's endpoints ask for.
	MetricsAPIKeyFile string
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
	// PIATimers are the PIA providers' timeouts (zero fields: defaults);
	// tests shorten them.
	PIATimers pia.Timers
	// PortLostAfter and PortHookTimers are test knobs: how long a
	// forwarded port may go unkept before it is lost (default 15m), and
	// the port hooks' backoff and refusal waits (default hookrun's).
	PortLostAfter  time.Duration
	PortHookTimers portfwd.HookTimers
	// Reload, when set, is a channel the caller had SIGHUP delivered to
	// from the process's start (capacity 4 or more), so that one sent
	// while the daemon starts is a reload once it runs rather than the
	// end of the process (SIGHUP's default action); nil: Run listens
	// from its own start.
	Reload chan os.Signal
	// PendingBound is how long objects may wait for a link the config
	// does not create (a parent NIC) before the node is degraded for it
	// (default waiting.DefaultBound; tests shorten it).
	PendingBound time.Duration
	// Hazards is where the hazard checks read the neighbours'
	// configuration (zero: the node's own; tests point it at a fixture
	// tree). HazardSystem, when set, stands for what systemd says on the
	// bus (whether networkd runs, its version, ...): tests set it.
	Hazards      hazard.Paths
	HazardSystem *hazard.System
	// FightBound and FightWindow back off an object repaired FightBound
	// times within FightWindow (agent/fight; zero: its defaults, 10 in a
	// minute). Tests that delete one object many times in a row to time
	// its repair raise the bound.
	FightBound  int
	FightWindow time.Duration
	// TestHooks turns on SIGUSR2, which wedges the reconcile loop for a
	// minute, so tests can prove the watchdog notices.
	TestHooks bool
}

// Daemon is the long-running agent: one goroutine owns convergence (the
// loop); everything else (event sources, the API server) only sends it
// triggers and requests or reads the status it publishes.
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
	// role is the gateway role (nil without one); roleStop ends it, and
	// roleKey is the config it runs with (the loop's alone). runCtx is
	// Run's, which the role's goroutines live in.
	role     *gateway.Role
	roleStop context.CancelFunc
	roleKey  string
	runCtx   context.Context
	// wgStatus makes the status's WireGuard devices (the loop's alone).
	wgStatus wgStatus
	// kicked holds the triggers kickNow was given since the loop last
	// took them, a bit each (1<<trigger); kick wakes the loop. A storm of
	// kernel events may outrun the loop, but no kind of trigger is lost
	// in it: a register file's change (trigPeers) dropped behind a full
	// queue of link events waited for the next resync.
	kicked atomic.Uint32
	kick   chan struct{}
	// savedAt is when the file watch last said the config changed (unix
	// nanoseconds), and reloadAt when the loop last took an operator's
	// reload: a save that follows a reload closely is the reload's own
	// (reloadCovers), whichever the loop read first.
	savedAt  atomic.Int64
	reloadAt time.Time
	// waits follows the objects that wait for a link the config does not
	// create, and since when.
	waits waiting.Tracker
	// held is the sum of the config file last held (saveguard), so that
	// its WARN line is logged once, not at every resync.
	held [32]byte
	// hazardHash and hazardAt are the config and the time of the last
	// hazard check; hazardObs the links the last sync saw. nb follows the
	// neighbours (networkd, udev, ifupdown, NetworkManager); neighbours is
	// signalled when their files or state change.
	hazardHash string
	hazardAt   time.Time
	hazardObs  link.Observed
	nb         *neighbours.Neighbours
	neighbours chan struct{}
	// fights backs off an object another program keeps changing back.
	fights fight.Tracker
	want   atomic.Pointer[interest]
	// waitingFor are the links the last sync's waits named (sorted): the
	// event filter looks for them too, so that one appearing is a sync at
	// once, not at the bound's or the resync's timer.
	waitingFor []string
	files      *fileWatch
	// alive is the last time the loop went round, for /healthz.
	alive atomic.Int64
	// reading is a config read still under way (see read).
	reading chan loaded

	// Loop-owned state: only the loop goroutine touches these.
	cfg     *config.Config
	desired netcfg.Desired
	hash    string
	rawSum  [sha256.Size]byte // of the config's bytes as last loaded
	// loadGen is the file watch's generation before the last full read;
	// quietRuns counts the resyncs since that kept it (quietBase).
	loadGen   uint64
	quietRuns int
	dirIDs    map[string]dirID // what the last full read's directories were
	lastGood  *netcfg.Desired  // the last desired state applied without breaking a probe
	badHash   string           // a config rolled back by safe apply, not retried until it changes
	ready     bool             // the first sync converged with nothing failed (READY=1 sent)
	failures  int              // consecutive failed syncs, for the retry backoff
	// readyLogged: "node ready" was logged, once Ready was True.
	readyLogged bool
	// skipped is what the last sync left out (bad peer files), so each is
	// logged once when it appears, not on every sync.
	skipped map[string]bool
	// syncedHash is the config hash the last sync applied: a sync of the
	// same config repairs drift, one of a new config does not.
	syncedHash string
	// wgConverged: the last full sync converged every WireGuard device, so
	// a register file's change may be applied on its own (syncPeers).
	wgConverged bool
	// forwarding is what the last sync said about forwarding while the
	// kill switch was down ("" when armed), logged when it changes.
	forwarding string
	// replaced is when and why nftables last had its table replaced whole
	// (nft.Replaced), kept for status until the daemon exits.
	replaced string
	// beforeApply and afterApply, when set (by tests), run between a
	// sync's plan and its apply, and after the apply.
	beforeApply func(netcfg.Plans)
	afterApply  func(netcfg.Plans, netcfg.Result)
	// onLoad, when set (by tests), runs after each successful load: quiet
	// when it kept the desired state (quietBase).
	onLoad func(quiet bool)

	// pia are the PIA providers by device; piaEv carries their calls'
	// results back to the loop.
	pia map[string]*piaTunnel
	// piaDevices are pia's names, which the WireGuard poll reads every time.
	piaDevices map[string]bool
	piaEv      chan pia.Event
	// pollCost is what the WireGuard poll's last digest-only polls cost.
	pollCost pollCosts
	// polled, a test's, is called on the loop after each WireGuard poll.
	polled func(pollResult)
	// hookEv carries finished onChange runs back to the loop.
	hookEv chan hookResult
	// ports publishes the forwarded ports (DNAT's port, file, metric,
	// hook); made at the first load (portPublisher).
	ports *portfwd.Manager

	// stager holds the staging devices of the start-up read (staging
	// while it runs) until the first sync has taken them; nil after.
	stager  *wg.Stager
	staging bool

	// stall wedges the loop for the given time (the test hook, also sent
	// by SIGUSR2 when TestHooks is on).
	stall chan time.Duration
	// reqs are the API's requests, answered by the loop.
	reqs chan request

	// clients serves nodeagentctl peer add|disable|enable|remove; peersAt
	// is when the loop last read the peers' figures for the API.
	clients *clientapi.Manager
	peersAt time.Time

	// mu guards status.
	mu     sync.Mutex
	status api.Status
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
	if o.PendingBound == 0 {
		o.PendingBound = waiting.DefaultBound
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
		o: o, log: o.Log, kick: make(chan struct{}, 1), neighbours: make(chan struct{}, 1), reqs: make(chan request), stall: make(chan time.Duration, 1),
		notify: notify.New(o.Log), metrics: metrics.New(), piaEv: make(chan pia.Event, 16), hookEv: make(chan hookResult, 4),
	}
	d.waits.Bound = o.PendingBound
	d.fights.Bound, d.fights.Window = o.FightBound, o.FightWindow
	d.clients = clientapi.New(d.Status, o.Log.With("subsystem", "clients"))
	// A scrape reads the peers' figures as of now (at most once a second).
	d.metrics.SetRefresh(func(ctx context.Context) { d.Peers(ctx) })
	d.host = o.Host
	if d.host == nil {
		h, err := host.Current()
		if err != nil {
			return nil, err
		}
		d.host = h
	}
	// The start-up read fills new kernel WireGuard devices as it reads
	// their registers; the first sync takes them (wg.Stager).
	d.stager = wg.NewStager(d.host, d.log.With("subsystem", "wireguard"))
	// The first load publishes the config's warnings into the status.
	d.status = api.Status{Version: o.Version, ConfigFile: o.Config, Started: time.Now().UTC(), Conditions: []api.Condition{}}
	d.staging = true
	err := d.load(trigStart)
	d.staging = false
	if err != nil {
		finishStager(d.stager, d.log)
		if o.Host == nil {
			d.host.Close()
		}
		return nil, err
	}
	kc, err := kube.FromConfig(d.cfg)
	if err != nil {
		finishStager(d.stager, d.log)
		return nil, err
	}
	d.labeler = kube.New(kc, d.log)
	d.us = wg.NewUserspace(d.log.With("subsystem", "wireguard"))
	d.cv = &netcfg.Converger{Host: d.host, Log: d.log, Userspace: d.us, StateDir: cmp.Or(o.StateDir, pia.DefaultStateDir)}
	d.setCondition(api.CondReady, api.False, "Starting", "the first sync has not finished")
	return d, nil
}

// finishStager deletes the stages of s that no sync took (none once the
// first sync finished it) and waits a little for its deletions before the
// process ends; what that cuts short the next start deletes.
func finishStager(s *wg.Stager, log *slog.Logger) {
	s.Finish()
	if !s.Wait(5 * time.Second) {
		log.Warn("stopping before a staging device is deleted; the next start deletes it")
	}
}

// Run runs the daemon until ctx ends. A clean stop leaves every kernel
// object in place, so a restart does not drop the tunnel.
func (d *Daemon) Run(ctx context.Context) error {
	d.log.Info("starting", "version", d.o.Version, "config", d.o.Config)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer d.us.Close()
	defer d.cv.Close()
	if d.o.Host == nil {
		defer d.host.Close()
	}
	// Before the host is closed: the start-up's stages if no first sync
	// took them (Run failed before it). Their deletion runs in the
	// background; a stop waits a little for it, and what it cuts short
	// the next start deletes.
	stager := d.stager
	defer func() { finishStager(stager, d.log) }()
	if err := watchNetlink(ctx, d.host, &d.want, d.kickNow, d.log); err != nil {
		return fmt.Errorf("rtnetlink events: %w", err)
	}
	if err := watchNftables(ctx, d.host, d.kickNow); err != nil {
		return fmt.Errorf("nftables events: %w", err)
	}
	fw, err := watchFiles(ctx, d.o.Config, d.kickNow, d.log)
	if err != nil {
		return fmt.Errorf("file watch: %w", err)
	}
	d.files = fw
	d.files.set(d.peerDirs(), d.keyFiles(), d.log)
	d.nb = neighbours.Start(ctx, neighbours.Options{Paths: d.o.Hazards, System: d.o.HazardSystem, Log: d.log, Changed: d.neighbourChanged})
	sig := d.o.Reload
	if sig == nil {
		sig = make(chan os.Signal, 4)
	}
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
		var key string
		if d.o.MetricsAPIKeyFile != "" {
			if key, err = metrics.ReadAPIKey(d.o.MetricsAPIKeyFile); err != nil {
				return fmt.Errorf("metrics API key: %w", err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// At boot the address may not be on the node yet: the
			// listener waits for it, beside the loop (agent/bindwait).
			l, err := bindwait.Listen(ctx, d.o.MetricsAddr, bindwait.Options{Host: d.host, Log: d.log, Name: "metrics listener"})
			if err != nil {
				if ctx.Err() == nil {
					d.log.Error("no metrics: the listener could not bind", "err", err)
				}
				return
			}
			if err := d.metrics.ServeListenerKey(ctx, l, key, d.log); err != nil {
				d.log.Error("metrics", "err", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.labeler.Run(ctx)
	}()
	d.portPublisher().Start(ctx)
	d.runCtx = ctx
	d.setRole()
	err = d.loop(ctx, sig)
	d.stopHooks()
	return err
}

// stopHooks ends the port hooks that run (their process groups: SIGTERM,
// then SIGKILL after hookrun.KillGrace) and waits for them, so none is
// left orphaned, or SIGKILLed by systemd before its clean-up ran.
func (d *Daemon) stopHooks() {
	d.ports.Stop()
	if !d.ports.Wait(hookrun.KillGrace + 5*time.Second) {
		d.log.Warn("stopping while a port hook has not ended")
	}
}

// kickNow asks the loop for a sync for why; it never blocks, and why is
// kept until the loop takes it (kicks), however many kicks come first.
func (d *Daemon) kickNow(why trigger) {
	if why == trigConfig {
		d.savedAt.Store(time.Now().UnixNano())
	}
	d.kicked.Or(1 << why)
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// kicks takes the triggers given to kickNow since the last take.
func (d *Daemon) kicks() []trigger {
	var out []trigger
	bits := d.kicked.Swap(0)
	for t := trigger(0); bits != 0; t++ {
		if bits&(1<<t) != 0 {
			out = append(out, t)
			bits &^= 1 << t
		}
	}
	return out
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

// keyFiles are the key files the desired devices were built from.
func (d *Daemon) keyFiles() []string {
	var out []string
	for _, dev := range d.desired.WG.Devices {
		out = append(out, dev.KeyFiles...)
	}
	return out
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
	p, err := ask(ctx, d, func(reply chan api.Plan) request { return planRequest{reply} })
	if err != nil {
		return api.Plan{Lines: []string{}, Error: err.Error()}
	}
	return p
}

// Reload implements apiserver.Backend.
func (d *Daemon) Reload(ctx context.Context) api.Reload {
	r, err := ask(ctx, d, func(reply chan api.Reload) request { return reloadRequest{reply} })
	if err != nil {
		return api.Reload{Errors: []string{err.Error()}}
	}
	return r
}

// AddPeer, ChangePeer and Peers implement apiserver.PeerBackend.
func (d *Daemon) AddPeer(ctx context.Context, req api.PeerAdd) (api.PeerAdded, error) {
	return d.clients.Add(ctx, req)
}

func (d *Daemon) ChangePeer(ctx context.Context, action string, req api.PeerChange) (api.PeerChanged, error) {
	return d.clients.Change(ctx, action, req)
}

func (d *Daemon) Peers(ctx context.Context) []api.WireGuardDevice {
	devs, err := ask(ctx, d, func(reply chan []api.WireGuardDevice) request { return peersRequest{reply} })
	if err != nil {
		return d.Status().WireGuard
	}
	return devs
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
