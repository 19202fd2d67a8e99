package host

import (
	"maps"
	"slices"
	"sync"
)

// Dump kinds, as Dumped and Dumps count them: one per dump request the
// kernel answers with a whole table.
const (
	DumpLinks     = "links"
	DumpAddresses = "addresses"
	DumpRoutes    = "routes"
	DumpRules     = "rules"
	DumpNftables  = "nftables"  // one read of nodeagent's tables (a few dump requests)
	DumpWireGuard = "wireguard" // one device read
)

// dumps counts the dumps a handle made, by kind.
type dumps struct {
	mu sync.Mutex
	n  map[string]int64
}

// Dumped records one dump of kind.
func (h *Host) Dumped(kind string) {
	h.dumps.mu.Lock()
	defer h.dumps.mu.Unlock()
	if h.dumps.n == nil {
		h.dumps.n = map[string]int64{}
	}
	h.dumps.n[kind]++
}

// Dumps returns how many dumps of each kind went through this handle, the
// way Writes counts writes: a sync's cost in kernel reads.
func (h *Host) Dumps() map[string]int64 {
	h.dumps.mu.Lock()
	defer h.dumps.mu.Unlock()
	return maps.Clone(h.dumps.n)
}

// Snapshot is one sync's view of the namespace's links and addresses.
// Several subsystems need them (links, WireGuard, routes, sysctls); each
// is dumped once, by whichever asks first, and shared. A subsystem that
// creates or deletes a link in the sync says so (Created, Deleted), so the
// ones after it find the link by name without another dump. After the
// sync's writes, After gives a fresh snapshot, shared the same way, for
// the state the sync reached.
//
// A Snapshot is used by one goroutine at a time: the reconcile loop, or a
// one-shot command.
type Snapshot struct {
	h *Host

	links    []Link
	linksErr error
	haveLink bool
	addrs    []Addr
	addrsErr error
	haveAddr bool

	created map[string]int
	deleted map[string]bool
	after   *Snapshot
}

// Snapshot returns an empty snapshot of h's namespace: nothing is read
// until a subsystem asks.
func (h *Host) Snapshot() *Snapshot { return &Snapshot{h: h} }

// Host is the handle the snapshot reads through, for writes and for what
// it does not cover.
func (s *Snapshot) Host() *Host { return s.h }

// Links returns every link in the namespace, dumped on the first call.
func (s *Snapshot) Links() ([]Link, error) {
	if !s.haveLink {
		s.links, s.linksErr = s.h.LinkList()
		s.haveLink = true
	}
	return s.links, s.linksErr
}

// Addrs returns every address in the namespace, dumped on the first call.
func (s *Snapshot) Addrs() ([]Addr, error) {
	if !s.haveAddr {
		s.addrs, s.addrsErr = s.h.AddrList()
		s.haveAddr = true
	}
	return s.addrs, s.addrsErr
}

// LinkIndex returns the index of the link called name: one created in
// this sync, else one of the dump (unless deleted in this sync), else 0.
func (s *Snapshot) LinkIndex(name string) (int, error) {
	if i, ok := s.created[name]; ok {
		return i, nil
	}
	if s.deleted[name] {
		return 0, nil
	}
	links, err := s.Links()
	if err != nil {
		return 0, err
	}
	if i := slices.IndexFunc(links, func(l Link) bool { return l.Name == name }); i >= 0 {
		return links[i].Index, nil
	}
	return 0, nil
}

// Created records that a subsystem created the link name with index.
func (s *Snapshot) Created(name string, index int) {
	if s.created == nil {
		s.created = map[string]int{}
	}
	s.created[name] = index
	delete(s.deleted, name)
}

// Deleted records that a subsystem deleted the link name.
func (s *Snapshot) Deleted(name string) {
	if s.deleted == nil {
		s.deleted = map[string]bool{}
	}
	s.deleted[name] = true
	delete(s.created, name)
}

// After returns the snapshot of the state after this sync's writes: one,
// shared by every subsystem that observes its result.
func (s *Snapshot) After() *Snapshot {
	if s.after == nil {
		s.after = s.h.Snapshot()
	}
	return s.after
}
