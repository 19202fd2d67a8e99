package pia

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Phase is the step a provider is at in bringing its tunnel up. A failed
// step stays the phase while the provider waits to retry it (RetryAt).
type Phase string

// The phases, in the order a tunnel comes up (the list comes first when
// none is cached: its meta servers are asked for the token).
const (
	PhaseToken       Phase = "token"       // getting a token
	PhaseList        Phase = "list"        // fetching the server list
	PhaseServer      Phase = "server"      // choosing the region ("auto": by latency)
	PhaseAddKey      Phase = "addKey"      // registering the key with a server
	PhaseConfiguring Phase = "configuring" // registered; the device is being configured
	PhaseHandshake   Phase = "handshake"   // configured; waiting for the first handshake
	PhaseHealthy     Phase = "healthy"     // handshake seen, the server answers
	// PhaseStandby: the device belongs to a gateway role another node
	// holds (agent/gateway): the token and the server list are kept
	// fresh, nothing is registered, so a take-over is one addKey.
	PhaseStandby Phase = "standby"
)

// Timers are a provider's timeouts and periods. The zero value of a field
// is its default.
type Timers struct {
	// RxStall: nothing received through the tunnel for this long starts
	// probing server_vip (default 3s).
	RxStall time.Duration
	// ProbeEvery is the probe period while nothing is received (2s);
	// ProbeTimeout bounds one probe (1.5s); ProbeFailures in a row mean
	// the server is gone (3).
	ProbeEvery    time.Duration
	ProbeTimeout  time.Duration
	ProbeFailures int
	// HandshakeWait: no handshake this long after the device was
	// configured means the registration did not take (10s).
	HandshakeWait time.Duration
	// HandshakeStale: a last handshake older than this, keepalive running,
	// means the session is dead (180s).
	HandshakeStale time.Duration
	// TokenRefresh is the age at which a token is replaced (23h; PIA's
	// last 24h).
	TokenRefresh time.Duration
	// ListRefresh is the age at which the server list is fetched again
	// (6h).
	ListRefresh time.Duration
	// BackoffMin and BackoffMax bound the retry backoff (1s, 5m).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// CredentialsBackoff is the least wait after PIA refused the
	// credentials (401) or the subscription (402): retrying sooner only
	// gets the account locked (15m).
	CredentialsBackoff time.Duration
	// ServerFailures on one server move to the region's next (3).
	ServerFailures int
	// BindEvery is how often the forwarded port is bound again (15m; PIA
	// removes a port not bound for that long).
	BindEvery time.Duration
	// BindRetry is the wait after a failed bind, with a new signature
	// (5s).
	BindRetry time.Duration
	// RenewBefore: a signature with less than this left is replaced (7
	// days; a payload lasts about two months).
	RenewBefore time.Duration
	// DNSEvery is how often PIA's resolvers are probed for the one DNS is
	// sent to (5m).
	DNSEvery time.Duration
	// MaxRequests is the most HTTP requests a provider sends to PIA
	// (token, list, addKey, getSignature, bindPort, all counted together)
	// within any RequestWindow, whatever PIA's answers ask (30 in 1m).
	// Normal operation sends a handful an hour; a faulty or hostile answer
	// (a Retry-After of 0, an instant 500) no longer makes a storm.
	MaxRequests   int
	RequestWindow time.Duration
	// Now is the wall clock (default time.Now): tokens, signatures and
	// certificates are judged by it, and a step of it is noticed. The
	// soak steps it (nodeagent run's test hooks); intervals are measured
	// on the monotonic clock whatever it says.
	Now func() time.Time
}

func (t Timers) withDefaults() Timers {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&t.RxStall, 3*time.Second)
	def(&t.ProbeEvery, 2*time.Second)
	def(&t.ProbeTimeout, 1500*time.Millisecond)
	def(&t.HandshakeWait, 10*time.Second)
	def(&t.HandshakeStale, 180*time.Second)
	def(&t.TokenRefresh, 23*time.Hour)
	def(&t.ListRefresh, 6*time.Hour)
	def(&t.BackoffMin, time.Second)
	def(&t.BackoffMax, 5*time.Minute)
	def(&t.CredentialsBackoff, 15*time.Minute)
	def(&t.BindEvery, 15*time.Minute)
	def(&t.BindRetry, 5*time.Second)
	def(&t.RenewBefore, 7*24*time.Hour)
	def(&t.DNSEvery, 5*time.Minute)
	def(&t.RequestWindow, time.Minute)
	if t.MaxRequests <= 0 {
		t.MaxRequests = 30
	}
	if t.ProbeFailures <= 0 {
		t.ProbeFailures = 3
	}
	if t.ServerFailures <= 0 {
		t.ServerFailures = 3
	}
	return t
}

// Keepalive is the persistent keepalive of a PIA tunnel (PIA.md §3).
const Keepalive = 25 * time.Second

// Config is one PIA device's provider configuration.
type Config struct {
	Device string
	// Budget is the budget of the provider this one replaces (its
	// Budget()); the zero value starts a new one.
	Budget Budget
	// KeyFile is the device's configured private key file; "" means the
	// store keeps a generated key.
	KeyFile     string
	Region      string // an id, or "auto"
	PortForward bool
	// DNS: the device's DNS redirect is on, so its resolvers are probed.
	DNS             bool
	CredentialsFile string
	API             *API
	Store           Store
	Timers          Timers
	// Host is the node's namespace, where probes are sent from.
	Host *host.Host
	// Reserved are the prefixes the node has or its config names (its
	// links' addresses, routes, kill-switch sources): a registration
	// whose peer_ip, server_vip or a resolver lies in one is refused, and
	// a saved one is not re-adopted.
	Reserved []netip.Prefix
	// Count, if set, is told of every registration (result "ok",
	// "login_failed", "error") and token ("issued", "refreshed",
	// "rejected", "error").
	Count func(what, result string)
}

