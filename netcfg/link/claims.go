package link

import (
	"net/netip"
	"sync"
	"time"
	"weak"

	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/host"
)

// A re-add of an IPv4 address that was nodeagent's moments ago (someone
// deleted it) is checked with one ARP probe and a short listen, not the
// configured duplicate-address detection, so that the drift is repaired
// in about the time of the loop's debounce, not in seconds.
//
// The full detection (RFC 5227) guards a claim against a host that uses
// the address already, or claims it at the same moment. Until the
// deletion this host answered ARP for the address, so another host can
// only have taken it since: one that took it without detection (an admin
// moving the address by hand) answers ARP at once, and the one probe asks
// it; one running its own detection is still probing within the time of a
// quick re-add (RFC 5227 waits up to a second before its first probe and
// one to two between), and its probe seen while listening, or ours seen
// by it, stops one of the two claims. The listen is quickWait: a host on
// the link answers an ARP request in well under a millisecond when not
// overloaded. No probe at all would miss the admin's move.
//
// What is remembered, per host handle (in the daemon, the process), per
// link name and address: when nodeagent last saw the address as its own
// (each Observe, and each add), and whether detection ever found it in
// use by another host. A re-add is quick when the address was seen as
// nodeagent's within recentWindow and no conflict was ever recorded for
// it; a recorded conflict forces the full detection for as long as it is
// remembered. The memory holds at most claimsMax addresses per handle;
// past that the oldest entries without a conflict go first.
const (
	// recentWindow is how long an address counts as recently nodeagent's.
	// Ten minutes covers a hand deletion noticed at once, a resync long
	// after an event was missed (the loop resyncs every 30 s), and a
	// daemon restart's wait; past it, the address may well have moved to
	// another host on purpose, and is claimed as a new one.
	recentWindow = 10 * time.Minute
	// claimsMax bounds the memory: more than the addresses of a thousand
	// VLANs and their shims, a few hundred kilobytes at most.
	claimsMax = 4096
	// quickWait is how long the one probe of a quick re-add listens.
	quickWait = 30 * time.Millisecond
)

// quick is the check for a re-add, from the configured one: one probe,
// a short listen, the configured announcements.
func quick(cfg arp.Config) arp.Config {
	cfg.Probes = 1
	cfg.Wait = min(cfg.Wait, quickWait)
	return cfg
}

type claimKey struct {
	link string
	ip   netip.Addr
}

type claim struct {
	seen     time.Time // last seen as nodeagent's; zero if never
	conflict bool      // detection found another host using it
}

// claims is the memory of one host handle.
type claims struct {
	mu sync.Mutex
	m  map[claimKey]claim
}

var (
	memoryMu sync.Mutex
	// memory is the claims of each live host handle. A handle that is
	// gone (tests open one per namespace) takes its claims with it:
	// entries whose handle was collected are dropped as new handles come.
	memory = map[weak.Pointer[host.Host]]*claims{}
)

// claimsOf returns h's memory.
func claimsOf(h *host.Host) *claims {
	memoryMu.Lock()
	defer memoryMu.Unlock()
	k := weak.Make(h)
	if c, ok := memory[k]; ok {
		return c
	}
	for w := range memory {
		if w.Value() == nil {
			delete(memory, w)
		}
	}
	c := &claims{m: map[claimKey]claim{}}
	memory[k] = c
	return c
}

// sawOurs records that the address was nodeagent's at now. The caller
// holds c.mu.
func (c *claims) sawOurs(link string, ip netip.Addr, now time.Time) {
	k := claimKey{link, ip}
	e, ok := c.m[k]
	if !ok {
		c.makeRoom(now)
	}
	e.seen = now
	c.m[k] = e
}

// sawConflict records that another host answered for the address.
func (c *claims) sawConflict(link string, ip netip.Addr, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := claimKey{link, ip}
	e, ok := c.m[k]
	if !ok {
		c.makeRoom(now)
	}
	e.conflict = true
	c.m[k] = e
}

// recent reports whether a re-add of the address may take the quick check:
// seen as nodeagent's within recentWindow, and never in conflict.
func (c *claims) recent(link string, ip netip.Addr, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[claimKey{link, ip}]
	return ok && !e.conflict && !e.seen.IsZero() && now.Sub(e.seen) < recentWindow
}

// makeRoom frees a place when the memory is full: entries past the window
// without a conflict first, else the oldest without a conflict, else the
// oldest. It scans the whole map, which happens only when it is full.
func (c *claims) makeRoom(now time.Time) {
	if len(c.m) < claimsMax {
		return
	}
	for k, e := range c.m {
		if !e.conflict && now.Sub(e.seen) >= recentWindow {
			delete(c.m, k)
		}
	}
	if len(c.m) < claimsMax {
		return
	}
	var oldest claimKey
	var at time.Time
	found, foundFree := false, false
	for k, e := range c.m {
		free := !e.conflict
		if !found || (free && !foundFree) || (free == foundFree && e.seen.Before(at)) {
			oldest, at, found, foundFree = k, e.seen, true, free
		}
	}
	delete(c.m, oldest)
}
