package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Apply executes p (Execute) and returns the state it reached, read from
// the snapshot after the sync's writes, with the report of every op.
func Apply(ctx context.Context, s *host.Snapshot, p Plan) (Observed, plan.Report) {
	return plan.Applied(plan.Links, Execute(ctx, s, p), p.Observed, func() (Observed, error) { return Observe(ctx, s.After(), p.Desired) })
}

// Execute carries out exactly p's ops, in plan order, and reports each: an
// op that fails is reported by its object and does not stop the others,
// except the ops on a link whose creation failed, which are skipped with
// that reason. Links it creates and deletes are recorded in s, so that the
// subsystems after it (routes, sysctls) find them by name.
func Execute(ctx context.Context, s *host.Snapshot, p Plan) plan.Report {
	r := p.Report()
	if !r.Writes() {
		return r
	}
	h := s.Host()
	fail := func(i int, err error) { r[i].Err = fmt.Errorf("%s: %w", p.Ops[i].Object(), err) }
	broken := map[string]error{}
	index := map[string]int{}
	mac := map[string]net.HardwareAddr{}
	for name, ol := range p.Observed.Links {
		index[name] = ol.Index
		mac[name] = p.Observed.MACs[ol.Index]
	}
	var addrOps []int
	nextIndex := p.Observed.MaxIndex + 1
	for i, o := range p.Ops {
		if err := broken[o.Link]; err != nil && o.Kind != OpDeleteLink {
			fail(i, fmt.Errorf("skipped: %w", err))
			continue
		}
		var err error
		switch o.Kind {
		case OpDeleteLink:
			err = deleteLink(h, o.Old.Index)
			delete(index, o.Link)
			s.Deleted(o.Link)
		case OpCreateLink:
			var l host.Link
			l, err = createLink(h, o.Desired, index, nextIndex)
			nextIndex = max(nextIndex, l.Index) + 1
			if err != nil {
				broken[o.Link] = err
			} else {
				index[o.Link], mac[o.Link] = l.Index, l.HardwareAddr
				s.Created(o.Link, l.Index)
			}
		case OpRenameLink:
			// The kernel renames a link only while it is down.
			if o.Old.Up {
				h.Wrote(1)
				err = h.NL().LinkSetDown(device(o.Old.Index))
			}
			if err == nil {
				err = h.LinkRenameMark(o.Old.Index, o.Link)
			}
			if o.Old.Up {
				h.Wrote(1)
				if uerr := h.NL().LinkSetUp(device(o.Old.Index)); err == nil {
					err = uerr
				}
			}
			if err != nil {
				broken[o.Link] = err
			} else {
				delete(index, o.Old.Name)
				index[o.Link] = o.Old.Index
				s.Deleted(o.Old.Name)
				s.Created(o.Link, o.Old.Index)
			}
		case OpAdoptLink:
			if err = h.LinkMark(o.Old.Index); err != nil {
				broken[o.Link] = err
			}
		case OpReleaseLink:
			err = releaseLink(h, o.Old)
		case OpSetMAC:
			h.Wrote(1)
			if err = h.NL().LinkSetHardwareAddr(device(index[o.Link]), o.Desired.MAC); err == nil {
				mac[o.Link] = o.Desired.MAC
			}
		case OpSetMTU:
			h.Wrote(1)
			err = h.NL().LinkSetMTU(device(index[o.Link]), o.Desired.MTU)
		case OpSetUp:
			h.Wrote(1)
			if o.Desired.Up {
				err = h.NL().LinkSetUp(device(index[o.Link]))
			} else {
				err = h.NL().LinkSetDown(device(index[o.Link]))
			}
		case OpDelAddr:
			err = h.AddrDel(index[o.Link], o.Addr)
		case OpReownAddr:
			// No detection: the address is on this link, only in another
			// form or without the mark. One that lacks only the mark is
			// never deleted to get it (the package comment).
			_, err = h.AddrReown(host.Addr{LinkIndex: index[o.Link], Prefix: o.Addr, Flags: o.OldAddr.Flags}, o.InPlace || len(o.OldAddr.Form) == 0)
			if err == nil && o.Addr.Addr().Is4() {
				mem := claimsOf(h)
				mem.mu.Lock()
				mem.sawOurs(o.Link, o.Addr.Addr(), time.Now())
				mem.mu.Unlock()
			}
		case OpAddAddr:
			addrOps = append(addrOps, i)
		}
		if err != nil {
			fail(i, err)
		}
	}
	addAddrs(ctx, h, p, addrOps, index, mac, r)
	return r
}

