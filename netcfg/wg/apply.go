package wg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Apply executes p and returns the state it reached. Per device the order
// is: link (create or delete, mark, MTU), addresses, then one wgctrl write
// with the device's key, port and fwmark and every peer op, then up, so a
// device never comes up without its key. An op that fails is reported by
// its object and does not stop the other devices; the ops of a device whose
// creation failed are skipped with that reason. The returned error joins
// every failure.
func Apply(ctx context.Context, h *Handle, p Plan) (Observed, error) {
	if !p.Writes() {
		return p.Observed, failures(p.Ops)
	}
	var errs []error
	for _, group := range byDevice(p.Ops) {
		errs = append(errs, applyDevice(h, group))
	}
	o, err := Observe(ctx, h, p.Desired)
	if err != nil {
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}

// failures returns the errors of the ops that only report.
func failures(ops []Op) error {
	var errs []error
	for _, o := range ops {
		if o.Kind == OpFail {
			errs = append(errs, opError(o))
		}
	}
	return errors.Join(errs...)
}

func opError(o Op) error {
	if o.Pending {
		return fmt.Errorf("%s: %w", o.Object(), &host.PendingError{Reason: o.Detail})
	}
	if o.Skipped {
		return fmt.Errorf("%s: %w", o.Object(), &host.SkippedError{Reason: o.Detail})
	}
	return fmt.Errorf("%s: %s", o.Object(), o.Detail)
}

// byDevice splits the ops into runs of one device each, keeping their order.
func byDevice(ops []Op) [][]Op {
	var out [][]Op
	for i, o := range ops {
		if i == 0 || o.Device != ops[i-1].Device {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], o)
	}
	return out
}

func applyDevice(h *Handle, ops []Op) error {
	var errs []error
	fail := func(o Op, err error) { errs = append(errs, fmt.Errorf("%s: %w", o.Object(), err)) }
	var cfg wgtypes.Config
	var cfgOps []Op
	var index int
	var up bool
	for _, o := range ops {
		var err error
		switch o.Kind {
		case OpFail:
			errs = append(errs, opError(o))
			continue
		case OpDeleteDevice:
			err = deleteDevice(h, o)
		case OpCreateDevice:
			index, err = createDevice(h, o)
			if err != nil {
				fail(o, err)
				return skipRest(errs, ops, o, err)
			}
			setDevice(&cfg, o.Want, []string{"private key", "listen port", "fwmark"})
			cfgOps = append(cfgOps, o)
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
				index, err = indexOf(h, o.Device)
			}
			if err == nil {
				err = addr(h, o, index)
			}
		case OpSetDevice:
			setDevice(&cfg, o.Want, o.Changes)
			cfgOps = append(cfgOps, o)
		case OpAddPeer, OpUpdatePeer, OpRemovePeer:
			cfg.Peers = append(cfg.Peers, peerConfig(o))
			cfgOps = append(cfgOps, o)
		case OpSetUp:
			up = true
			if index == 0 {
				index = o.Old.Index
			}
		}
		if err != nil {
			fail(o, err)
		}
	}
	if len(cfgOps) > 0 {
		errs = append(errs, configure(h, ops[0].Device, cfg, cfgOps))
	}
	if up {
		if index == 0 {
			var err error
			if index, err = indexOf(h, ops[0].Device); err != nil {
				return errors.Join(append(errs, fmt.Errorf("wireguard %s: up: %w", ops[0].Device, err))...)
			}
		}
		h.Host.Wrote(1)
		if err := h.Host.NL().LinkSetUp(link(index)); err != nil {
			errs = append(errs, fmt.Errorf("wireguard %s: up: %w", ops[0].Device, err))
		}
	}
	return errors.Join(errs...)
}