// Boot is what a provider starts from, read off the loop: its key, its
// saved state and the cached server list.
type Boot struct {
	Key    wg.Key
	Saved  Saved
	List   *List
	ListAt time.Time
	// Err is what could not be read (the provider starts without it).
	Err error
}

// ReadBoot reads what the provider of cfg starts from.
func ReadBoot(cfg Config) Boot {
	var b Boot
	var errs []error
	var err error
	if cfg.KeyFile != "" {
		b.Key, err = wg.ReadPrivateKeyFile(cfg.KeyFile)
	} else {
		b.Key, err = cfg.Store.Key(cfg.Device)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("device key: %w", err))
	}
	if b.Saved, err = cfg.Store.Load(cfg.Device); err != nil {
		errs = append(errs, err)
	}
	if b.List, b.ListAt, err = cfg.Store.LoadList(cfg.API.ListURL, cfg.API.ListKey); err != nil {
		errs = append(errs, err)
	}
	b.Err = errors.Join(errs...)
	return b
}

// Observation is the provider's device as the last WireGuard poll saw it.
type Observation struct {
	// Exists: the device exists. Peer is the peer of the registration's
	// server key, if the device has it.
	Exists        bool
	HasPeer       bool
	LastHandshake time.Time
	RxBytes       int64
}

// Event is the result of a provider's network call, handed back to the
// loop that started it.
type Event struct {
	p    *Provider
	kind callKind
	seq  int
	res  any
}

// callKind is which of a provider's call slots an Event is for: the
// registration's steps, the probe, port forwarding, or the DNS probe.
type callKind int

const (
	callMain callKind = iota
	callProbe
	callPF
	callDNS
)

// Probe reports whether ev is a probe's result. An answered probe proves
// the tunnel, so a handshake happened before it: the loop reads the device
// first, so that status never shows a healthy tunnel with no handshake.
func (ev Event) Probe() bool { return ev.kind == callProbe }

// Provider is the state machine that keeps one device registered with PIA.
// Only the loop goroutine calls its methods; its calls run in their own
// goroutines and send an Event back, which the loop passes to Handle.
type Provider struct {
	cfg    Config
	t      Timers
	log    *slog.Logger
	events chan<- Event
	key    wg.Key

	phase   Phase
	token   Secret
	tokenAt time.Time
	// tokenMono is when this process got the token, on the monotonic
	// clock: its age, not tokenAt's, says when to refresh it, so a step
	// of the wall clock neither ages nor rejuvenates it. A token read
	// from the state file has only tokenAt.
	tokenMono time.Time
	list      *List
	listAt    time.Time // when the list in use was fetched (or cached)
	listErr   string    // why the last fetch failed while a cached list is used
	// listWant: fetch the list before its refresh period is up (every
	// server of the region failed; the region is not in it). listFails
	// are the failed fetches since the last good one, while a cached list
	// serves; listRetryAt is when the next may go.
	listWant    bool
	listFails   int
	listRetryAt time.Time
	region      *Region
	cur         int // the server of the region tried next
	fails       map[string]int
	tried       int // servers given up on since the list was last fetched

	reg        *Registration
	needReg    bool      // the registration is dead or missing: register
	configured time.Time // when the device was first seen with reg's peer
	handshake  time.Time // the last handshake seen (the kernel's wall clock)
	// hsBase is the peer's handshake when the device was first seen with
	// reg's peer: a registration that left the peer as it was keeps its
	// session, and only a handshake other than this one is new. hsSeen is
	// when (on this process's monotonic clock) the handshake last changed:
	// its age is measured from that, never from the kernel's wall-clock
	// stamp, which a step of the clock would age by the step.
	hsBase time.Time
	hsSeen time.Time
	// samePeer: reg left the device's peer as the registration before it
	// had it (the same server key, endpoint and address).
	samePeer bool
	// proven: the path through the tunnel has been proven since reg's
	// peer was configured, by a new handshake or an answered probe.
	proven     bool
	rx         int64
	rxAt       time.Time
	probeFails int
	probeAt    time.Time
	probing    bool
	healthy    bool

	// Port forwarding: the signature in use, when the next call on it is
	// due, the port published (bound at least once) and the one onChange
	// last ran for.
	sig      *Signature
	pfBusy   bool
	pfAt     time.Time
	bound    time.Time
	port     int
	notified int
	pfErr    string
	pfTried  bool // a new signature was tried after a failed bind
	pfN      int  // consecutive port-forwarding failures
	// pfTrouble is when the first port-forwarding call failed since the
	// last good bind (zero: none did); sickSince when the tunnel was last
	// seen going unhealthy (zero while healthy). PortTroubleSince reads
	// them.
	pfTrouble time.Time
	sickSince time.Time
	// DNS: the resolver found answering, and when to look again.
	dnsActive netip.Addr
	dnsBusy   bool
	dnsAt     time.Time

	seq      int // of the call in flight, 0 when none
	retryAt  time.Time
	backoffN int
	lastErr  string
	errAt    time.Time
	now      func() time.Time
	// mono is the clock intervals of the tunnel's health are measured on:
	// time.Now, whose readings carry the monotonic clock (Sub uses it).
	mono func() time.Time
	// budget bounds the requests to PIA (Timers.MaxRequests); the
	// provider's copy of the API sends through it. budgetSaid: the
	// refusal was logged.
	budget     *budget
	budgetSaid bool

	// clockBad: the last call failed on a certificate's time alone
	// (ClockError); the provider waits for the clock to be stepped.
	// lastWall and lastMono are the clocks at the last Step.
	clockBad           bool
	lastWall, lastMono time.Time
	// standby: see PhaseStandby and SetStandby.
	standby bool
}

