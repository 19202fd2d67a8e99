package wg

import (
	"context"
	"slices"

	"github.com/nodeagent/nodeagent/netcfg/host"
)

// Poller is the drift poll's memory: each device's digest when a poll last
// found it converged. The kernel sends no event when a peer is changed with
// `wg set`, so the daemon polls; with thousands of peers and nothing
// changing, a poll that compares digests walks no peer and allocates
// nothing.
type Poller struct {
	base map[string]Digest
	// look is scratch space, kept from poll to poll.
	look []Device
}

// Plan observes and plans every device of d, as Observe and MakePlan do;
// the devices found converged keep the digest of the state read, so a
// sync with nothing to do leaves the next poll nothing to read.
func (p *Poller) Plan(ctx context.Context, h *Handle, s *host.Snapshot, d Desired) (Plan, error) {
	o, err := Observe(ctx, h, s, d)
	if err != nil {
		return Plan{}, err
	}
	pl := MakePlan(d, o)
	p.settle(pl, d.Devices)
	// Devices no longer desired: their digests would only go stale.
	for name := range p.base {
		if !slices.ContainsFunc(d.Devices, func(d Device) bool { return d.Name == name }) {
			delete(p.base, name)
		}
	}
	return pl, nil
}

// Poll plans the devices of d whose digest moved since they were last
// found converged, and those always names (PIA's, whose providers judge a
// tunnel's health by its handshakes and counters), as a full observation
// would; owned devices d does not name are left to the sync. looked is
// false when no device was read; the plan is then empty. A device whose
// digest moved is read again whole (its digest taken from that read).
func (p *Poller) Poll(ctx context.Context, h *Handle, d Desired, always map[string]bool) (pl Plan, looked bool, err error) {
	p.look = p.look[:0]
	for i := range d.Devices {
		name := d.Devices[i].Name
		if !always[name] {
			dg, err := h.Digest(name, h.ImplOf(name))
			if b, ok := p.base[name]; ok && err == nil && b == dg {
				continue
			}
		}
		p.look = append(p.look, d.Devices[i])
	}
	if len(p.look) == 0 {
		return Plan{}, false, nil
	}
	part := Desired{Devices: append([]Device(nil), p.look...), Partial: true}
	o, err := Observe(ctx, h, h.Host.Snapshot(), part)
	if err != nil {
		return Plan{}, true, err
	}
	pl = MakePlan(part, o)
	p.settle(pl, part.Devices)
	return pl, true, nil
}

// Moved drops the digests of devices nodeagent wrote outside a sync, so
// the next poll reads them whole.
func (p *Poller) Moved(names []string) {
	for _, n := range names {
		delete(p.base, n)
	}
}

// settle keeps, for each of devs, the digest of the state pl was planned
// from when pl has nothing to write to it, and drops it otherwise (a
// device about to be written, or one that drifted, is read again by the
// next poll; a userspace device's digest does not move with nodeagent's
// own writes).
func (p *Poller) settle(pl Plan, devs []Device) {
	writes := map[string]bool{}
	for _, op := range pl.Ops {
		if op.Kind != OpFail {
			writes[op.Device] = true
		}
	}
	if p.base == nil {
		p.base = map[string]Digest{}
	}
	for _, dev := range devs {
		od, ok := pl.Observed.Devices[dev.Name]
		if ok && od.Impl != "" && od.Digest.Exists && !writes[dev.Name] {
			p.base[dev.Name] = od.Digest
		} else {
			delete(p.base, dev.Name)
		}
	}
}

// EventDriven reports whether a poll of d can wait for h.Userspace's
// Changed signal instead of a timer: every device of d is one this
// process runs in userspace, none is in always (read on every poll), and
// the last poll or plan found each converged, so its digest is kept. Such
// a digest moves only with another process's UAPI connection or the
// device's own exit, which Changed signals; a kernel device's can move
// with any `wg set`, which nothing signals.
func (p *Poller) EventDriven(h *Handle, d Desired, always map[string]bool) bool {
	if h.Userspace == nil || len(d.Devices) == 0 {
		return false
	}
	for i := range d.Devices {
		name := d.Devices[i].Name
		if always[name] || !h.Userspace.Running(name) {
			return false
		}
		if _, ok := p.base[name]; !ok {
			return false
		}
	}
	return true
}

// ImplOf is how device name runs, for its digest: userspace when this
// process runs it, else the kernel.
func (h *Handle) ImplOf(name string) string {
	if h.Userspace != nil && h.Userspace.Running(name) {
		return ImplUserspace
	}
	return ImplKernel
}
