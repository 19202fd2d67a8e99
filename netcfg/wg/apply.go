package wg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Apply executes p (Execute) and returns the state it reached, read after
// the sync's writes, with the report of every op.
func Apply(ctx context.Context, h *Handle, s *host.Snapshot, p Plan) (Observed, plan.Report) {
	return plan.Applied(plan.WireGuard, Execute(ctx, h, s, p), p.Observed, func() (Observed, error) { return Observe(ctx, h, s.After(), p.Desired) })
}

// Execute carries out exactly p's ops and reports each. Per device the
// order is: link (create or delete, mark, MTU), addresses, then one wgctrl
// write with the device's key, port and fwmark and every peer op, then up,
// so a device never comes up without its key. A device created from a
// staging device that holds exactly what its creation and peer adds write
// (Stager) is that device, renamed and marked; only the rest is written. An op that fails is
// reported by its object and does not stop the other devices; the ops of a
// device whose creation failed are skipped with that reason. Devices it
// creates and deletes are recorded in s.
func Execute(ctx context.Context, h *Handle, s *host.Snapshot, p Plan) plan.Report {
	r := p.Report()
	if !p.Writes() {
		return r
	}
	for _, g := range byDevice(p.Ops) {
		applyDevice(h, s, p.Ops, g, r)
	}
	return r
}

// Entry is the op as a line of the sync's report.
func (o Op) Entry() plan.Entry {
	kind := plan.KindWireGuard
	switch {
	case o.Kind == OpAddAddr || o.Kind == OpDelAddr:
		kind = plan.KindAddress
	case o.PeerID != (wgtypes.Key{}):
		kind = plan.KindWireGuardPeer
	}
	obj := o.Object()
	e := plan.Entry{Subsystem: plan.WireGuard, Kind: kind, Action: plan.Action(o.Action()), Object: obj, Text: o.text(obj),
		Adopt: o.Kind == OpMarkDevice && !o.Old.Interrupted || o.Kind == OpKeepPeer}
	if o.Kind == OpFail {
		e.Err = opError(o)
	}
	return e
}

// Report is the plan as report entries, one per op; ops that cannot be
// applied carry their reason as the error.
func (p Plan) Report() plan.Report { return plan.ReportOf(p.Ops) }

func opError(o Op) error {
	switch {
	case o.Pending:
		return fmt.Errorf("%s: %w", o.Object(), &host.PendingError{Reason: o.Detail})
	case o.Skipped:
		return fmt.Errorf("%s: %w", o.Object(), &host.SkippedError{Reason: o.Detail})
	}
	return fmt.Errorf("%s: %s", o.Object(), o.Detail)
}

// byDevice splits the ops' indexes into runs of one device each, keeping
// their order.
func byDevice(ops []Op) [][]int {
	var out [][]int
	for i, o := range ops {
		if i == 0 || o.Device != ops[i-1].Device {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], i)
	}
	return out
}