// New returns a provider for cfg, starting from b. Its calls' results go
// to events.
func New(cfg Config, b Boot, events chan<- Event, log *slog.Logger) *Provider {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Provider{cfg: cfg, t: cfg.Timers.withDefaults(), log: log.With("subsystem", "pia", "device", cfg.Device),
		events: events, key: b.Key, fails: map[string]int{}, now: time.Now, mono: time.Now, phase: PhaseToken, needReg: true}
	if cfg.Timers.Now != nil {
		p.now = cfg.Timers.Now
	}
	p.budget = newBudget(p.t.MaxRequests, p.t.RequestWindow, func() time.Time { return p.now() })
	if old := cfg.Budget.b; old != nil && old.n == p.t.MaxRequests && old.window == p.t.RequestWindow {
		// The replaced provider's sends still count.
		p.budget = old
	}
	if cfg.API != nil {
		api := *cfg.API
		api.budget = p.budget
		api.Now = func() time.Time { return p.now() }
		p.cfg.API = &api
	}
	if b.Err != nil {
		p.log.Warn("starting without some saved state", "err", b.Err)
	}
	p.token, p.tokenAt = b.Saved.Token, b.Saved.TokenAt
	p.list, p.listAt = b.List, b.ListAt
	if pf := b.Saved.PF; pf != nil && cfg.PortForward {
		// Bound again from the saved payload, without a new signature;
		// the port stays published, and onChange is not run again.
		p.sig, p.port, p.notified = pf.Sig, pf.Port, pf.Notified
		p.bound, p.pfTrouble = pf.LastBind, pf.FailingSince
	}
	// Not healthy until a handshake is seen: as if it went down now.
	p.sickSince = p.now()
	if r := b.Saved.Reg; r != nil && r.PublicKey == b.Key.PublicKey().String() && p.regionAllows(r.Region) && p.adoptable(r) {
		// Re-adopt: the device runs with this registration (or will, once
		// configured); the handshake says whether it is alive.
		p.reg, p.needReg, p.phase = r, false, PhaseConfiguring
		p.log.Info("re-adopting the saved registration", "server", r.Server.CN, "peer_ip", r.PeerIP, "since", r.At)
	}
	return p
}

// adoptable reports whether a saved registration may run the device: its
// fields as addKey's answer must be, and no address of the node's.
func (p *Provider) adoptable(r *Registration) bool {
	if err := r.check(); err != nil {
		p.log.Warn("not re-adopting the saved registration", "err", err)
		return false
	}
	if msg := r.clash(p.cfg.Reserved); msg != "" {
		p.log.Warn("not re-adopting the saved registration: its "+msg, "server", r.Server.CN)
		return false
	}
	return true
}

// SetReserved sets the prefixes the node has or its config names (read
// again with the config). A running registration that now clashes with
// one is given up at once: the device loses its peer and address, the kill
// switch holds, and a new registration is sought. It reports whether the
// device's desired state changed.
func (p *Provider) SetReserved(reserved []netip.Prefix) bool {
	p.cfg.Reserved = reserved
	if p.reg == nil {
		return false
	}
	msg := p.reg.clash(reserved)
	if msg == "" {
		return false
	}
	p.fail(p.now(), "the registration's "+msg+"; registering again", true)
	p.reg, p.healthy, p.configured = nil, false, time.Time{}
	p.save()
	return true
}

// regionAllows reports whether a registration in region id fits the config.
func (p *Provider) regionAllows(id string) bool {
	if p.cfg.Region != "auto" {
		return id == p.cfg.Region
	}
	if p.list == nil {
		return true
	}
	r, ok := p.list.Region(id)
	return ok && (!p.cfg.PortForward || r.PortForward)
}

// Kick retries a step that waits for its backoff now (a reload or
// SIGHUP: the operator may have fixed the credentials).
func (p *Provider) Kick() { p.retryAt = time.Time{} }

// Key is the device's private key.
func (p *Provider) Key() wg.Key { return p.key }

// Device is d with what PIA gave: the key, the address peer_ip/32 and the
// server as the only peer. Without a registration it has no peer and no
// address: the kill switch holds, nothing leaves by it.
func (p *Provider) Device(d wg.Device) wg.Device {
	return Overlay(d, p.key, p.reg)
}

// Overlay is d as the registration reg (nil: none) and the key make it.
// Without a key d stays as it is: broken, with the reason it has.
func Overlay(d wg.Device, key wg.Key, reg *Registration) wg.Device {
	if key.IsZero() {
		if d.Broken == "" {
			d.Broken = "no private key"
		}
		return d
	}
	d.PrivateKey, d.Broken = key, ""
	d.ListenPort = 0
	d.Addrs, d.Peers = nil, nil
	if reg == nil {
		return d
	}
	sk, err := wgtypes.ParseKey(reg.ServerKey)
	if err != nil {
		return d
	}
	d.Addrs = []netip.Prefix{netip.PrefixFrom(reg.PeerIP, 32)}
	d.Peers = []wg.Peer{{
		PublicKey: sk, Name: "pia " + reg.Server.CN, Endpoint: reg.Endpoint().String(),
		AllowedIPs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, Keepalive: Keepalive, Roams: true,
	}}
	return d
}

// ServerKey is the public key of the registration's server (zero: none).
func (p *Provider) ServerKey() wgtypes.Key {
	if p.reg == nil {
		return wgtypes.Key{}
	}
	k, _ := wgtypes.ParseKey(p.reg.ServerKey)
	return k
}

// Healthy reports whether the tunnel is up: handshake seen after the
// device was configured, recent, and the server answering.
func (p *Provider) Healthy() bool { return p.healthy }