// skipRest reports every op after the failed creation as skipped.
func skipRest(errs []error, ops []Op, failed Op, err error) error {
	after := false
	for _, o := range ops {
		if after && o.Kind != OpFail {
			errs = append(errs, fmt.Errorf("%s: skipped: %w", o.Object(), err))
		} else if after {
			errs = append(errs, opError(o))
		}
		if o.Kind == failed.Kind && o.Device == failed.Device {
			after = true
		}
	}
	return errors.Join(errs...)
}

// configure writes the device settings and every peer op in one wgctrl
// call (the kernel client splits it into as few messages as fit). If that
// fails, each op is written on its own, so the error names the peers that
// really failed and the others still land: adds are written with
// ReplaceAllowedIPs and removes of absent peers are no-ops, so writing an op
// twice is harmless.
func configure(h *Handle, name string, cfg wgtypes.Config, ops []Op) error {
	err := writeChunked(h, name, cfg)
	if err == nil || len(ops) == 1 {
		if err != nil {
			return fmt.Errorf("%s: %w", ops[0].Object(), err)
		}
		return nil
	}
	var errs []error
	for _, o := range ops {
		var one wgtypes.Config
		switch o.Kind {
		case OpCreateDevice:
			setDevice(&one, o.Want, []string{"private key", "listen port", "fwmark"})
		case OpSetDevice:
			setDevice(&one, o.Want, o.Changes)
		default:
			one.Peers = []wgtypes.PeerConfig{peerConfig(o)}
		}
		if err := h.configure(name, one); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.Object(), err))
		}
	}
	return errors.Join(errs...)
}

// Chunk limits for one wgctrl call: wgctrl sends a config of more than 32
// peers or 256 allowed IPs as one netlink message per peer (5000 round
// trips for 5000 peers, where wg(8) packs a message full); at or under
// them it sends one message. So the peers go in chunks that stay under both.
const (
	chunkPeers = 32
	chunkIPs   = 256
)

// writeChunked writes cfg in as few wgctrl calls as wgctrl will send as one
// message each; the device settings go with the first.
func writeChunked(h *Handle, name string, cfg wgtypes.Config) error {
	if len(cfg.Peers) <= chunkPeers {
		return h.configure(name, cfg)
	}
	peers := cfg.Peers
	chunk := cfg
	chunk.Peers = nil
	ips := 0
	for i, p := range peers {
		chunk.Peers = append(chunk.Peers, p)
		ips += len(p.AllowedIPs)
		last := i == len(peers)-1
		if !last && len(chunk.Peers) < chunkPeers && ips+len(peers[i+1].AllowedIPs) <= chunkIPs {
			continue
		}
		if err := h.configure(name, chunk); err != nil {
			return err
		}
		chunk = wgtypes.Config{}
		ips = 0
	}
	return nil
}

func setDevice(cfg *wgtypes.Config, d Device, changes []string) {
	if has(changes, "private key") {
		k := wgtypes.Key(d.PrivateKey)
		cfg.PrivateKey = &k
	}
	if has(changes, "listen port") && d.ListenPort != 0 {
		port := d.ListenPort
		cfg.ListenPort = &port
	}
	if has(changes, "fwmark") {
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
	if (all || has(o.Changes, "endpoint")) && o.Endpoint.IsValid() {
		pc.Endpoint = net.UDPAddrFromAddrPort(o.Endpoint)
	}
	if all || has(o.Changes, "keepalive") {
		ka := p.Keepalive
		pc.PersistentKeepaliveInterval = &ka
	}
	if (all && !p.PresharedKey.IsZero()) || has(o.Changes, "preshared key") {
		k := wgtypes.Key(p.PresharedKey)
		pc.PresharedKey = &k
	}
	if all || has(o.Changes, "allowed IPs") {
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

// createDevice creates the device's link, down, and marks it; it returns
// the link's index.
func createDevice(h *Handle, o Op) (int, error) {
	switch o.Impl {
	case ImplKernel:
		if err := h.Host.LinkCreate(host.LinkSpec{Name: o.Device, Kind: "wireguard", MTU: mtuOf(o.Want)}); err != nil {
			return 0, fmt.Errorf("create: %w", err)
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
