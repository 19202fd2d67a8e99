package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Apply executes p and returns the state it reached. Ops run in plan order;
// an op that fails is reported by its object and does not stop the others,
// except the ops on a link whose creation failed, which are skipped with
// that reason. The returned error joins every failure.
func Apply(ctx context.Context, h *host.Host, p Plan) (Observed, error) {
	if p.Empty() {
		return p.Observed, nil
	}
	var errs []error
	fail := func(o Op, err error) { errs = append(errs, fmt.Errorf("%s: %w", o.Object(), err)) }
	broken := map[string]error{}
	index := map[string]int{}
	for name, ol := range p.Observed.Links {
		index[name] = ol.Index
	}
	var addrOps []Op
	nextIndex := p.Observed.MaxIndex + 1
	for _, o := range p.Ops {
		if err := broken[o.Link]; err != nil && o.Kind != OpDeleteLink {
			fail(o, fmt.Errorf("skipped: %w", err))
			continue
		}
		var err error
		switch o.Kind {
		case OpDeleteLink:
			err = deleteLink(h, o.Old.Index)
			delete(index, o.Link)
		case OpCreateLink:
			var idx int
			idx, err = createLink(h, o.Desired, index, nextIndex)
			nextIndex = max(nextIndex, idx) + 1
			if err != nil {
				broken[o.Link] = err
			} else {
				index[o.Link] = idx
			}
		case OpAdoptLink:
			if err = h.LinkMark(o.Old.Index); err != nil {
				broken[o.Link] = err
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
		case OpAddAddr:
			addrOps = append(addrOps, o)
		case OpConflict:
			err = errors.New(o.Reason)
		case OpPending:
			err = &host.PendingError{Reason: o.Reason}
		}
		if err != nil {
			fail(o, err)
		}
	}
	errs = append(errs, addAddrs(ctx, h, p.Desired, addrOps, index)...)
	obs, err := Observe(ctx, h, p.Desired)
	if err != nil {
		errs = append(errs, err)
	}
	return obs, errors.Join(errs...)
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
// messages (see host.CreatingGroup). It returns the new link's index.
func createLink(h *host.Host, l Link, index map[string]int, want int) (int, error) {
	pidx, ok := index[l.Parent]
	if !ok {
		p, err := h.NL().LinkByName(l.Parent)
		if err != nil {
			return 0, fmt.Errorf("parent %s: %w", l.Parent, err)
		}
		pidx = p.Attrs().Index
	}
	spec := host.LinkSpec{
		Name: l.Name, Kind: string(l.Kind), ParentIndex: pidx, Index: want,
		MTU: l.MTU, Up: l.Up, VLANID: l.VLANID, MacvlanMode: kernelMode(l.Mode),
	}
	err := h.LinkCreate(spec)
	if errors.Is(err, unix.EEXIST) {
		// Someone took that ifindex meanwhile (or the name exists): let the
		// kernel choose, and look the index up.
		spec.Index = 0
		err = h.LinkCreate(spec)
	}
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", describe(l), err)
	}
	idx := want
	if spec.Index == 0 {
		nl, err := h.NL().LinkByName(l.Name)
		if err != nil {
			return 0, fmt.Errorf("find created link: %w", err)
		}
		idx = nl.Attrs().Index
	}
	if err := h.LinkMark(idx); err != nil {
		// Left with its in-flight group: the next sync marks it.
		return 0, fmt.Errorf("mark: %w", err)
	}
	return idx, nil
}

// addAddrs adds addresses after duplicate-address detection. The ARP
// sockets for every link are opened in one pass and the links are probed in
// parallel, so 1000 links cost one probe wait, not 1000; the same sockets
// then send the announcements.
func addAddrs(ctx context.Context, h *host.Host, d Desired, ops []Op, index map[string]int) []error {
	if len(ops) == 0 {
		return nil
	}
	up := map[string]bool{}
	for _, l := range d.Links {
		up[l.Name] = l.Up
	}
	byLink := map[string][]netip.Prefix{}
	var order []string
	for _, o := range ops {
		if _, ok := byLink[o.Link]; !ok {
			order = append(order, o.Link)
		}
		byLink[o.Link] = append(byLink[o.Link], o.Addr)
	}

	// A link that is down cannot probe; its addresses are added unprobed.
	var errs []error
	conns := map[string]*arp.Conn{}
	if d.DAD != nil {
		// One dump for the MACs of the links just created, not one lookup
		// per link.
		links, err := h.LinkList()
		if err != nil {
			return append(errs, fmt.Errorf("duplicate-address detection: %w; no address added", err))
		}
		mac := map[int]net.HardwareAddr{}
		for _, l := range links {
			mac[l.Index] = l.HardwareAddr
		}
		var ifis []*net.Interface
		for _, link := range order {
			if !up[link] || len(v4(byLink[link])) == 0 {
				continue
			}
			ifis = append(ifis, &net.Interface{Index: index[link], Name: link, HardwareAddr: mac[index[link]]})
		}
		cs, err := arp.Open(h, ifis)
		if err != nil {
			return append(errs, fmt.Errorf("duplicate-address detection: %w; no address added", err))
		}
		for i, c := range cs {
			conns[ifis[i].Name] = c
			defer c.Close()
		}
	}

	type result struct {
		taken map[netip.Addr]net.HardwareAddr
		err   error
	}
	results := make(map[string]*result, len(order))
	var wg sync.WaitGroup
	for _, link := range order {
		r := &result{}
		results[link] = r
		if c := conns[link]; c != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.taken, r.err = c.Probe(ctx, v4(byLink[link]), *d.DAD)
			}()
		}
	}
	wg.Wait()

	added := map[string][]netip.Addr{}
	for _, o := range ops {
		r := results[o.Link]
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: duplicate-address detection: %w", o.Object(), r.err))
			continue
		}
		if mac, ok := r.taken[o.Addr.Addr()]; ok {
			errs = append(errs, fmt.Errorf("%s: not added: %w", o.Object(), &arp.ConflictError{Link: o.Link, IP: o.Addr.Addr(), MAC: mac}))
			continue
		}
		err := h.AddrAdd(index[o.Link], o.Addr)
		if errors.Is(err, unix.EEXIST) {
			err = nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.Object(), err))
			continue
		}
		if o.Addr.Addr().Is4() {
			added[o.Link] = append(added[o.Link], o.Addr.Addr())
		}
	}
	var mu sync.Mutex
	for link, ips := range added {
		c := conns[link]
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Announce(ctx, ips, *d.DAD); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}