// Registration is the registration the device runs with, if any.
func (p *Provider) Registration() *Registration { return p.reg }

func (p *Provider) count(what, result string) {
	if p.cfg.Count != nil {
		p.cfg.Count(what, result)
	}
}

// SetStandby puts the provider on standby for a gateway role another
// node holds, or takes it off, and reports whether that changed it. On
// standby it registers nothing and forwards no port: the registration it
// ran with is given up (the device is the holder's to have), the port
// with it, and only the token and the server list are kept fresh, each on
// its usual period. Off standby it registers at once.
func (p *Provider) SetStandby(on bool) bool {
	if on == p.standby {
		return false
	}
	p.standby = on
	if on {
		p.log.Info("standing by: the gateway role is another node's; token and server list kept fresh")
		p.reg, p.needReg, p.healthy, p.proven = nil, true, false, false
		p.configured, p.handshake = time.Time{}, time.Time{}
		p.phase = PhaseStandby
		p.loseRole()
		return true
	}
	p.log.Info("taking the gateway role: registering")
	p.phase, p.retryAt, p.backoffN = PhaseToken, time.Time{}, 0
	return true
}

// loseRole drops the forwarded port with the registration: the port was
// the registration's server's, and the next holder binds its own.
func (p *Provider) loseRole() {
	p.sig, p.port, p.bound, p.pfErr, p.pfN, p.pfTried = nil, 0, time.Time{}, "", 0, false
	p.pfTrouble, p.sickSince = time.Time{}, time.Time{}
}

// Standby reports whether the provider stands by (SetStandby).
func (p *Provider) Standby() bool { return p.standby }

// stepStandby is Step on standby: the list and the token are fetched
// when none is at hand or theirs is past its refresh period, nothing else.
func (p *Provider) stepStandby(ctx context.Context, now time.Time) {
	p.phase = PhaseStandby
	if p.seq != 0 || now.Before(p.retryAt) {
		return
	}
	switch {
	case p.list == nil || p.listWant || now.Sub(p.listAt) > p.t.ListRefresh:
		if now.Before(p.listRetryAt) || !p.room(now) {
			return
		}
		p.startList(ctx)
	case p.token == "" || p.tokenAge(now) > p.t.TokenRefresh:
		if p.room(now) {
			p.startToken(ctx)
		}
	}
}

// Step moves the provider on: it looks at the device as observed, judges
// the tunnel's health, and starts the next network call when one is due.
// It reports whether the device's desired state changed (a sync is due).
func (p *Provider) Step(ctx context.Context, obs Observation) (changed bool) {
	now := p.now()
	if d, ok := p.clockStepped(); ok {
		p.log.Info("the system clock was stepped", "by", d.Round(time.Second))
		if p.clockBad {
			// What waited for the clock goes now.
			p.clockBad, p.retryAt = false, time.Time{}
		}
	}
	wasHealthy := p.healthy
	defer func() {
		p.noteHealth(now)
		if p.healthy != wasHealthy {
			changed = true
			if p.healthy {
				p.log.Info("tunnel healthy", "server", p.reg.Server.CN, "peer_ip", p.reg.PeerIP)
			}
		}
	}()
	if p.standby {
		p.stepStandby(ctx, now)
		return false
	}
	if p.reg != nil && !p.needReg {
		if p.watch(ctx, now, obs) {
			return true
		}
	}
	if p.healthy && p.cfg.PortForward {
		p.stepPF(ctx, now)
	}
	if p.healthy && p.cfg.DNS {
		p.stepDNS(ctx, now)
	}
	if p.seq != 0 || now.Before(p.retryAt) {
		return false
	}
	switch {
	case p.listDue(now):
		// The list first: its meta servers give a token without DNS
		// (PIA.md §1), and the region's servers come from it.
		if !p.room(now) {
			return false
		}
		if p.needReg || p.reg == nil {
			p.phase = PhaseList
		}
		p.startList(ctx)
	case p.token == "" || (p.reg == nil || p.needReg) && p.tokenAge(now) > p.t.TokenRefresh:
		if !p.room(now) {
			return false
		}
		p.phase = PhaseToken
		p.startToken(ctx)
	case p.needReg && p.region == nil:
		p.phase = PhaseServer
		p.startRegion(ctx)
	case p.needReg:
		if !p.room(now) {
			return false
		}
		p.phase = PhaseAddKey
		p.startAddKey(ctx)
	case p.healthy && p.tokenAge(now) > p.t.TokenRefresh:
		// A fresh token for the next registration (and port forwarding);
		// the tunnel is left alone.
		if !p.room(now) {
			return false
		}
		p.startToken(ctx)
	}
	return false
}

// listDue reports whether the server list is to be fetched now: there is
// none, one is wanted, or the one in use is past its refresh period while
// it matters (a registration is sought, or the tunnel is up and can take
// the time); never before a failed fetch's backoff is over.
func (p *Provider) listDue(now time.Time) bool {
	if p.list == nil {
		return true
	}
	if now.Before(p.listRetryAt) {
		return false
	}
	return p.listWant || now.Sub(p.listAt) > p.t.ListRefresh && (p.needReg || p.healthy)
}

// room reports whether the budget lets a request to PIA go now; when it
// does not, the main calls wait until it does.
func (p *Provider) room(now time.Time) bool {
	free := p.budget.free(now)
	if !free.After(now) {
		p.budgetSaid = false
		return true
	}
	p.retryAt = free
	if !p.budgetSaid {
		p.budgetSaid = true
		p.log.Warn("tunnel: the budget of requests to PIA is spent; waiting", "requests", p.t.MaxRequests, "window", p.t.RequestWindow, "until", free)
	}
	return false
}

