package wg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/peerlive"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Observe reads the devices that matter to d: every device it names, every
// WireGuard device nodeagent owns, with their addresses and peers; and it
// resolves every configured endpoint. Links and addresses come from the
// sync's snapshot s (shared with the other subsystems); it costs one wgctrl
// read per device and the look-ups the resolver cache does not answer.
func Observe(ctx context.Context, h *Handle, s *host.Snapshot, d Desired) (Observed, error) {
	o := Observed{
		Devices:   map[string]ObservedDevice{},
		Resolved:  map[string]Resolved{},
		Kernel:    h.kernelHasWireGuard(),
		Userspace: h.Userspace != nil,
		Time:      h.now(),
		Kept:      h.keptPeers(),
	}
	links, err := s.Links()
	if err != nil {
		return Observed{}, err
	}
	// The devices d names, with how many peers each is to have.
	named := make(map[string]int, len(d.Devices))
	for _, dev := range d.Devices {
		named[dev.Name] = len(dev.Peers)
	}
	keep := map[int]string{}
	for _, l := range links {
		o.MaxIndex = max(o.MaxIndex, l.Index)
		owned, interrupted, _ := s.Host().Owned(l)
		impl := ""
		switch {
		case l.Kind == "wireguard":
			impl = ImplKernel
		case l.Kind == "tun" && h.Userspace != nil && h.Userspace.Running(l.Name):
			impl = ImplUserspace
		case l.Kind == "tun" && uapiSocket(l.Name):
			// Another process's userspace device (the daemon's, seen
			// from a one-shot `nodeagent plan`, or wireguard-go's): read
			// through its UAPI socket, which wg(8) too finds by the
			// link's name.
			impl = ImplUserspace
		}
		if _, isNamed := named[l.Name]; !isNamed && (d.Partial || !owned || impl == "") {
			continue
		}
		o.Devices[l.Name] = ObservedDevice{
			Name: l.Name, Index: l.Index, Kind: l.Kind, Impl: impl,
			Owned: owned, Interrupted: interrupted, MTU: l.MTU, Up: l.Up,
		}
		keep[l.Index] = l.Name
	}
	if len(keep) > 0 {
		addrs, err := s.Addrs()
		if err != nil {
			return Observed{}, err
		}
		for _, a := range addrs {
			name, ok := keep[a.LinkIndex]
			if !ok || a.Prefix.Addr().IsLinkLocalUnicast() {
				continue
			}
			od := o.Devices[name]
			owned := a.Owned() || (!h.Host.AddrProto && od.Owned && a.Scope == 0)
			od.Addrs = append(od.Addrs, ObservedAddr{Prefix: a.Prefix, Owned: owned, Markable: h.Host.AddrMarkInPlace(a.Prefix)})
			o.Devices[name] = od
		}
	}
	for name, od := range o.Devices {
		if od.Impl == "" {
			continue
		}
		if err := h.read(&od, named[name]); err != nil {
			return Observed{}, fmt.Errorf("wireguard %s: read device: %w", name, err)
		}
		o.Devices[name] = od
	}
	for _, dev := range d.Devices {
		od := o.Devices[dev.Name]
		for _, p := range dev.Peers {
			if p.Endpoint == "" {
				continue
			}
			// A peer that is not talking gets a fresh look-up: its
			// address may have moved ("re-resolved on failure to
			// handshake").
			op, known := od.Peers[p.PublicKey]
			stale := known && peerlive.IsStale(op.LastHandshake, o.Time)
			if r, done := o.Resolved[p.Endpoint]; done && !(stale && r.Err == "") {
				continue
			}
			o.Resolved[p.Endpoint] = h.resolve(ctx, p.Endpoint, stale)
		}
	}
	return o, nil
}

// read fills in od's configuration and peers: a kernel device's straight
// off one generic netlink dump, a userspace device this process runs
// from wireguard-go in process (readUserspace), another userspace device
// through wgctrl (UAPI).
// A device that turns out not to be WireGuard (a kernel link whose module
// is gone, a TUN that is not, or no longer, one) gets Impl "". hint is
// how many peers it is expected to have (peerHint).
func (h *Handle) read(od *ObservedDevice, hint int) error {
	h.Host.Dumped(host.DumpWireGuard)
	hint = h.peerHint(od.Name, hint)
	if od.Impl == ImplKernel {
		kd, ok, err := h.readKernel(od.Name, hint)
		if err != nil {
			return err
		}
		if !ok {
			od.Impl = ""
			return nil
		}
		od.PrivateKey, od.PublicKey, od.ListenPort, od.FwMark = kd.privateKey, kd.publicKey, kd.listenPort, kd.fwMark
		od.Peers, od.Digest = kd.peers, kd.digest
		return nil
	}
	// The count of other processes' UAPI connections before the read: a
	// change made after it moves the digest again.
	var gen uint64
	running := false
	if h.Userspace != nil {
		gen, running = h.Userspace.Generation(od.Name)
	}
	if running {
		// This process's own device: read in process.
		ok, err := h.readUserspace(od, hint)
		if err != nil {
			return err
		}
		if ok {
			od.Digest = Digest{Sum: gen, Exists: true}
			return nil
		}
	}
	dev, err := h.device(od.Name)
	if errors.Is(err, os.ErrNotExist) || (!running && errors.Is(err, syscall.ECONNREFUSED)) {
		// No device, or a socket file nobody serves (its process died).
		od.Impl = ""
		return nil
	}
	if err != nil {
		return err
	}
	od.PrivateKey = Key(dev.PrivateKey)
	od.PublicKey = dev.PublicKey
	od.ListenPort = dev.ListenPort
	od.FwMark = dev.FirewallMark
	od.Peers = make(map[wgtypes.Key]ObservedPeer, len(dev.Peers))
	for _, p := range dev.Peers {
		od.Peers[p.PublicKey] = observePeer(p)
	}
	od.Digest = Digest{Sum: gen, Exists: running}
	return nil
}

func observePeer(p wgtypes.Peer) ObservedPeer {
	op := ObservedPeer{
		PublicKey:     p.PublicKey,
		PresharedKey:  Key(p.PresharedKey),
		Keepalive:     p.PersistentKeepaliveInterval,
		LastHandshake: p.LastHandshakeTime,
		RxBytes:       p.ReceiveBytes,
		TxBytes:       p.TransmitBytes,
	}
	if p.Endpoint != nil {
		if a, ok := netip.AddrFromSlice(p.Endpoint.IP); ok {
			op.Endpoint = netip.AddrPortFrom(a.Unmap(), uint16(p.Endpoint.Port))
		}
	}
	for _, n := range p.AllowedIPs {
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		bits, _ := n.Mask.Size()
		a = a.Unmap()
		op.AllowedIPs = append(op.AllowedIPs, netip.PrefixFrom(a, bits).Masked())
	}
	sortPrefixes(op.AllowedIPs)
	return op
}

// uapiSocket reports whether a UAPI socket for device name exists: a unix
// socket file at /var/run/wireguard/<name>.sock, as wireguard-go and
// nodeagent create them. Whether it is served shows when it is read.
func uapiSocket(name string) bool {
	if name == "" || strings.ContainsAny(name, "/\x00") {
		return false
	}
	fi, err := os.Lstat(filepath.Join(userspaceSocketDir, name+".sock"))
	return err == nil && fi.Mode().Type() == fs.ModeSocket
}
