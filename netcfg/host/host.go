// Package host is the handle every subsystem converges through: a netlink
// handle bound to one network namespace, a way to run socket-opening code
// inside that namespace, and the ownership marks nodeagent stamps on what it
// creates.
//
// Binding everything to an explicit namespace is what lets a test run the
// real converger inside a throwaway netns without the test process (or any
// other goroutine) ever changing namespace.
package host

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Ownership marks (DESIGN.md §4). They live in the kernel, so they survive
// a restart and let nodeagent adopt its own objects after a crash.
const (
	// LinkAlias is the IFLA_IFALIAS of every link nodeagent created.
	LinkAlias = "nodeagent"
	// Proto is nodeagent's route protocol number, also used as the rule
	// FRA_PROTOCOL and the address IFA_PROTO. packaging/ installs an
	// rt_protos.d entry so `ip route` prints it by name.
	Proto = 147
)

// Host is a handle on one network namespace.
type Host struct {
	ns    netns.NsHandle // netns.None() for the caller's own namespace
	nl    *netlink.Handle
	route *nl.SocketHandle // raw rtnetlink socket for messages vishvananda cannot build
	// strict is an rtnetlink socket with NETLINK_GET_STRICT_CHK, on which
	// the kernel filters route dumps by table and protocol; nil on a
	// kernel without it (before 4.20).
	strict *nl.SocketHandle
	writes atomic.Int64
	dumps  dumps
	// AddrProto reports whether the kernel keeps IFA_PROTO on addresses
	// (Linux 6.1 and later).
	AddrProto bool

	oursMu sync.Mutex
	// ours are the links last seen as nodeagent's, by ifindex; lost
	// those of them gone since, by name, with when (Owned).
	ours map[int]Link
	lost map[string]lostLink
}

// lostLink is a link of nodeagent's that went, and when it was seen gone.
type lostLink struct {
	Link
	at time.Time
}

// ReclaimWindow is how soon after nodeagent's link went another program
// may make one just like it in its place and have it taken for
// nodeagent's: ifupdown's `systemctl restart networking` deletes a VLAN
// named in a stanza (ifdown) and makes it again at once (ifup).
const ReclaimWindow = 10 * time.Second

// Owned reports whether l is nodeagent's: its alias is LinkAlias; or it is
// to be marked again (interrupted): it was born with CreatingGroup and is
// not marked yet; it was seen as nodeagent's under this index and name and
// its alias has been changed since by another program (udev's Alias=, an
// ifupdown description); or it takes the place of a link of
// nodeagent's that went within ReclaimWindow, with its name, kind, parent
// and VLAN id or macvlan mode (made again by ifup). why says which of the
// last two ("" for the others). The kernel
// gives no new link the index of one that exists, and reuses none unasked,
// so an index and name seen as nodeagent's stay nodeagent's however the
// alias changes. Owned is asked about the links of a whole dump, after
// LinksDumped, and followed by Seen with what it found.
func (h *Host) Owned(l Link) (owned, interrupted bool, why string) {
	if l.Alias == LinkAlias {
		return true, false, ""
	}
	if l.Group == CreatingGroup {
		return true, true, ""
	}
	if l.Name == "" {
		return false, false, ""
	}
	h.oursMu.Lock()
	defer h.oursMu.Unlock()
	if o, ok := h.ours[l.Index]; ok && o.Name == l.Name {
		return true, true, RemarkAlias
	}
	if g, ok := h.lost[l.Name]; ok && time.Since(g.at) < ReclaimWindow && g.Kind == l.Kind && g.ParentIndex == l.ParentIndex &&
		g.VLANID == l.VLANID && g.MacvlanMode == l.MacvlanMode && (l.Kind == "vlan" || l.Kind == "macvlan") {
		return true, true, RemarkRemade
	}
	return false, false, ""
}

// Why Owned says a link is nodeagent's without its mark.
const (
	RemarkAlias  = "another program changed its alias, nodeagent's mark"
	RemarkRemade = "another program made it again in the place of nodeagent's, moments after that went"
)

// LinksDumped tells the memory of Owned what a whole link dump holds, before
// Owned is asked about its links: a link seen as nodeagent's before that
// is not there went now.
func (h *Host) LinksDumped(links []Link) {
	h.oursMu.Lock()
	defer h.oursMu.Unlock()
	now := time.Now()
	for name, g := range h.lost {
		if now.Sub(g.at) >= ReclaimWindow {
			delete(h.lost, name)
		}
	}
	present := make(map[int]string, len(links))
	for _, l := range links {
		present[l.Index] = l.Name
	}
	for idx, l := range h.ours {
		if name, ok := present[idx]; !ok || name != l.Name {
			if _, ok := h.lost[l.Name]; !ok && name == "" {
				if h.lost == nil {
					h.lost = map[string]lostLink{}
				}
				h.lost[l.Name] = lostLink{Link: l, at: now}
			}
		}
	}
}