// releaseLink unmarks the addresses of ol that carry the mark, in place,
// then the link itself: a failure leaves the link marked, so that a
// second release finds it again.
func releaseLink(h *host.Host, ol ObservedLink) error {
	unmark, _ := releasedAddrs(ol)
	for _, p := range unmark {
		done, err := h.AddrUnmark(ol.Index, p)
		if err != nil {
			return fmt.Errorf("address %s: %w", p, err)
		}
		if !done {
			return fmt.Errorf("address %s: the kernel kept the mark", p)
		}
	}
	return h.LinkUnmark(ol.Index)
}

func device(index int) *netlink.Device {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}}
}

func deleteLink(h *host.Host, index int) error {
	h.Wrote(1)
	err := h.NL().LinkDel(device(index))
	if errors.Is(err, unix.ENODEV) {
		// Already gone (a child goes with its parent): deletion is idempotent.
		return nil
	}
	return err
}

// createLink creates l, asking for ifindex want, and marks it: two
// messages (see host.CreatingGroup). It returns the new link's index and
// hardware address (from the kernel's echo, or a lookup of that one link
// where the kernel echoes nothing).
func createLink(h *host.Host, l Link, index map[string]int, want int) (host.Link, error) {
	pidx, ok := index[l.Parent]
	if !ok {
		p, err := h.NL().LinkByName(l.Parent)
		if err != nil {
			return host.Link{}, fmt.Errorf("parent %s: %w", l.Parent, err)
		}
		pidx = p.Attrs().Index
	}
	spec := host.LinkSpec{
		Name: l.Name, Kind: string(l.Kind), ParentIndex: pidx, Index: want,
		MTU: l.MTU, Up: l.Up, VLANID: l.VLANID, MacvlanMode: kernelMode(l.Mode),
		MAC: l.MAC,
	}
	if l.Kind == Macvlan && spec.MAC == nil {
		spec.MAC = h.StableMAC(l.Name)
	}
	made, err := h.LinkCreate(spec)
	if errors.Is(err, unix.EEXIST) {
		// Someone took that ifindex meanwhile (or the name exists): let the
		// kernel choose, and look the index up.
		spec.Index = 0
		made, err = h.LinkCreate(spec)
	}
	if err != nil {
		return host.Link{}, fmt.Errorf("create %s: %w", describe(l), err)
	}
	if made.Index == 0 {
		nl, err := h.NL().LinkByName(l.Name)
		if err != nil {
			return host.Link{}, fmt.Errorf("find created link: %w", err)
		}
		made = host.Link{Index: nl.Attrs().Index, Name: l.Name, HardwareAddr: nl.Attrs().HardwareAddr}
	}
	if spec.MAC != nil {
		// What DAD and the announcements send from: the address it was
		// made with, whatever an echo said.
		made.HardwareAddr = spec.MAC
	}
	if err := h.LinkMark(made.Index); err != nil {
		// Left with its in-flight group: the next sync marks it.
		return host.Link{}, fmt.Errorf("mark: %w", err)
	}
	return made, nil
}

// addAddrs adds the addresses of the ops at ids (indexes into p.Ops)
// after duplicate-address detection, recording each op's error in r. The
// ARP sockets for every link are opened in one pass and the links are
// probed in parallel, so 1000 links cost one probe wait, not 1000; the same
// sockets then send the announcements.
//
// An address that was nodeagent's moments ago and never in conflict
// (claims.go) is re-added after the quick check, in a first round: its
// links are probed, it is added and announced before the addresses that
// take the full detection (new ones, and ones a conflict was seen for)
// are probed in a second round, so that a repair never waits for another
// address's full detection.
func addAddrs(ctx context.Context, h *host.Host, p Plan, ids []int, index map[string]int, mac map[string]net.HardwareAddr, r plan.Report) {
	if len(ids) == 0 {
		return
	}
	d := p.Desired
	up := map[string]bool{}
	for _, l := range d.Links {
		up[l.Name] = l.Up
	}
	mem := claimsOf(h)
	var quickIDs, fullIDs []int
	claimIDs := map[arp.Config][]int{}
	now := time.Now()
	for _, i := range ids {
		o := p.Ops[i]
		if cfg, ok := d.Claim[o.Addr.Addr()]; ok && o.Addr.Addr().Is4() {
			claimIDs[cfg] = append(claimIDs[cfg], i)
			continue
		}
		if d.DAD != nil && o.Addr.Addr().Is4() && mem.recent(o.Link, o.Addr.Addr(), now) {
			quickIDs = append(quickIDs, i)
		} else {
			fullIDs = append(fullIDs, i)
		}
	}

	// A link that is down cannot probe; its addresses are added unprobed.
	conns := map[string]*arp.Conn{}
	if d.DAD != nil || len(claimIDs) > 0 {
		var ifis []*net.Interface
		seen := map[string]bool{}
		for _, i := range ids {
			o := p.Ops[i]
			_, claim := d.Claim[o.Addr.Addr()]
			if seen[o.Link] || !up[o.Link] || !o.Addr.Addr().Is4() || (d.DAD == nil && !claim) {
				continue
			}
			seen[o.Link] = true
			ifis = append(ifis, &net.Interface{Index: index[o.Link], Name: o.Link, HardwareAddr: mac[o.Link]})
		}
		cs, err := arp.Open(h, ifis)
		if err != nil {
			for _, i := range ids {
				r[i].Err = fmt.Errorf("%s: duplicate-address detection: %w; not added", p.Ops[i].Object(), err)
			}
			return
		}
		for i, c := range cs {
			conns[ifis[i].Name] = c
			defer c.Close()
		}
	}
	var announcing sync.WaitGroup
	// A role's claims first: a take-over waits for no other address's
	// detection.
	for cfg, cids := range claimIDs {
		probeAdd(ctx, h, p, cids, cfg, index, conns, &announcing, r)
	}
	if len(quickIDs) > 0 {
		probeAdd(ctx, h, p, quickIDs, quick(*d.DAD), index, conns, &announcing, r)
	}
	cfg := arp.Config{}
	if d.DAD != nil {
		cfg = *d.DAD
	} else {
		// Detection is off: the sockets opened for a role's claims do
		// not probe the other addresses of their links.
		conns = nil
	}
	probeAdd(ctx, h, p, fullIDs, cfg, index, conns, &announcing, r)
	announcing.Wait()
}

