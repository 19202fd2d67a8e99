package wg

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Stager fills the kernel WireGuard devices that do not exist yet while
// their peer registers are still being read, at start-up.
//
// Why: a kernel device takes a new peer with a curve25519 computation (the
// static-static secret with the device's key), under the device's lock.
// With thousands of peers that is most of a cold start, and reading and
// checking the register files is most of the rest. Read, then plan, then
// write puts the two end to end. A stage overlaps them: the register's
// peers are written, as soon as they are final (register.LoadStream), to
// a new kernel device under a name of its own ("nastg" and 8 hex digits),
// down, in host.StagingGroup, which no sync owns or touches.
//
// Nothing is half-applied by it. The sync that plans the device's creation
// takes the stage only when it holds exactly what that creation writes:
// the same key, port, fwmark and MTU, and for every peer op the same peer
// written the same way, and no other peer. Then the stage is renamed to
// the device and marked as nodeagent's, and the sync goes on as if it had
// created it (addresses, up), so its report and the state it reads back
// are those of a creation. In any other case the stage is deleted and the
// device created as always. Finish deletes the stages no sync took.
//
// A Stager is for one start-up: Begin uses the host handle, which nothing
// else may use at the same time, and the caller calls Finish after the
// first sync. A stage left by a process that died is deleted by the next
// NewStager.
//
// Stages are deleted in the background (Wait waits for that): the kernel
// deletes a WireGuard device's peers one RCU grace period each
// (netif_napi_del, under RTNL), so a stage of thousands of peers takes
// seconds to delete (90 s under TCG for 5000), which the daemon's loop,
// and the sync that found the stage of no use, must not wait for.
type Stager struct {
	Host *host.Host
	Log  *slog.Logger

	mu       sync.Mutex
	stages   []*Stage
	finished bool
	// begins are the Begins under way, which use Host: Finish waits for
	// them, so that it never uses Host beside one (a start-up read that
	// overran its deadline may still be in Begin).
	begins sync.WaitGroup
	// deletes are the stage deletions under way (deleteLater).
	deletes sync.WaitGroup
	// delLink deletes a link by index on a netlink handle of its own; nil
	// is the kernel's (tests hold a deletion up with their own).
	delLink func(index int) error
}

// stagePrefix begins every staging device's name.
const stagePrefix = "nastg"

// NewStager returns a Stager for h, having deleted the staging devices a
// process that died left behind.
func NewStager(h *host.Host, log *slog.Logger) *Stager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Stager{Host: h, Log: log}
	links, err := h.LinkList()
	if err != nil {
		return s
	}
	for _, l := range links {
		if l.Kind == "wireguard" && l.Group == host.StagingGroup && strings.HasPrefix(l.Name, stagePrefix) {
			s.deleteLater(l.Index, l.Name, "a staging device left behind")
		}
	}
	return s
}

// deleteLater deletes the staging device index (called name; what is
// what it is, for the log) on a goroutine and a netlink handle of its
// own, opened here, so that nothing of Host is used once it returns.
func (s *Stager) deleteLater(index int, name, what string) {
	s.Host.Wrote(1)
	del := s.delLink
	var nl *netlink.Handle
	if del == nil {
		var err error
		if nl, err = netlink.NewHandleAt(s.Host.NS(), unix.NETLINK_ROUTE); err != nil {
			s.Log.Warn("cannot delete "+what, "link", name, "err", err)
			return
		}
		del = func(index int) error { return nl.LinkDel(link(index)) }
	}
	s.deletes.Add(1)
	go func() {
		defer s.deletes.Done()
		if nl != nil {
			defer nl.Close()
		}
		if err := del(index); err != nil {
			s.Log.Warn("cannot delete "+what, "link", name, "err", err)
		} else {
			s.Log.Info("deleted "+what, "link", name)
		}
	}()
}