// Seen records which links of the dump are nodeagent's (by index).
func (h *Host) Seen(ours map[int]Link) {
	h.oursMu.Lock()
	defer h.oursMu.Unlock()
	for _, l := range ours {
		delete(h.lost, l.Name)
	}
	h.ours = ours
}

// Current returns a Host for the namespace of the calling process.
func Current() (*Host, error) { return Open(netns.None()) }

// Open returns a Host bound to ns. The caller keeps ownership of ns; pass
// netns.None() for the current namespace.
func Open(ns netns.NsHandle) (*Host, error) {
	h := &Host{ns: ns}
	var err error
	if ns.IsOpen() {
		h.nl, err = netlink.NewHandleAt(ns)
	} else {
		h.nl, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	cur := netns.None()
	var sock *nl.NetlinkSocket
	if ns.IsOpen() {
		cur, err = netns.Get()
		if err != nil {
			h.nl.Close()
			return nil, fmt.Errorf("current netns: %w", err)
		}
		defer cur.Close()
		sock, err = nl.GetNetlinkSocketAt(ns, cur, unix.NETLINK_ROUTE)
	} else {
		sock, err = nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	}
	if err != nil {
		h.nl.Close()
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	h.route = &nl.SocketHandle{Socket: sock}
	h.AddrProto = kernelAtLeast(6, 1)
	if ns.IsOpen() {
		sock, err = nl.GetNetlinkSocketAt(ns, cur, unix.NETLINK_ROUTE)
	} else {
		sock, err = nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	}
	if err == nil {
		if unix.SetsockoptInt(sock.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1) == nil {
			h.strict = &nl.SocketHandle{Socket: sock}
		} else {
			sock.Close()
		}
	}
	return h, nil
}

// Close releases the handle's sockets (not the namespace).
func (h *Host) Close() {
	h.nl.Close()
	h.route.Close()
	if h.strict != nil {
		h.strict.Close()
	}
}

// NL returns the netlink handle bound to the namespace. Callers that write
// through it must count the write with Wrote.
func (h *Host) NL() *netlink.Handle { return h.nl }

// NS returns the namespace handle (netns.None() for the current one).
func (h *Host) NS() netns.NsHandle { return h.ns }

// Wrote records n kernel writes; Writes reads the total. A no-op sync must
// leave it unchanged, which is how tests and benchmarks prove "zero writes".
func (h *Host) Wrote(n int) { h.writes.Add(int64(n)) }

// Writes returns how many kernel writes went through this handle.
func (h *Host) Writes() int64 { return h.writes.Load() }

// Do runs fn on an OS thread that is inside the handle's namespace, for code
// that opens sockets (AF_PACKET for ARP, for example): a socket belongs to
// the namespace of the thread that created it. The caller's own thread never
// changes namespace. If the thread cannot be switched back it is discarded.
func (h *Host) Do(fn func() error) error {
	if !h.ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(h.ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime ends it with the goroutine.
			errc <- fmt.Errorf("leave netns: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || (ma == major && mi >= minor)
}

// PendingError is an object that waits for another (a parent link, a
// tunnel device) and will be converged by a later sync. It is reported,
// but it does not fail the sync: the thing it waits for may come up later.
// Missing names the link it waits for, where it waits for one; the daemon
// tells a link the config will make from one only the node can bring.
type PendingError struct {
	Reason  string
	Missing string
}

func (e *PendingError) Error() string { return "pending: " + e.Reason }

// SkippedError is one entry of a list that could not be used and was left
// out (a register file that does not parse, a peer whose endpoint does not
// resolve), while the object it belongs to is converged without it. It is
// reported and degrades the node, but it is not a failed object: one bad
// peer file must not hold back readiness.
type SkippedError struct{ Reason string }

func (e *SkippedError) Error() string { return e.Reason }

// HeldError is a repair held back on purpose: another program keeps
// changing the object, and nodeagent repairs it less often rather than
// fight (agent/fight). It is reported, not a failure.
type HeldError struct{ Reason string }

func (e *HeldError) Error() string { return "held: " + e.Reason }