// watch judges the health of a registered device and starts probes; it
// reports whether the registration was given up (a sync is due).
func (p *Provider) watch(ctx context.Context, now time.Time, obs Observation) bool {
	if !obs.Exists || !obs.HasPeer {
		p.phase, p.healthy, p.configured = PhaseConfiguring, false, time.Time{}
		return false
	}
	// Intervals are measured on the monotonic clock (m), which a step of
	// the wall clock does not move.
	m := p.mono()
	if p.configured.IsZero() {
		p.configured, p.rx, p.rxAt, p.probeFails = m, obs.RxBytes, m, 0
		p.hsBase, p.proven = time.Time{}, false
		if p.samePeer {
			p.hsBase = obs.LastHandshake
		}
		if p.hsSeen.IsZero() || !obs.LastHandshake.Equal(p.handshake) {
			// The age of a handshake made before we watched is all the
			// kernel's stamp can tell, bounded so a wrong clock cannot
			// make it more than stale or less than new.
			age := min(max(now.Round(0).Sub(obs.LastHandshake), 0), p.t.HandshakeStale/2)
			p.handshake, p.hsSeen = obs.LastHandshake, m.Add(-age)
		}
	}
	// A handshake proves the round trip; received bytes only postpone
	// probing (a server whose receive path is dead may still be sending:
	// retransmissions, its keepalives), so they clear no failed probe.
	// The kernel's stamp is compared for change, not for order: a step of
	// the wall clock moves every comparison with it.
	if !obs.LastHandshake.Equal(p.handshake) {
		p.handshake, p.hsSeen, p.probeFails = obs.LastHandshake, m, 0
	}
	if !obs.LastHandshake.IsZero() && !obs.LastHandshake.Equal(p.hsBase) {
		p.proven = true
	}
	if obs.RxBytes != p.rx {
		p.rx, p.rxAt = obs.RxBytes, m
	}
	// Only what proves the path since reg's peer was configured counts: a
	// new handshake, or a probe of server_vip answered through the tunnel.
	// A registration that left the peer as it was (the same server and
	// key) keeps WireGuard's session, and makes no handshake until the
	// session's rekey: demanding one would fail a working tunnel, so the
	// probes prove it instead.
	switch {
	case !p.proven:
		p.phase, p.healthy = PhaseHandshake, false
		if m.Sub(p.configured) > p.t.HandshakeWait {
			p.fail(now, fmt.Sprintf("no handshake with %s and no probe answered through the tunnel within %s of configuring the device", p.reg.Server.CN, p.t.HandshakeWait), true)
			return true
		}
		if !p.probing && m.Sub(p.probeAt) >= p.t.ProbeEvery {
			p.startProbe(ctx)
		}
		return false
	case p.handshake.IsZero() && m.Sub(p.configured) > p.t.HandshakeStale,
		!p.handshake.IsZero() && m.Sub(p.hsSeen) > p.t.HandshakeStale:
		p.fail(now, fmt.Sprintf("no handshake with %s for over %s", p.reg.Server.CN, p.t.HandshakeStale), true)
		return true
	case p.probeFails >= p.t.ProbeFailures:
		p.fail(now, fmt.Sprintf("%d probes of %s (server_vip) through the tunnel went unanswered", p.probeFails, p.reg.ServerVIP), true)
		return true
	}
	if !p.healthy {
		// Up (again): the failures that led here are forgotten.
		p.backoffN = 0
		p.fails = map[string]int{}
		p.tried = 0
	}
	p.phase, p.healthy = PhaseHealthy, true
	if !p.probing && m.Sub(p.rxAt) >= p.t.RxStall && m.Sub(p.probeAt) >= p.t.ProbeEvery {
		p.startProbe(ctx)
	}
	return false
}

// fail records a failed step and when to retry. A server fault gives up
// the registration and counts against the current server; enough of them
// move to the next. Any other failure (a token refresh while the tunnel
// is up) leaves the tunnel's health alone: it is retried with backoff, not
// at once, so it cannot become a loop.
func (p *Provider) fail(now time.Time, reason string, serverFault bool) {
	if p.lastErr != reason {
		p.log.Warn("tunnel: "+reason, "phase", string(p.phase))
	}
	p.lastErr, p.errAt = reason, now
	wasHealthy := p.healthy && serverFault
	if serverFault {
		p.healthy = false
		p.noteHealth(now)
		p.needReg, p.configured, p.probeFails = true, time.Time{}, 0
		if s, ok := p.server(); ok {
			p.fails[s.CN]++
			if p.fails[s.CN] >= p.t.ServerFailures {
				p.nextServer(now, s)
			}
		}
	}
	p.backoffN++
	if wasHealthy {
		// A tunnel that was up is registered again at once.
		p.retryAt = now
		return
	}
	p.retryAt = now.Add(p.backoff(p.t.BackoffMin))
}

// backoff is the wait before retry n (p.backoffN), from least, doubling
// up to BackoffMax, with ±20% jitter.
func (p *Provider) backoff(least time.Duration) time.Duration {
	d := least
	for i := 1; i < p.backoffN && d < p.t.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, max(p.t.BackoffMax, least))
	j := time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
	return j
}

// server is the region's server tried next.
func (p *Provider) server() (Server, bool) {
	if p.region == nil {
		return Server{}, false
	}
	ss := p.region.Servers["wg"]
	if len(ss) == 0 {
		return Server{}, false
	}
	return ss[p.cur%len(ss)], true
}

// nextServer gives up on s: the next server of the region; once all have
// been given up on, the list is fetched again (it may hold others).
func (p *Provider) nextServer(now time.Time, s Server) {
	p.fails[s.CN] = 0
	p.cur++
	p.tried++
	n := len(p.region.Servers["wg"])
	if p.tried >= n {
		p.log.Warn("tunnel: every server of the region failed; fetching the server list again", "region", p.region.ID, "servers", n)
		p.tried = 0
		p.listWant = true
		p.region = nil
		return
	}
	next, _ := p.server()
	p.log.Info("tunnel: moving to the region's next server", "from", s.CN, "to", next.CN)
}

