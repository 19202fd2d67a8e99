// Package gateway is a role that one node of several holds at a time: the
// VLAN's egress gateway (netcfg/config.Gateway). Every candidate runs the
// same config; the reconcile loop asks the Role whether this node holds the
// role and converges accordingly, like it steps a PIA provider.
//
// Who may hold the role is a Kubernetes Lease, through client-go's leader
// election. Who does hold it is the wire: the gateway addresses. The two
// are tied in both directions:
//
//   - A candidate takes the Lease only while nobody answers ARP for the
//     gateway address (fencedLock), and claims the address only while it
//     holds the Lease and the claim's own duplicate-address probe finds
//     nobody (the link subsystem's detection, at the role's timing).
//   - A holder keeps serving while the Lease cannot be renewed for want of
//     the API server: the Lease still names it, and no standby can take
//     the Lease while it answers on the wire. It gives the address up when
//     the Lease names another node, or when it hears another node answer
//     for the address (then the Lease's holder claims it again: the Lease
//     breaks the tie).
//
// So in every partition at most one node answers for the address: the API
// server gone (nobody can take the Lease; the holder serves on), the
// holder cut from the API server but not from the wire (its Lease runs out,
// but the standby's fence hears it answer; it serves on), the holder gone
// from the wire (power cut, links gone: its Lease runs out, the standby's
// probe hears nothing, it takes over). A holder cut from the wire but not
// from the API server keeps the Lease and serves nobody: that is a failure
// of the node the Lease cannot see, and status says so (its pods' gateway
// does not answer).
//
// The role's labels are on the holder's Node only, under a field manager
// of their own (kube.RoleFieldManager): a holder removes them before it
// gives the address up, and a new holder removes a dead holder's (with the
// Lease's credentials) before it labels its own Node.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
)

// State is where this node stands in the role.
type State string

// The states, as the GatewayRole condition's reason.
const (
	// Standby: another node holds the role (or none does yet); this one
	// is ready to take it.
	Standby State = "Standby"
	// Claiming: the Lease is this node's; the gateway addresses are being
	// probed and claimed.
	Claiming State = "Claiming"
	// Holder: this node answers for the gateway addresses.
	Holder State = "Holder"
	// Fenced: this node may hold the role but another node answers for the
	// gateway address, so it does not claim it (or gave it up on hearing
	// that node).
	Fenced State = "Fenced"
)

// Config is what a Role needs.
type Config struct {
	Role config.Gateway
	// Identity is this node's name, the Lease's holder identity.
	Identity string
	// Lease is the credentials for the Lease (the role's own), and for
	// removing the role's labels from a holder that died.
	Lease *rest.Config
	// Node is the node's own identity, which labels its own Node; nil
	// when the role has no labels.
	Node *rest.Config
	// Host is the namespace the link is in.
	Host *host.Host
	Log  *slog.Logger
	// Changed is called (from any goroutine, never blocking for long)
	// when Want may have changed: the loop syncs.
	Changed func()
}

// Status is the role as status and metrics show it.
type Status struct {
	Role   string
	State  State
	Holder string // the Lease's holder, as last read
	Reason string // one line: why this state
	Since  time.Time
	// LeaseOK: the Lease was read or written within its duration.
	LeaseOK bool
	// Transitions counts state changes since start.
	Transitions int
	// TookOver is how long the last take-over took, from the Lease being
	// this node's to the addresses being claimed.
	TookOver time.Duration
}

// Role is this node's part in a gateway role. Its methods are safe for
// concurrent use.
type Role struct {
	cfg   Config
	log   *slog.Logger
	addrs []netip.Prefix
	v4    []netip.Addr
	elect *election
	lc    *kube.LabelClient // with the Lease's credentials
	nc    *kube.LabelClient // with the node's own
	wake  chan struct{}

	mu sync.Mutex
	// present: the last sync left the gateway addresses on the link;
	// conflict: its detection heard another host for one (with its MAC).
	present  bool
	conflict net.HardwareAddr
	synced   bool
	// heard is when the wire watch last heard another host use a gateway
	// address, and its MAC; fenced: this node gave the address up for it
	// and claims it again only once the fence probe finds the wire free.
	heard    time.Time
	heardMAC net.HardwareAddr
	fenced   bool
	// handing: a hand-over is under way; the role's objects go.
	handing bool
	// yieldTo is the preferred node this holder gives the role to (its
	// take-back request, gateway.preferred.takeBack), since yieldAt; the
	// Lease is released once the addresses are gone.
	yieldTo string
	yieldAt time.Time
	// askedAt is when this preferred node last asked for the role back.
	askedAt time.Time
	state   State
	since   time.Time
	trans   int
	// claimFrom is when the Lease became this node's (for TookOver).
	claimFrom time.Time
	tookOver  time.Duration
	// labelled: the role's labels are on this node's Node as last
	// applied; cleared: the previous holder's were removed.
	labelled, cleared bool
	// startClean: this node's Node has been cleared of the role's labels
	// since start (a holder that died and came back as a standby).
	startClean bool
	labelErr   error
}

