package link

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	for _, o := range p.Ops {
		if err := broken[o.Link]; err != nil && o.Kind != OpDeleteLink && o.Kind != OpDeleteTemp {
			fail(o, fmt.Errorf("skipped: %w", err))
			continue
		}
		var err error
		switch o.Kind {
		case OpDeleteTemp, OpDeleteLink:
			err = deleteLink(h, o.Old.Index)
			delete(index, o.Link)
		case OpCreateLink:
			var idx int
			idx, err = createLink(h, o.Desired, index)
			if err != nil {
				broken[o.Link] = err
			} else {
				index[o.Link] = idx
			}
		case OpAdoptLink:
			h.Wrote(1)
			err = h.NL().LinkSetAlias(device(o.Old.Index), host.LinkAlias)
			if err != nil {
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

// createLink creates l under a temporary name, then names, marks and raises
// it in one message (see host.LinkFinish), and returns its index.
func createLink(h *host.Host, l Link, index map[string]int) (int, error) {
	pidx, ok := index[l.Parent]
	if !ok {
		p, err := h.NL().LinkByName(l.Parent)
		if err != nil {
			return 0, fmt.Errorf("parent %s: %w", l.Parent, err)
		}
		pidx = p.Attrs().Index
	}
	var b [4]byte
	rand.Read(b[:])
	la := netlink.NewLinkAttrs()
	la.Name = host.TempPrefix + hex.EncodeToString(b[:])
	la.ParentIndex = pidx
	la.MTU = l.MTU
	var nl netlink.Link
	switch l.Kind {
	case VLAN:
		nl = &netlink.Vlan{LinkAttrs: la, VlanId: l.VLANID}
	case Macvlan:
		nl = &netlink.Macvlan{LinkAttrs: la, Mode: modeValue(l.Mode)}
	default:
		return 0, fmt.Errorf("unknown link kind %q", l.Kind)
	}
	h.Wrote(1)
	if err := h.NL().LinkAdd(nl); err != nil {
		return 0, fmt.Errorf("create %s: %w", describe(l), err)
	}
	idx := nl.Attrs().Index
	if err := h.LinkFinish(idx, l.Name, l.Up); err != nil {
		// Nothing half-applied: the temporary link goes again.
		deleteLink(h, idx)
		return 0, err
	}
	return idx, nil
}

// addAddrs adds addresses after duplicate-address detection. Probes for all
// links run at once, so 1000 links cost one probe wait, not 1000.
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
	type result struct {
		taken map[netip.Addr]net.HardwareAddr
		err   error
	}
	results := make(map[string]*result, len(order))
	var wg sync.WaitGroup
	for _, link := range order {
		r := &result{}
		results[link] = r
		ips := v4(byLink[link])
		// A link that is down cannot probe; its addresses are added unprobed
		// and announced when nodeagent next sees the link up.
		if d.DAD == nil || !up[link] || len(ips) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.taken, r.err = arp.Probe(ctx, h, link, ips, *d.DAD)
		}()
	}
	wg.Wait()

	var errs []error
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
	if d.DAD == nil {
		return errs
	}
	var mu sync.Mutex
	for link, ips := range added {
		if !up[link] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := arp.Announce(ctx, h, link, ips, *d.DAD); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}
