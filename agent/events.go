package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/mdlayher/netlink"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// interest is what the event filters look for: the names of the links and
// devices the desired state names. The loop replaces it when the config
// changes; the event goroutines only read it.
type interest struct {
	names map[string]bool
}

// watchNetlink sends trigEvent on kick for every rtnetlink notification about
// an object nodeagent owns or the config names: a link of a named or
// nodeagent-aliased link, an address with IFA_PROTO 147 or on a named link,
// a route or rule with protocol 147. Foreign churn (pods coming and going)
// does not wake the loop. It returns when ctx ends.
func watchNetlink(ctx context.Context, h *host.Host, want *atomic.Pointer[interest], kick func(trigger), log *slog.Logger) error {
	// NetNS 0 for the process's own namespace: the socket is then opened
	// without a setns, which needs CAP_SYS_ADMIN (the systemd unit grants
	// only CAP_NET_ADMIN and CAP_NET_RAW).
	cfg := &netlink.Config{}
	if h.NS().IsOpen() {
		cfg.NetNS = int(h.NS())
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, cfg)
	if err != nil {
		return err
	}
	for _, g := range []uint32{unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
		unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE, unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE} {
		if err := c.JoinGroup(g); err != nil {
			c.Close()
			return err
		}
	}
	// Room for a burst (a thousand links coming up at boot); an overflow
	// still loses events, which the loop answers with a full sync.
	c.SetReadBuffer(1 << 20)
	go func() {
		defer c.Close()
		// Index -> name of links seen, so an address event (which names
		// only the index) can be matched to a named link.
		names := map[int32]string{}
		receive(ctx, c, kick, func(m netlink.Message) bool {
			return relevant(uint16(m.Header.Type), m.Data, want.Load(), names)
		})
	}()
	return nil
}

// receive reads c's notifications until ctx ends, kicking the loop with
// trigEvent for a batch holding one that matters and with trigResync when
// notifications were lost. It sleeps in the receive (the runtime's poller)
// until a notification comes: an idle daemon is not woken to look at the
// clock, and the end of ctx closes c, which ends the receive.
func receive(ctx context.Context, c *netlink.Conn, kick func(trigger), matters func(netlink.Message) bool) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	for ctx.Err() == nil {
		msgs, err := c.Receive()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			if lostEvents(err) {
				// ENOBUFS: the kernel dropped notifications, any of
				// which may have been about an owned object.
				kick(trigResync)
				time.Sleep(overflowPause)
			}
			continue
		}
		for _, m := range msgs {
			if matters(m) {
				kick(trigEvent)
				break
			}
		}
	}
}

// lostEvents reports whether a receive error means notifications may have
// been lost (an overflow, or the socket failing), as opposed to the
// receive timeout that lets the goroutine notice ctx.
func lostEvents(err error) bool {
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return true
}

// overflowPause spaces the resyncs a failing event socket asks for, so a
// socket that fails on every receive does not spin.
const overflowPause = 100 * time.Millisecond

// Attribute numbers not in x/sys/unix.
const (
	ifaProto    = 11 // IFA_PROTO
	fraProtocol = 21 // FRA_PROTOCOL
)

func relevant(typ uint16, data []byte, want *interest, names map[int32]string) bool {
	switch typ {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		if len(data) < unix.SizeofIfInfomsg {
			return false
		}
		idx := int32(binary.NativeEndian.Uint32(data[4:8]))
		attrs, err := nl.ParseRouteAttr(data[unix.SizeofIfInfomsg:])
		if err != nil {
			return false
		}
		var name, alias string
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.IFLA_IFNAME:
				name = strings.TrimRight(string(a.Value), "\x00")
			case unix.IFLA_IFALIAS:
				alias = strings.TrimRight(string(a.Value), "\x00")
			}
		}
		switch {
		case typ == unix.RTM_DELLINK:
			delete(names, idx) // the cache holds live links only
		case name != "":
			names[idx] = name
		}
		return alias == host.LinkAlias || (want != nil && want.names[name])
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		if len(data) < unix.SizeofIfAddrmsg {
			return false
		}
		idx := int32(binary.NativeEndian.Uint32(data[4:8]))
		attrs, err := nl.ParseRouteAttr(data[unix.SizeofIfAddrmsg:])
		if err != nil {
			return false
		}
		for _, a := range attrs {
			if a.Attr.Type == ifaProto && len(a.Value) > 0 && a.Value[0] == host.Proto {
				return true
			}
		}
		return want != nil && want.names[names[idx]]
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		// struct rtmsg: family, dst_len, src_len, tos, table, protocol, ...
		return len(data) > 5 && data[5] == host.Proto
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		if len(data) < 12 {
			return false
		}
		attrs, err := nl.ParseRouteAttr(data[12:]) // struct fib_rule_hdr is 12 bytes
		if err != nil {
			return false
		}
		for _, a := range attrs {
			if a.Attr.Type == fraProtocol && len(a.Value) > 0 && a.Value[0] == host.Proto {
				return true
			}
		}
	}
	return false
}