// call runs fn off the loop with a deadline and hands its result back.
func (p *Provider) call(ctx context.Context, timeout time.Duration, fn func(context.Context) any) {
	p.seq++
	p.run(ctx, callMain, p.seq, timeout, fn)
}

// run runs fn in a goroutine with a deadline and sends its result to the
// loop as an Event of kind.
func (p *Provider) run(ctx context.Context, kind callKind, seq int, timeout time.Duration, fn func(context.Context) any) {
	go func() {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		res := fn(cctx)
		select {
		case p.events <- Event{p: p, kind: kind, seq: seq, res: res}:
		case <-ctx.Done():
		}
	}()
}

type (
	tokenResult struct {
		tok Secret
		err error
	}
	listResult struct {
		l   *List
		err error
	}
	regionResult struct {
		r   Region
		lat time.Duration
		err error
	}
	addKeyResult struct {
		reg Registration
		err error
	}
	probeResult struct{ err error }
)

// callTimeout bounds a whole call (a token may try several meta servers).
const callTimeout = 45 * time.Second

func (p *Provider) startToken(ctx context.Context) {
	var meta []Server
	port := 443
	if p.list != nil {
		port = p.list.MetaPort()
		if r := p.tokenRegion(); r != nil {
			meta = r.Servers["meta"]
			if len(meta) > 2 {
				meta = meta[:2]
			}
		}
	}
	file, api := p.cfg.CredentialsFile, p.cfg.API
	p.call(ctx, callTimeout, func(ctx context.Context) any {
		c, err := ReadCreds(file)
		if err != nil {
			return tokenResult{err: fmt.Errorf("credentials: %w", err)}
		}
		tok, err := api.Token(ctx, c, meta, port)
		return tokenResult{tok, err}
	})
}

// tokenRegion is the region whose meta servers are asked for a token.
func (p *Provider) tokenRegion() *Region {
	if p.region != nil {
		return p.region
	}
	id := p.cfg.Region
	if id == "auto" && p.reg != nil {
		id = p.reg.Region
	}
	if r, ok := p.list.Region(id); ok {
		return &r
	}
	return nil
}

func (p *Provider) startList(ctx context.Context) {
	api := p.cfg.API
	p.call(ctx, callTimeout, func(ctx context.Context) any {
		l, err := api.List(ctx)
		return listResult{l, err}
	})
}

func (p *Provider) startRegion(ctx context.Context) {
	if p.cfg.Region != "auto" {
		r, ok := p.list.Region(p.cfg.Region)
		p.seq++
		res := regionResult{r: r}
		if !ok {
			res.err = fmt.Errorf("region %s is not in PIA's server list", p.cfg.Region)
		}
		p.handle(ctx, res)
		return
	}
	// Keep the region of a saved registration if it still qualifies.
	cands := p.list.candidates(p.cfg.PortForward)
	dial, port := p.cfg.API.Dial, p.list.MetaPort()
	p.call(ctx, callTimeout, func(ctx context.Context) any {
		r, lat, err := fastest(ctx, dial, cands, port)
		return regionResult{r, lat, err}
	})
}

func (p *Provider) startAddKey(ctx context.Context) {
	s, ok := p.server()
	if !ok {
		p.seq++
		p.handle(ctx, addKeyResult{err: fmt.Errorf("region %s has no WireGuard server in the list", p.region.ID)})
		return
	}
	api, region, port, tok, pub := p.cfg.API, p.region.ID, p.list.WGPort(), p.token, p.key.PublicKey()
	p.call(ctx, callTimeout, func(ctx context.Context) any {
		reg, err := api.AddKey(ctx, region, s, port, tok, pub)
		return addKeyResult{reg, err}
	})
}

func (p *Provider) startProbe(ctx context.Context) {
	p.probing, p.probeAt = true, p.mono()
	h, dev, vip, timeout := p.cfg.Host, p.cfg.Device, p.reg.ServerVIP, p.t.ProbeTimeout
	p.run(ctx, callProbe, 0, 2*timeout, func(context.Context) any { return probeResult{Ping(h, dev, vip, timeout)} })
}

// Handle takes the result of a call this provider started. It reports
// whether the device's desired state changed.
func (p *Provider) Handle(ctx context.Context, ev Event) bool {
	if ev.p != p {
		return false
	}
	switch ev.kind {
	case callPF:
		p.pfBusy = false
		return p.handlePF(ev.res) || p.Step(ctx, p.lastObs())
	case callDNS:
		p.dnsBusy = false
		return p.handleDNS(ev.res.(dnsResult))
	}
	if ev.kind == callProbe {
		p.probing = false
		if r := ev.res.(probeResult); r.err != nil && p.reg != nil && !p.needReg {
			p.probeFails++
			p.log.Debug("probe failed", "n", p.probeFails, "err", r.err)
		} else if r.err == nil {
			p.probeFails, p.rxAt = 0, p.mono()
			// Proof for this registration only if the probe went out
			// after its peer was configured.
			if p.reg != nil && !p.needReg && !p.configured.IsZero() && !p.probeAt.Before(p.configured) {
				p.proven = true
			}
		}
		return p.Step(ctx, p.lastObs())
	}
	if ev.seq != p.seq {
		return false
	}
	changed := p.handle(ctx, ev.res)
	// On to the next step at once, not at the next poll.
	return p.Step(ctx, p.lastObs()) || changed
}