func applyDevice(h *Handle, s *host.Snapshot, all []Op, ids []int, r plan.Report) {
	fail := func(i int, err error) { r[i].Err = fmt.Errorf("%s: %w", all[i].Object(), err) }
	name := all[ids[0]].Device
	impl := ""
	for _, i := range ids {
		if o := all[i]; o.Kind == OpCreateDevice {
			impl = o.Impl
		} else if impl == "" && o.Old.Impl != "" {
			impl = o.Old.Impl
		}
	}
	var cfg wgtypes.Config
	var cfgOps []int
	var index int
	var up bool
	// A staging device holding exactly what the creation and the peer
	// adds write becomes the device; they are then written already.
	staged, stagedIndex := false, 0
	for _, i := range ids {
		if o := &all[i]; o.Kind == OpCreateDevice && o.Want.Stage != nil {
			stagedIndex, staged = o.Want.Stage.take(h, *o, all, ids)
		}
	}
	for k, i := range ids {
		o := all[i]
		var err error
		switch o.Kind {
		case OpFail:
			continue // reported as planned
		case OpDeleteDevice:
			err = deleteDevice(h, o)
			s.Deleted(o.Device)
		case OpReleaseDevice:
			err = releaseDevice(h, o.Old)
		case OpCreateDevice:
			if staged {
				index, up = stagedIndex, true
				s.Created(o.Device, index)
				continue
			}
			index, err = createDevice(h, o)
			if err != nil {
				fail(i, err)
				for _, j := range ids[k+1:] {
					if all[j].Kind != OpFail {
						fail(j, fmt.Errorf("skipped: %w", err))
					}
				}
				return
			}
			s.Created(o.Device, index)
			setDevice(&cfg, o.Want, deviceFields)
			cfgOps = append(cfgOps, i)
			up = true
		case OpMarkDevice:
			index = o.Old.Index
			err = h.Host.LinkMark(index)
		case OpSetMTU:
			h.Host.Wrote(1)
			err = h.Host.NL().LinkSetMTU(link(o.Old.Index), mtuOf(o.Want))
		case OpAddAddr, OpDelAddr:
			if index == 0 {
				index = o.Old.Index
			}
			if index == 0 {
				index, err = s.LinkIndex(o.Device)
			}
			if err == nil {
				err = addr(h, o, index)
			}
		case OpSetDevice:
			setDevice(&cfg, o.Want, o.Fields)
			cfgOps = append(cfgOps, i)
		case OpAddPeer, OpUpdatePeer, OpRemovePeer:
			if staged && o.Kind == OpAddPeer {
				continue
			}
			cfg.Peers = append(cfg.Peers, peerConfig(o))
			cfgOps = append(cfgOps, i)
		case OpSetUp:
			up = true
			if index == 0 {
				index = o.Old.Index
			}
		case OpKeepPeer, OpForgetPeer:
			// The record, not the kernel: the peer stays as it is.
			err = h.setKept(o.Device, o.PeerID, o.Kind == OpKeepPeer)
		}
		if err != nil {
			fail(i, err)
		}
	}
	if len(cfgOps) > 0 {
		configure(h, name, impl, cfg, all, cfgOps, r)
	}
	if !up {
		return
	}
	upErr := func(err error) {
		// Reported on the op that brought the device up (its creation, or
		// the up op).
		for _, i := range ids {
			if k := all[i].Kind; k == OpCreateDevice || k == OpSetUp {
				if r[i].Err == nil {
					r[i].Err = fmt.Errorf("wireguard %s: up: %w", name, err)
				}
				return
			}
		}
	}
	if index == 0 {
		var err error
		if index, err = s.LinkIndex(name); err != nil || index == 0 {
			if err == nil {
				err = errors.New("link not found")
			}
			upErr(err)
			return
		}
	}
	h.Host.Wrote(1)
	if err := h.Host.NL().LinkSetUp(link(index)); err != nil {
		upErr(err)
	}
}

// configure writes the device settings and every peer op in one write
// (Handle.configure: packed netlink messages for a kernel device, one UAPI
// set for a userspace one). If that fails, each op is written on its own,
// so the report names the peers that really failed and the others still
// land: adds are written with ReplaceAllowedIPs and removes of absent
// peers are no-ops, so writing an op twice is harmless.
func configure(h *Handle, name, impl string, cfg wgtypes.Config, all []Op, ids []int, r plan.Report) {
	err := h.configure(name, impl, cfg)
	if err == nil {
		return
	}
	if len(ids) == 1 {
		r[ids[0]].Err = fmt.Errorf("%s: %w", all[ids[0]].Object(), err)
		return
	}
	for _, i := range ids {
		o := all[i]
		var one wgtypes.Config
		switch o.Kind {
		case OpCreateDevice:
			setDevice(&one, o.Want, deviceFields)
		case OpSetDevice:
			setDevice(&one, o.Want, o.Fields)
		default:
			one.Peers = []wgtypes.PeerConfig{peerConfig(o)}
		}
		if err := h.configure(name, impl, one); err != nil {
			r[i].Err = fmt.Errorf("%s: %w", o.Object(), err)
		}
	}
}

func setDevice(cfg *wgtypes.Config, d Device, f Field) {
	if f.Has(FieldPrivateKey) {
		k := wgtypes.Key(d.PrivateKey)
		cfg.PrivateKey = &k
	}
	if f.Has(FieldListenPort) && d.ListenPort != 0 {
		port := d.ListenPort
		cfg.ListenPort = &port
	}
	if f.Has(FieldFwMark) {
		mark := d.FwMark
		cfg.FirewallMark = &mark
	}
}