// New makes the Role for cfg; nothing runs until Start.
func New(cfg Config) (*Role, error) {
	if cfg.Identity == "" {
		return nil, errors.New("gateway role: no node name")
	}
	if cfg.Lease == nil {
		return nil, errors.New("gateway role: no credentials for the Lease")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	r := &Role{cfg: cfg, log: cfg.Log.With("subsystem", "gateway", "role", cfg.Role.Name), wake: make(chan struct{}, 1), state: Standby, since: time.Now()}
	r.addrs = cfg.Role.GatewayPrefixes()
	for _, p := range r.addrs {
		if p.Addr().Is4() {
			r.v4 = append(r.v4, p.Addr())
		}
	}
	lc, err := coordclient.NewForConfig(rest.CopyConfig(cfg.Lease))
	if err != nil {
		return nil, fmt.Errorf("gateway role: Lease client: %w", err)
	}
	wc, err := coordclient.NewForConfig(rest.CopyConfig(cfg.Lease))
	if err != nil {
		return nil, fmt.Errorf("gateway role: Lease client: %w", err)
	}
	if r.lc, err = kube.NewLabelClient(cfg.Lease); err != nil {
		return nil, fmt.Errorf("gateway role: %w", err)
	}
	if len(cfg.Role.Labels) > 0 {
		if cfg.Node == nil {
			return nil, errors.New("gateway role: labels need the node's own credentials")
		}
		if r.nc, err = kube.NewLabelClient(cfg.Node); err != nil {
			return nil, fmt.Errorf("gateway role: %w", err)
		}
	}
	l := cfg.Role.Lease
	r.elect = &election{
		client: lc, watcher: wc, ns: l.Namespace, name: l.Name, identity: cfg.Identity,
		duration: l.Duration, renew: l.RenewDeadline, retry: l.RetryPeriod,
		fence: r.fence, log: r.log, kick: r.kick, done: make(chan struct{}),
	}
	return r, nil
}

// Start runs the election, the wire watch and the labels until ctx ends.
// What the kernel has is where the role starts from: a daemon restarted
// on the holder (or a role restarted by a reload) finds its addresses in
// place and keeps them until the Lease says otherwise.
func (r *Role) Start(ctx context.Context) {
	r.mu.Lock()
	r.present = r.kernelHas()
	r.mu.Unlock()
	go r.elect.run(ctx)
	go r.watchWire(ctx)
	go r.loop(ctx)
}

// kick re-evaluates the state and tells the loop.
func (r *Role) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Addresses are the gateway addresses.
func (r *Role) Addresses() []netip.Prefix { return slices.Clone(r.addrs) }

// Want reports whether the role's objects belong in the desired state now:
// the gateway addresses, the role's devices, its port and hook.
func (r *Role) Want() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wantLocked(r.elect.view())
}

func (r *Role) wantLocked(v leaseView) bool {
	switch {
	case r.handing, r.fenced, r.yieldTo != "":
		return false
	case v.leading:
		return true
	case v.holder == r.cfg.Identity && r.present:
		// The Lease still names this node but cannot be renewed (the API
		// server is away): the holder serves on. Nobody can take the
		// Lease while it answers on the wire.
		return true
	case v.readAt.IsZero() && r.present:
		// Not yet read since start (a restart, or an API server that is
		// down at boot): keep what the kernel has.
		return true
	}
	return false
}

// Synced tells the role what the last sync left: whether every gateway
// address is on the link, and the MAC of a host the claim's detection
// heard answer for one (nil when none).
func (r *Role) Synced(present bool, conflict net.HardwareAddr) {
	r.mu.Lock()
	r.present, r.conflict, r.synced = present, conflict, true
	r.mu.Unlock()
	r.kick()
}