// lastObs is the observation the health judgement last used, for a Step
// that follows a probe result: nothing new is known of the device.
func (p *Provider) lastObs() Observation {
	return Observation{Exists: !p.configured.IsZero(), HasPeer: !p.configured.IsZero(), LastHandshake: p.handshake, RxBytes: p.rx}
}

// refused takes a call that the budget did not let through: it is tried
// again once there is room, and counts as no failure (nothing was asked).
func (p *Provider) refused(err error) bool {
	be, ok := budgetOf(err)
	if !ok {
		return false
	}
	if be.Until.After(p.retryAt) {
		p.retryAt = be.Until
	}
	if !p.budgetSaid {
		p.budgetSaid = true
		p.log.Warn("tunnel: "+be.Error(), "phase", string(p.phase))
	}
	return true
}

// tokenAge is the age of the token in use: on the monotonic clock for one
// this process got, by the wall clock for one read back from the state.
func (p *Provider) tokenAge(now time.Time) time.Duration {
	if !p.tokenMono.IsZero() {
		return p.mono().Sub(p.tokenMono)
	}
	return now.Sub(p.tokenAt)
}

// clockRetry is how long a call refused for the clock waits when no step
// of the clock is seen (one slewed into place, or a certificate that is
// really out of date).
const clockRetry = time.Minute

// waitClock records a call refused for the clock's sake alone: not a
// fault of the server's, no backoff, status says so, and the call goes
// again as soon as the clock is stepped (Step), or after clockRetry.
func (p *Provider) waitClock(now time.Time, ce *ClockError) {
	msg := ce.Error()
	if !p.clockBad || p.lastErr != msg {
		p.log.Warn("tunnel: "+msg, "phase", string(p.phase))
	}
	p.clockBad = true
	p.lastErr, p.errAt = msg, now
	p.retryAt = now.Add(clockRetry)
}

// resultErr is the error a main call's result carries.
func resultErr(res any) error {
	switch r := res.(type) {
	case tokenResult:
		return r.err
	case listResult:
		return r.err
	case regionResult:
		return r.err
	case addKeyResult:
		return r.err
	}
	return nil
}

// waitAtLeast puts the retry no sooner than d from now.
func (p *Provider) waitAtLeast(now time.Time, d time.Duration) {
	if t := now.Add(d); t.After(p.retryAt) {
		p.retryAt = t
	}
}