// watchNftables sends trigEvent on kick for every nftables notification about
// a table named nodeagent*. Every nftables object message carries its
// table's name as attribute 1 (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE,
// NFTA_RULE_TABLE, NFTA_SET_TABLE, ...).
func watchNftables(ctx context.Context, h *host.Host, kick func(trigger)) error {
	cfg := &netlink.Config{}
	if h.NS().IsOpen() {
		cfg.NetNS = int(h.NS())
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return err
	}
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		c.Close()
		return err
	}
	c.SetReadBuffer(1 << 20)
	go func() {
		defer c.Close()
		receive(ctx, c, kick, func(m netlink.Message) bool {
			if len(m.Data) < 4 {
				return false
			}
			ad, err := netlink.NewAttributeDecoder(m.Data[4:]) // after struct nfgenmsg
			if err != nil {
				return false
			}
			ad.ByteOrder = binary.BigEndian
			for ad.Next() {
				if ad.Type() == 1 && strings.HasPrefix(ad.String(), "nodeagent") {
					return true
				}
			}
			return false
		})
	}()
	return nil
}

// watchFiles sends trigConfig on kick when the config file or a file in one
// of the peer directories changes. Directories are watched, not files:
// editors and config management replace a file by renaming a new one over
// it, which a watch on the old file would miss. set replaces the watched
// directories (the config may name other peersDirs after a reload).
type fileWatch struct {
	w      *fsnotify.Watcher
	config string
	// whole, while on, reads the config file only once it is whole (see
	// configWrites); its events here then only move gen.
	whole *configWrites
	dirs  atomic.Pointer[map[string]bool]

	// changed are the register files events named since the loop last
	// took them (trigPeers).
	mu      sync.Mutex
	changed map[string]bool

	// gen moves with every event in a watched directory, every watch
	// error (a lost event), and every directory newly watched (its events
	// before the watch are unknown). A resync keeps the desired state
	// when gen is where it was before the last full read (see quietBase).
	gen atomic.Uint64
}

// covers reports whether every one of dirs is watched now (the watch
// drops a directory deleted under it, and one unmounted without an
// event).
func (fw *fileWatch) covers(dirs []string) bool {
	held := fw.w.WatchList()
	for _, d := range dirs {
		if !slices.Contains(held, d) {
			return false
		}
	}
	return true
}

// take returns the register files changed since the last take.
func (fw *fileWatch) take() []string {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	out := make([]string, 0, len(fw.changed))
	for f := range fw.changed {
		out = append(out, f)
	}
	clear(fw.changed)
	slices.Sort(out)
	return out
}

func watchFiles(ctx context.Context, config string, kick func(trigger), log *slog.Logger) (*fileWatch, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	fw := &fileWatch{w: w, config: filepath.Clean(config)}
	fw.whole, err = watchConfigWrites(ctx, fw.config, func() { kick(trigConfig) })
	if err != nil {
		log.Warn("config watch: the config is read on every write, not only once it is whole", "err", err)
	}
	empty := map[string]bool{}
	fw.dirs.Store(&empty)
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				fw.gen.Add(1)
				if ev.Op == fsnotify.Chmod && filepath.Clean(ev.Name) != fw.config {
					continue
				}
				name := filepath.Clean(ev.Name)
				dirs := *fw.dirs.Load()
				switch {
				case name == fw.config && fw.whole.on.Load():
				case name == fw.config || dirs[name]:
					kick(trigConfig)
				case dirs[filepath.Dir(name)]:
					// One register file: the loop may apply just it.
					fw.mu.Lock()
					if fw.changed == nil {
						fw.changed = map[string]bool{}
					}
					fw.changed[name] = true
					fw.mu.Unlock()
					kick(trigPeers)
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				fw.gen.Add(1)
				log.Warn("file watch", "err", err)
			}
		}
	}()
	return fw, nil
}

// set watches the config file's directory, dirs (missing ones are watched
// through their parent, so creating one is noticed) and the directories
// of keyFiles (whose events only move gen).
func (fw *fileWatch) set(dirs, keyFiles []string, log *slog.Logger) {
	want := map[string]bool{filepath.Dir(fw.config): true}
	peerDirs := map[string]bool{}
	for _, d := range dirs {
		d = filepath.Clean(d)
		peerDirs[d] = true
		want[d] = true
		want[filepath.Dir(d)] = true
	}
	for _, f := range keyFiles {
		want[filepath.Dir(filepath.Clean(f))] = true
	}
	// What the watch holds now: a directory deleted since was dropped
	// from it, and one recreated is new again.
	had := map[string]bool{}
	for _, old := range fw.w.WatchList() {
		had[old] = true
		if !want[old] {
			fw.w.Remove(old)
		}
	}
	for d := range want {
		if err := fw.w.Add(d); err != nil {
			if peerDirs[d] {
				log.Debug("watch", "dir", d, "err", err)
			}
			continue
		}
		if !had[d] {
			fw.gen.Add(1)
		}
	}
	fw.dirs.Store(&peerDirs)
}