// Status is the role's state now.
func (r *Role) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.elect.view()
	return Status{Role: r.cfg.Role.Name, State: r.state, Holder: v.holder, Reason: r.reasonLocked(v), Since: r.since,
		LeaseOK: !v.readAt.IsZero() && time.Since(v.readAt) < r.cfg.Role.Lease.Duration, Transitions: r.trans, TookOver: r.tookOver}
}

// Condition is the GatewayRole condition.
func (r *Role) Condition() api.Condition {
	s := r.Status()
	r.mu.Lock()
	refused := r.conflict != nil
	r.mu.Unlock()
	status := api.True
	if s.State == Fenced || (s.State == Claiming && refused) {
		// Claiming is a moment's step; refused, or fenced, the role is
		// not served by this node although the Lease says it may.
		status = api.False
	}
	return api.Condition{Type: api.CondGatewayRole, Status: status, Reason: string(s.State), Message: s.Reason, LastTransitionTime: s.Since}
}

func (r *Role) reasonLocked(v leaseView) string {
	leaseNote := ""
	if v.err != nil {
		leaseNote = fmt.Sprintf("; the Lease cannot be read or renewed: %v", v.err)
	}
	switch r.state {
	case Holder:
		if !v.leading {
			return "this node answers for " + r.addrList() + "; its Lease is not renewed" + leaseNote
		}
		return "this node answers for " + r.addrList() + leaseNote
	case Claiming:
		if r.conflict != nil {
			return fmt.Sprintf("the Lease is this node's; %s answers for %s, so it is not claimed", r.conflict, r.addrList())
		}
		return "the Lease is this node's; claiming " + r.addrList()
	case Fenced:
		return fmt.Sprintf("%s answered for %s; given up until the wire is free%s", r.heardMAC, r.addrList(), leaseNote)
	}
	if v.holder == "" {
		return "no node holds the role" + leaseNote
	}
	return "held by " + v.holder + leaseNote
}

func (r *Role) addrList() string {
	s := ""
	for i, p := range r.addrs {
		if i > 0 {
			s += ", "
		}
		s += p.Addr().String()
	}
	return s
}

// HandOver gives the role up, for a clean stop: the labels leave this
// node's Node, then sync (the loop's, with the role's objects gone since
// Want is false from now on), then the Lease is released so that a
// standby takes it at once. It returns within ctx.
func (r *Role) HandOver(ctx context.Context, sync func(ctx context.Context) error) {
	r.mu.Lock()
	r.handing = true
	was := r.state
	r.mu.Unlock()
	if was == Holder || was == Claiming {
		r.log.Info("gateway role: handing over", "state", was)
		if r.nc != nil {
			if err := r.nc.ApplyRoleLabels(ctx, r.cfg.Identity, nil); err != nil {
				r.log.Warn("gateway role: labels not removed before the hand-over", "err", err)
			}
		}
		if err := sync(ctx); err != nil {
			r.log.Warn("gateway role: the sync that gives the addresses up", "err", err)
		}
	}
	r.elect.handOver(ctx)
}

// loop re-evaluates the state on every change and keeps the labels in
// step, until ctx ends.
func (r *Role) loop(ctx context.Context) {
	tick := time.NewTicker(r.cfg.Role.Lease.RetryPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-tick.C:
			r.retryFenced(ctx)
			r.askBack(ctx)
		}
		if r.step() {
			r.cfg.Changed()
		}
		r.labels(ctx)
		r.mu.Lock()
		release := r.yieldTo != "" && !r.present && r.synced && r.state != Holder
		r.mu.Unlock()
		if release && r.elect.view().leading {
			r.elect.yield()
		}
	}
}

// askBack asks, as the preferred node with take-back on, for the role
// another node holds: a fresh request on the Lease every retry period,
// which the holder answers by handing the role over.
func (r *Role) askBack(ctx context.Context) {
	pref := r.cfg.Role.Preferred
	if !pref.TakeBack || pref.Node != r.cfg.Identity {
		return
	}
	v := r.elect.view()
	r.mu.Lock()
	ask := r.state == Standby && v.holder != "" && v.holder != r.cfg.Identity && v.err == nil
	r.mu.Unlock()
	if !ask {
		return
	}
	if _, err := r.conn(); err != nil {
		return // no link to serve from: nothing to ask for
	}
	c, cancel := context.WithTimeout(ctx, r.cfg.Role.Lease.RetryPeriod)
	defer cancel()
	if err := r.elect.askTakeBack(c); err != nil {
		r.log.Debug("gateway role: asking for the role back", "err", err)
		return
	}
	r.mu.Lock()
	first := r.askedAt.IsZero()
	r.askedAt = time.Now()
	r.mu.Unlock()
	if first {
		r.log.Info("gateway role: the preferred node asks for the role back", "holder", v.holder)
	}
}