// listBackoff is the wait after the n-th failed fetch of the list while a
// cached one serves: 30 BackoffMin doubling, up to the list's refresh
// period (and never under the first step).
func (p *Provider) listBackoff() time.Duration {
	first := 30 * p.t.BackoffMin
	ceil := max(p.t.ListRefresh, first)
	d := first
	for i := 1; i < p.listFails && d < ceil; i++ {
		d *= 2
	}
	d = min(d, ceil)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func (p *Provider) handle(ctx context.Context, res any) bool {
	p.seq = 0
	now := p.now()
	if p.refused(resultErr(res)) {
		return false
	}
	if ce, ok := clockErrorOf(resultErr(res), now); ok {
		p.waitClock(now, ce)
		return false
	}
	if resultErr(res) == nil {
		p.clockBad = false
	}
	switch r := res.(type) {
	case tokenResult:
		var se *StatusError
		switch {
		case r.err == nil:
			refreshed := p.token != ""
			p.token, p.tokenAt, p.tokenMono = r.tok, now, p.mono()
			if p.healthy {
				p.backoffN = 0
			}
			p.save()
			if refreshed {
				p.count("token", "refreshed")
			} else {
				p.count("token", "issued")
			}
			p.log.Info("token issued", "refresh_at", now.Add(p.t.TokenRefresh).Format(time.RFC3339))
		case errors.As(r.err, &se) && se.Credentials():
			p.count("token", "rejected")
			p.fail(now, r.err.Error(), false)
			p.retryAt = now.Add(p.backoff(p.t.CredentialsBackoff))
		case errors.As(r.err, &se) && se.Status == http.StatusTooManyRequests:
			// The longer of what PIA asks and our own backoff: a
			// Retry-After of 0 is no reason to ask again at once.
			p.count("token", "error")
			p.fail(now, r.err.Error(), false)
			p.waitAtLeast(now, se.RetryAfter)
		default:
			p.count("token", "error")
			p.fail(now, "token: "+r.err.Error(), false)
		}
	case listResult:
		if r.err != nil {
			if p.list != nil {
				// The cached list serves meanwhile; the fetch is tried
				// again with its own backoff, which a healthy tunnel does
				// not reset. listAt stays the date of the list in use.
				p.listFails++
				p.listRetryAt = now.Add(p.listBackoff())
				msg := fmt.Sprintf("%v; using the cached list of %s", r.err, p.listAt.UTC().Format(time.RFC3339))
				if p.listErr != msg {
					p.log.Warn("server list refused or unreachable; keeping the cached one", "err", r.err, "cached", p.listAt, "retry_at", p.listRetryAt)
				}
				p.listErr = msg
				return false
			}
			p.fail(now, r.err.Error(), false)
			return false
		}
		if r.l.Dropped > 0 {
			p.log.Warn("server list: entries not used (a cn that is not a host name, an IP that is not unicast IPv4, a region id that is not a plain name)", "dropped", r.l.Dropped)
		}
		p.list, p.listAt, p.listErr = r.l, now, ""
		p.listWant, p.listFails, p.listRetryAt = false, 0, time.Time{}
		if err := p.cfg.Store.SaveList(p.cfg.API.ListURL, r.l); err != nil {
			p.log.Warn("caching the server list", "err", err)
		}
		if p.region != nil {
			// The region's servers may have changed.
			if nr, ok := r.l.Region(p.region.ID); ok {
				p.region = &nr
			}
		}
	case regionResult:
		if r.err != nil {
			p.fail(now, r.err.Error(), false)
			if p.cfg.Region != "auto" {
				// A fresh list may know the region.
				p.listWant = true
			}
			return false
		}
		p.region = &r.r
		if p.reg != nil && p.reg.Region == r.r.ID {
			// Start from the server we were registered with.
			for i, s := range r.r.Servers["wg"] {
				if s.CN == p.reg.Server.CN {
					p.cur = i
				}
			}
		}
		if r.lat > 0 {
			p.log.Info("region chosen by latency", "region", r.r.ID, "latency", r.lat)
		}
	case addKeyResult:
		var se429 *StatusError
		if r.err == nil {
			if msg := r.reg.clash(p.cfg.Reserved); msg != "" {
				r.err = fmt.Errorf("addKey at %s: the answer's %s; refused", r.reg.Server.CN, msg)
			}
		}
		switch {
		case r.err == nil:
			p.count("registration", "ok")
			reg := r.reg
			p.samePeer = p.reg != nil && p.reg.ServerKey == reg.ServerKey && p.reg.Endpoint() == reg.Endpoint() && p.reg.PeerIP == reg.PeerIP
			p.reg, p.needReg = &reg, false
			// The handshake and when it was seen are kept: a peer left
			// as it was keeps its session (watch).
			p.configured, p.healthy = time.Time{}, false
			// Port forwarding binds again as soon as the tunnel is up: a
			// new registration may have lost the port (a new signature if
			// so), and one on another server needs a new signature anyway.
			p.pfAt, p.pfTried, p.dnsAt, p.dnsActive = time.Time{}, false, time.Time{}, netip.Addr{}
			p.phase = PhaseConfiguring
			p.save()
			p.log.Info("registered", "server", reg.Server.CN, "server_ip", reg.ServerIP, "peer_ip", reg.PeerIP)
			return true
		case errors.Is(r.err, ErrLoginFailed):
			p.count("registration", "login_failed")
			first := p.lastErr != r.err.Error()
			p.token = ""
			p.fail(now, r.err.Error(), false)
			if first {
				p.retryAt = now
			}
		case errors.As(r.err, &se429) && se429.Status == http.StatusTooManyRequests:
			// Too many requests is the account's state, not the
			// server's fault: no failover, and the longer of what PIA
			// asks and our own backoff.
			p.count("registration", "error")
			p.fail(now, r.err.Error(), false)
			p.waitAtLeast(now, se429.RetryAfter)
		default:
			p.count("registration", "error")
			p.fail(now, r.err.Error(), true)
		}
	}
	return false
}

func (p *Provider) save() {
	v := Saved{Token: p.token, TokenAt: p.tokenAt, Reg: p.reg}
	if p.sig != nil || p.port != 0 {
		v.PF = &SavedPF{Sig: p.sig, Port: p.port, Notified: p.notified, LastBind: p.bound, FailingSince: p.pfTrouble}
	}
	if err := p.cfg.Store.Save(p.cfg.Device, v); err != nil {
		p.log.Warn("saving the registration", "err", err)
	}
}

// Status is a provider's state for status, with nothing secret in it.
type Status struct {
	Device      string
	Phase       Phase
	Healthy     bool
	Region      string
	Server      Server // cn and IP of the registration's server
	ServerVIP   netip.Addr
	PeerIP      netip.Addr
	Registered  time.Time // when the running registration was made
	Handshake   time.Time // the last handshake seen
	TokenAt     time.Time
	NextToken   time.Time // when the token is refreshed
	List        string    // "fetched 2026-...", or the cached list and why
	LastError   string
	LastErrorAt time.Time
	RetryAt     time.Time // when a failed step is retried; zero when not waiting
	ProbeFails  int
	// Port is the forwarded port (0: none yet); PortExpires when its
	// signature ends; LastBind the last good bind; PortError the last
	// port-forwarding failure.
	Port        int
	PortExpires time.Time
	LastBind    time.Time
	PortError   string
	// PortTroubleSince is when the port stopped being kept bound
	// (PortTroubleSince); zero while it is, or without a port.
	PortTroubleSince time.Time
	// DNS is the resolver the DNS redirect sends to.
	DNS netip.Addr
}

// Status reports the provider's state.
func (p *Provider) Status() Status {
	phase := p.phase
	if p.standby {
		phase = PhaseStandby
	}
	s := Status{Device: p.cfg.Device, Phase: phase, Healthy: p.healthy, Region: p.cfg.Region,
		Handshake: p.handshake, LastError: p.lastErr, LastErrorAt: p.errAt, ProbeFails: p.probeFails}
	if p.region != nil {
		s.Region = p.region.ID
	}
	if p.reg != nil {
		s.Region, s.Server, s.ServerVIP, s.PeerIP, s.Registered = p.reg.Region, p.reg.Server, p.reg.ServerVIP, p.reg.PeerIP, p.reg.At
	}
	if p.token != "" {
		s.TokenAt, s.NextToken = p.tokenAt, p.tokenAt.Add(p.t.TokenRefresh)
	}
	switch {
	case p.listErr != "":
		s.List = p.listErr
		if !p.listRetryAt.IsZero() {
			s.List += "; next try " + p.listRetryAt.UTC().Format(time.RFC3339)
		}
	case p.list != nil:
		s.List = "fetched " + p.listAt.UTC().Format(time.RFC3339)
	}
	if now := p.now(); p.retryAt.After(now) {
		s.RetryAt = p.retryAt
	}
	s.Port, s.LastBind, s.PortError = p.port, p.bound, p.pfErr
	s.PortTroubleSince = p.PortTroubleSince(p.now())
	if p.sig != nil && p.sig.Port == p.port {
		s.PortExpires = p.sig.Expires
	}
	if p.cfg.DNS {
		s.DNS = p.DNS()
	}
	return s
}