func peerConfig(o Op) wgtypes.PeerConfig {
	pc := wgtypes.PeerConfig{PublicKey: o.PeerID}
	p := o.Peer
	all := o.Kind == OpAddPeer
	switch o.Kind {
	case OpRemovePeer:
		pc.Remove = true
		return pc
	case OpUpdatePeer:
		pc.UpdateOnly = true
	}
	if (all || o.Fields.Has(FieldEndpoint)) && o.Endpoint.IsValid() {
		pc.Endpoint = net.UDPAddrFromAddrPort(o.Endpoint)
	}
	if all || o.Fields.Has(FieldKeepalive) {
		ka := p.Keepalive
		pc.PersistentKeepaliveInterval = &ka
	}
	if (all && !p.PresharedKey.IsZero()) || o.Fields.Has(FieldPresharedKey) {
		k := wgtypes.Key(p.PresharedKey)
		pc.PresharedKey = &k
	}
	if all || o.Fields.Has(FieldAllowedIPs) {
		pc.ReplaceAllowedIPs = true
		for _, a := range p.AllowedIPs {
			pc.AllowedIPs = append(pc.AllowedIPs, ipNet(a))
		}
	}
	return pc
}

func ipNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func link(index int) *netlink.Device {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}}
}

func indexOf(h *Handle, name string) (int, error) {
	l, err := h.Host.NL().LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

func addr(h *Handle, o Op, index int) error {
	if o.Kind == OpAddAddr {
		return h.Host.AddrAdd(index, o.Addr)
	}
	err := h.Host.AddrDel(index, o.Addr)
	if errors.Is(err, unix.EADDRNOTAVAIL) {
		return nil
	}
	return err
}

func deleteDevice(h *Handle, o Op) error {
	if o.Old.Impl == ImplUserspace && h.Userspace != nil && h.Userspace.Running(o.Device) {
		h.Host.Wrote(1)
		return h.Userspace.Stop(o.Device)
	}
	h.Host.Wrote(1)
	err := h.Host.NL().LinkDel(link(o.Old.Index))
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}

// releaseDevice unmarks the addresses of od that carry the mark, in
// place, then the device's link: a failure leaves the device marked, so
// that a second release finds it again. (A userspace device of another
// process, wireguard-go's, is its TUN link: unmarked the same way.)
func releaseDevice(h *Handle, od ObservedDevice) error {
	unmark, _ := releasedAddrs(od)
	for _, p := range unmark {
		done, err := h.Host.AddrUnmark(od.Index, p)
		if err != nil {
			return fmt.Errorf("address %s: %w", p, err)
		}
		if !done {
			return fmt.Errorf("address %s: the kernel kept the mark", p)
		}
	}
	return h.Host.LinkUnmark(od.Index)
}

// createDevice creates the device's link, down, and marks it; it returns
// the link's index.
func createDevice(h *Handle, o Op) (int, error) {
	switch o.Impl {
	case ImplKernel:
		made, err := h.Host.LinkCreate(host.LinkSpec{Name: o.Device, Kind: "wireguard", MTU: mtuOf(o.Want)})
		if err != nil {
			return 0, fmt.Errorf("create: %w", err)
		}
		if made.Index != 0 {
			if err := h.Host.LinkMark(made.Index); err != nil {
				return made.Index, fmt.Errorf("mark: %w", err)
			}
			return made.Index, nil
		}
	case ImplUserspace:
		if h.Userspace == nil {
			return 0, errors.New("create: no userspace host in this process")
		}
		h.Host.Wrote(1)
		if err := h.Userspace.Start(h.Host, o.Device, mtuOf(o.Want)); err != nil {
			return 0, fmt.Errorf("create: %w", err)
		}
	default:
		return 0, fmt.Errorf("create: unknown implementation %q", o.Impl)
	}
	index, err := indexOf(h, o.Device)
	if err != nil {
		return 0, fmt.Errorf("find the new link: %w", err)
	}
	if err := h.Host.LinkMark(index); err != nil {
		return index, fmt.Errorf("mark: %w", err)
	}
	return index, nil
}