// step moves the state to what the inputs say and reports whether Want
// changed.
func (r *Role) step() bool {
	v := r.elect.view()
	r.mu.Lock()
	defer r.mu.Unlock()
	before := r.wantLocked(v)
	if r.state == Holder && !r.heard.IsZero() && time.Since(r.heard) < time.Second && r.present {
		r.fenced = true
	}
	if !v.leading && v.holder != "" && v.holder != r.cfg.Identity {
		// The Lease is another node's: whatever the wire said, this node
		// is not the one to claim.
		r.fenced = false
	}
	pref := r.cfg.Role.Preferred
	switch {
	case r.yieldTo == "" && v.leading && pref.TakeBack && v.takeBack != "" && v.takeBack == pref.Node && v.takeBack != r.cfg.Identity:
		r.yieldTo, r.yieldAt = v.takeBack, time.Now()
		r.log.Info("gateway role: handing the role to the preferred node, which asks for it back", "node", r.yieldTo)
	case r.yieldTo != "" && (v.holder == r.yieldTo || time.Since(r.yieldAt) > 2*r.cfg.Role.Lease.Duration):
		// Taken, or never taken: this node is a candidate like any other.
		r.yieldTo = ""
	}
	want := r.wantLocked(v)
	next := Standby
	switch {
	case r.fenced:
		next = Fenced
	case want && r.present && r.synced:
		next = Holder
	case want:
		next = Claiming
	}
	if next != r.state {
		if next == Claiming && r.claimFrom.IsZero() {
			r.claimFrom = time.Now()
		}
		if next == Holder && !r.claimFrom.IsZero() {
			r.tookOver = time.Since(r.claimFrom)
		}
		if next != Claiming && next != Holder {
			r.claimFrom = time.Time{}
		}
		old := r.state
		r.state, r.since = next, time.Now()
		r.trans++
		r.log.Info("gateway role: "+string(next), "from", string(old), "holder", v.holder, "why", r.reasonLocked(v))
	}
	return want != before
}

// retryFenced probes the wire for a fenced node that holds the Lease: once
// nobody answers for the address, it claims it again.
func (r *Role) retryFenced(ctx context.Context) {
	r.mu.Lock()
	fenced := r.fenced
	r.mu.Unlock()
	if !fenced || !r.elect.view().leading {
		return
	}
	if r.fence(ctx) == nil {
		r.mu.Lock()
		r.fenced, r.heard = false, time.Time{}
		r.mu.Unlock()
		r.kick()
	}
}

// labels keeps the role's labels where the state says: on this node's
// Node while it holds the role, after the previous holder's are removed;
// nowhere else.
func (r *Role) labels(ctx context.Context) {
	if r.nc == nil {
		return
	}
	r.mu.Lock()
	holder, labelled, cleared, startClean := r.state == Holder, r.labelled, r.cleared, r.startClean
	r.mu.Unlock()
	prev := r.elect.view().prev
	var err error
	switch {
	case holder && !cleared && prev != "":
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = r.lc.ApplyRoleLabels(c, prev, nil)
		cancel()
		if err == nil {
			r.log.Info("gateway role: labels removed from the previous holder", "node", prev)
			r.mu.Lock()
			r.cleared = true
			r.mu.Unlock()
			r.kick()
		}
	case holder && !labelled:
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = r.nc.ApplyRoleLabels(c, r.cfg.Identity, r.cfg.Role.Labels)
		cancel()
		if err == nil {
			r.mu.Lock()
			r.labelled = true
			r.mu.Unlock()
		}
	case !holder && (labelled || !startClean):
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = r.nc.ApplyRoleLabels(c, r.cfg.Identity, nil)
		cancel()
		if err == nil {
			r.mu.Lock()
			r.labelled, r.cleared = false, false
			r.startClean = true
			r.mu.Unlock()
		}
	}
	r.mu.Lock()
	r.labelErr = err
	r.mu.Unlock()
	if err != nil {
		r.log.Warn("gateway role: labels", "err", err)
		time.AfterFunc(time.Second, r.kick)
	}
}