// probeAdd probes the addresses of the ops at ids with cfg on the links of
// conns (links without one are not probed), links in parallel, adds those
// nobody answered for, and starts their announcements in announcing,
// which reports into r. A conflict is remembered (claims.go).
func probeAdd(ctx context.Context, h *host.Host, p Plan, ids []int, cfg arp.Config, index map[string]int, conns map[string]*arp.Conn, announcing *sync.WaitGroup, r plan.Report) {
	if len(ids) == 0 {
		return
	}
	byLink := map[string][]netip.Prefix{}
	var order []string
	for _, i := range ids {
		o := p.Ops[i]
		if _, ok := byLink[o.Link]; !ok {
			order = append(order, o.Link)
		}
		byLink[o.Link] = append(byLink[o.Link], o.Addr)
	}
	type result struct {
		taken map[netip.Addr]net.HardwareAddr
		err   error
	}
	results := make(map[string]*result, len(order))
	var wg sync.WaitGroup
	for _, link := range order {
		res := &result{}
		results[link] = res
		if c := conns[link]; c != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res.taken, res.err = c.Probe(ctx, v4(byLink[link]), cfg)
			}()
		}
	}
	wg.Wait()

	mem := claimsOf(h)
	added := map[string][]netip.Addr{}
	addedOp := map[string][]int{}
	for _, i := range ids {
		o := p.Ops[i]
		res := results[o.Link]
		if res.err != nil {
			r[i].Err = fmt.Errorf("%s: duplicate-address detection: %w", o.Object(), res.err)
			continue
		}
		if m, ok := res.taken[o.Addr.Addr()]; ok {
			mem.sawConflict(o.Link, o.Addr.Addr(), time.Now())
			r[i].Err = fmt.Errorf("%s: not added: %w", o.Object(), &arp.ConflictError{Link: o.Link, IP: o.Addr.Addr(), MAC: m})
			continue
		}
		err := h.AddrAdd(index[o.Link], o.Addr)
		if errors.Is(err, unix.EEXIST) {
			err = nil
		}
		if err != nil {
			r[i].Err = fmt.Errorf("%s: %w", o.Object(), err)
			continue
		}
		if o.Addr.Addr().Is4() {
			mem.mu.Lock()
			mem.sawOurs(o.Link, o.Addr.Addr(), time.Now())
			mem.mu.Unlock()
			added[o.Link] = append(added[o.Link], o.Addr.Addr())
			addedOp[o.Link] = append(addedOp[o.Link], i)
		}
	}
	for link, ips := range added {
		c := conns[link]
		if c == nil {
			continue
		}
		announcing.Add(1)
		go func() {
			defer announcing.Done()
			if err := c.Announce(ctx, ips, cfg); err != nil {
				// Each op's entry is written by this goroutine only.
				for _, i := range addedOp[link] {
					r[i].Err = fmt.Errorf("%s: announce: %w", p.Ops[i].Object(), err)
				}
			}
		}()
	}
}