// Wait waits for the stage deletions under way, up to timeout (0: no
// limit), and reports whether they are done. One cut short goes on in
// the background; a stage a process left at its exit is deleted by the
// next NewStager.
func (s *Stager) Wait(timeout time.Duration) bool {
	if s == nil {
		return true
	}
	done := make(chan struct{})
	go func() { s.deletes.Wait(); close(done) }()
	if timeout <= 0 {
		<-done
		return true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Stage is one staging device (see Stager).
type Stage struct {
	s      *Stager
	h      *Handle // its own generic netlink connection
	name   string
	target string
	index  int
	dev    Device // the device fields it was written with; no peers

	mu    sync.Mutex
	queue []stagedPeer
	// queued is at most the bytes queue takes in messages (60 for a
	// peer's key, flags, keepalive and nests, 28 for each IPv4 allowed
	// IP; more with a preshared key, an endpoint or IPv6). The writer
	// waits for a page of it, as wg(8) fills a message before it sends
	// one, so that its messages stay within ceil(bytes/page)+1.
	queued int
	closed bool
	failed string // why it cannot be used; "" while it can
	taken  bool
	// msgs is how many messages the writer sent, kept when h is closed.
	msgs    int64
	deleted bool
	wake    chan struct{}
	done    chan struct{}
	// written is every peer the writer wrote, by key; the writer's alone
	// until done is closed.
	written map[wgtypes.Key]stagedPeer
	// Took is how long the stage's writes took, for the benchmark's
	// breakdown.
	took time.Duration
}

// Begin starts a stage for dev, or returns nil where there is nothing to
// gain or it cannot: dev is not a kernel device (or auto on a kernel
// without WireGuard), has no key, or exists already.
func (s *Stager) Begin(dev Device) *Stage {
	if s == nil || dev.Broken != "" || dev.PrivateKey.IsZero() || (dev.Impl != ImplKernel && dev.Impl != ImplAuto) {
		return nil
	}
	s.mu.Lock()
	finished := s.finished
	if !finished {
		s.begins.Add(1)
	}
	s.mu.Unlock()
	if finished {
		return nil
	}
	defer s.begins.Done()
	if _, err := s.Host.NL().LinkByName(dev.Name); !errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	h := &Handle{Host: s.Host}
	if _, err := h.kernelConn(); err != nil {
		return nil // no WireGuard in the kernel
	}
	var b [4]byte
	rand.Read(b[:])
	st := &Stage{s: s, h: h, name: stagePrefix + hex.EncodeToString(b[:]), target: dev.Name,
		wake: make(chan struct{}, 1), done: make(chan struct{}), written: map[wgtypes.Key]stagedPeer{}}
	st.dev = Device{Name: dev.Name, Impl: ImplKernel, PrivateKey: dev.PrivateKey, ListenPort: dev.ListenPort, FwMark: dev.FwMark, MTU: dev.MTU}
	made, err := s.Host.LinkCreate(host.LinkSpec{Name: st.name, Kind: "wireguard", MTU: mtuOf(dev), Group: host.StagingGroup})
	if err == nil && made.Index == 0 {
		made.Index, err = indexOf(h, st.name)
	}
	if err != nil {
		h.Close()
		s.Log.Debug("no staging device", "device", dev.Name, "err", err)
		return nil
	}
	st.index = made.Index
	s.mu.Lock()
	s.stages = append(s.stages, st)
	s.mu.Unlock()
	var cfg wgtypes.Config
	setDevice(&cfg, st.dev, deviceFields)
	go st.write(cfg)
	return st
}

// Add queues p, the next peer of the device in order, for writing. A peer
// whose endpoint is a host name is not staged (a sync resolves it), and
// nor is anything after it: the stage is then of no use.
func (st *Stage) Add(p Peer) {
	if st == nil {
		return
	}
	var ep netip.AddrPort
	if p.Endpoint != "" {
		ap, err := netip.ParseAddrPort(p.Endpoint)
		if err != nil {
			st.fail("a peer's endpoint is a name")
			return
		}
		ep = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	st.mu.Lock()
	if st.failed == "" && !st.closed {
		st.queue = append(st.queue, stagedPeer{p, ep})
		st.queued += 60 + 28*len(p.AllowedIPs)
	}
	st.mu.Unlock()
	st.poke()
}

// poke wakes the writer, if it waits.
func (st *Stage) poke() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// Seal says no more peers are coming. The writes go on; the sync that
// takes the stage waits for them, so that it can observe and plan while
// the kernel takes the last peers.
func (st *Stage) Seal() {
	if st == nil {
		return
	}
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
	st.poke()
}

// Close is Seal, and waits for the writes.
func (st *Stage) Close() {
	if st == nil {
		return
	}
	st.Seal()
	<-st.done
}

func (st *Stage) fail(why string) {
	st.mu.Lock()
	if st.failed == "" {
		st.failed = why
	}
	st.queue = nil
	st.mu.Unlock()
	st.poke()
}

// write writes the device's fields with the first peers, then the peers
// queued meanwhile, each time as one packed write once a page of them is
// queued (or no more are coming), until Seal.
func (st *Stage) write(cfg wgtypes.Config) {
	defer close(st.done)
	start := time.Now()
	defer func() { st.took, st.msgs = time.Since(start), st.h.MessageWrites() }()
	first := true
	page := pageLimit()
	for {
		st.mu.Lock()
		closed, failed := st.closed, st.failed
		ready := closed || st.queued >= page
		var batch []stagedPeer
		if ready {
			batch, st.queue, st.queued = st.queue, nil, 0
		}
		st.mu.Unlock()
		if failed != "" {
			return
		}
		if ready && (len(batch) > 0 || first) {
			cfg.Peers = make([]wgtypes.PeerConfig, len(batch))
			for i, sp := range batch {
				cfg.Peers[i] = sp.config()
			}
			if err := st.h.configure(st.name, ImplKernel, cfg); err != nil {
				st.fail(fmt.Sprintf("write: %v", err))
				return
			}
			for _, sp := range batch {
				st.written[sp.p.PublicKey] = sp
			}
			cfg, first = wgtypes.Config{}, false
			continue // more may have come meanwhile
		}
		if closed {
			return
		}
		<-st.wake
	}
}

// take makes the stage device o's new device, if it holds exactly what o
// and the device's peer adds (all[ids]) write (see Stager): renamed, and marked
// as nodeagent's as createDevice marks a device. It returns its index;
// otherwise it deletes the stage and returns false.
func (st *Stage) take(h *Handle, o Op, all []Op, ids []int) (int, bool) {
	if st == nil {
		return 0, false
	}
	st.Close()
	why := st.usable(o, all, ids)
	if why != "" {
		st.s.Log.Debug("staging device not used", "device", o.Device, "why", why)
		st.Discard()
		return 0, false
	}
	// Renamed and marked in one message: never the device's name on an
	// unowned link. If the kernel took part of it, the link is deleted
	// (by index, whatever its name) and the device created as always.
	if err := h.Host.LinkRenameMark(st.index, o.Device); err != nil {
		st.s.Log.Debug("staging device not used", "device", o.Device, "err", err)
		st.Discard()
		return 0, false
	}
	st.mu.Lock()
	st.taken = true
	st.mu.Unlock()
	return st.index, true
}

// usable says why the stage does not hold what o and the peer adds among
// all[ids] write; "" when it does.
func (st *Stage) usable(o Op, all []Op, ids []int) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	w := o.Want
	switch {
	case st.failed != "":
		return st.failed
	case st.taken || st.deleted:
		return "used already"
	case o.Impl != ImplKernel || o.Device != st.target:
		return "another device"
	case w.PrivateKey != st.dev.PrivateKey || w.ListenPort != st.dev.ListenPort || w.FwMark != st.dev.FwMark || mtuOf(w) != mtuOf(st.dev):
		return "the device's settings changed"
	}
	adds := 0
	for _, i := range ids {
		a := &all[i]
		if a.Kind != OpAddPeer {
			continue
		}
		adds++
		if got, ok := st.written[a.PeerID]; !ok || !got.same(a) {
			return "a peer differs"
		}
	}
	if adds != len(st.written) {
		return fmt.Sprintf("%d peers staged, %d to add", len(st.written), adds)
	}
	return ""
}

// stagedPeer is a peer as the stage wrote it: what an OpAddPeer of it
// writes (peerConfig).
type stagedPeer struct {
	p  Peer
	ep netip.AddrPort
}

func (sp stagedPeer) config() wgtypes.PeerConfig {
	return peerConfig(Op{Kind: OpAddPeer, PeerID: sp.p.PublicKey, Peer: sp.p, Endpoint: sp.ep})
}

// same reports whether the add op a writes what sp wrote: peerConfig
// writes an add from these fields alone.
func (sp stagedPeer) same(a *Op) bool {
	p := sp.p
	return a.Kind == OpAddPeer && a.PeerID == p.PublicKey && a.Peer.PublicKey == p.PublicKey && a.Endpoint == sp.ep &&
		settingsDiffer(a.Peer, p.Keepalive, p.PresharedKey, p.AllowedIPs) == 0
}

// Discard deletes the stage device unless a sync took it, in the
// background (deleteLater).
func (st *Stage) Discard() {
	if st == nil {
		return
	}
	st.fail("discarded")
	<-st.done
	st.mu.Lock()
	del := !st.taken && !st.deleted
	st.deleted = st.deleted || del
	st.written = nil
	h := st.h
	st.h = nil
	st.mu.Unlock()
	if h != nil {
		h.Close()
	}
	if del {
		st.s.deleteLater(st.index, st.name, "a staging device no sync took")
	}
}

// Finish deletes every stage no sync took, in the background (Wait). The
// Stager begins no more.
func (s *Stager) Finish() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
	s.begins.Wait()
	s.mu.Lock()
	stages := s.stages
	s.stages = nil
	s.mu.Unlock()
	for _, st := range stages {
		st.Discard()
	}
}

// Took is how long the stage's writes took.
func (st *Stage) Took() time.Duration {
	if st == nil {
		return 0
	}
	<-st.done
	return st.took
}