// fence probes the wire for another node answering for the gateway
// address: nil when nobody does.
func (r *Role) fence(ctx context.Context) error {
	r.mu.Lock()
	yield := r.yieldTo
	r.mu.Unlock()
	if yield != "" {
		return &errFenced{why: "handing the role to the preferred node " + yield}
	}
	if r.elect.headStart(r.cfg.Role.Preferred.Node) {
		return &errFenced{why: "a head start for the preferred node " + r.cfg.Role.Preferred.Node}
	}
	if len(r.v4) == 0 {
		return nil
	}
	c, err := r.conn()
	if err != nil {
		return &errFenced{why: err.Error()}
	}
	defer c.Close()
	p := r.cfg.Role.Probe
	cfg := arp.Config{Probes: 1, Interval: p.Interval, Wait: min(p.Wait, 300*time.Millisecond)}
	found, err := c.Probe(ctx, r.v4, cfg)
	if err != nil {
		return &errFenced{why: err.Error()}
	}
	for ip, mac := range found {
		return &errFenced{why: fmt.Sprintf("%s answers for %s on %s", mac, ip, r.cfg.Role.Link)}
	}
	return nil
}

// kernelHas reports whether the role's link has every gateway address.
func (r *Role) kernelHas() bool {
	l, err := r.cfg.Host.NL().LinkByName(r.cfg.Role.Link)
	if err != nil {
		return false
	}
	addrs, err := r.cfg.Host.NL().AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return false
	}
	for _, p := range r.addrs {
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
			ap, ok := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			return ok && netip.PrefixFrom(ap.Unmap(), ones) == p
		}) {
			return false
		}
	}
	return len(r.addrs) > 0
}

// conn opens an ARP socket on the role's link.
func (r *Role) conn() (*arp.Conn, error) {
	l, err := r.cfg.Host.NL().LinkByName(r.cfg.Role.Link)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", r.cfg.Role.Link, err)
	}
	a := l.Attrs()
	cs, err := arp.Open(r.cfg.Host, []*net.Interface{{Index: a.Index, Name: a.Name, HardwareAddr: a.HardwareAddr}})
	if err != nil {
		return nil, err
	}
	return cs[0], nil
}

// watchWire listens on the link for another host using a gateway
// address, reopening the socket when the link comes and goes.
func (r *Role) watchWire(ctx context.Context) {
	for ctx.Err() == nil {
		c, err := r.conn()
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		err = c.Watch(ctx, r.v4, func(ip netip.Addr, mac net.HardwareAddr) {
			r.mu.Lock()
			holding := r.state == Holder
			if holding {
				r.heard, r.heardMAC = time.Now(), mac
			}
			r.mu.Unlock()
			if holding {
				r.log.Warn("gateway role: another host answers for the gateway address", "address", ip, "mac", mac)
				r.kick()
			}
		})
		c.Close()
		if ctx.Err() == nil {
			r.log.Debug("gateway role: wire watch ended; reopening", "err", err)
			time.Sleep(time.Second)
		}
	}
}

// FromConfig is the Role's Config for c: the node's name as the Lease's
// holder identity (node.name, else the lowercased hostname, as the kubelet
// registers the Node), the Lease's credentials from gateway.lease.kubeconfig
// (a file root alone may read), and the node's own from
// kubernetes.kubeconfig when the role has labels.
func FromConfig(c *config.Config, h *host.Host, log *slog.Logger, changed func()) (Config, error) {
	g := c.Gateway
	kc, err := kube.FromConfig(c)
	if err != nil {
		return Config{}, err
	}
	lease, err := kube.LoadKubeconfig(g.Lease.Kubeconfig, true)
	if err != nil {
		return Config{}, fmt.Errorf("gateway.lease.kubeconfig: %w", err)
	}
	cfg := Config{Role: *g, Identity: kc.NodeName, Lease: lease, Host: h, Log: log, Changed: changed}
	if len(g.Labels) > 0 {
		if cfg.Node, err = kube.RESTConfig(kc); err != nil {
			return Config{}, fmt.Errorf("kubernetes.kubeconfig: %w", err)
		}
	}
	return cfg, nil
}
