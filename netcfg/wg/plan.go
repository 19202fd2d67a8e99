package wg

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/peerlive"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// MakePlan computes the ops that take o to d. It is a pure function.
func MakePlan(d Desired, o Observed) Plan {
	// Sized once for the peers a device gains or loses: a plan of
	// thousands of peer ops (888 bytes each) would otherwise spend its
	// time growing and copying the slice, and a no-op plan sized for every
	// peer would clear megabytes to hold nothing.
	n := len(o.Devices)
	for _, dev := range d.Devices {
		have := 0
		if od, ok := o.Devices[dev.Name]; ok {
			have = len(od.Peers)
		}
		n += max(len(dev.Peers)-have, have-len(dev.Peers)) + len(dev.Addrs) + len(dev.Skipped) + 8
	}
	ops := make([]Op, 0, n)
	want := map[string]bool{}
	for _, dev := range d.Devices {
		want[dev.Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(o.Devices)) {
		od := o.Devices[name]
		if !want[name] && od.Owned && od.Impl != "" {
			ops = append(ops, Op{Kind: OpDeleteDevice, Device: name, Old: od})
		}
	}
	for _, dev := range d.Devices {
		ops = planDevice(ops, dev, o)
	}
	return Plan{Ops: ops, Desired: d, Observed: o}
}

// planDevice appends the ops of device d to ops.
func planDevice(ops []Op, d Device, o Observed) []Op {
	fail := func(format string, a ...any) Op {
		return Op{Kind: OpFail, Device: d.Name, Failed: true, Detail: fmt.Sprintf(format, a...)}
	}
	for _, s := range d.Skipped {
		f := fail("peer skipped: %s", s)
		f.Skipped = true
		ops = append(ops, f)
	}
	if d.Broken != "" {
		return append(ops, fail("%s; left as it is", d.Broken))
	}
	od, exists := o.Devices[d.Name]
	if !exists {
		impl, why := chooseImpl(d.Impl, o)
		if why != "" {
			f := fail("%s", why)
			f.NoHost = !o.Userspace && d.Impl != ImplKernel
			return append(ops, f)
		}
		ops = append(ops, Op{Kind: OpCreateDevice, Device: d.Name, Impl: impl, Want: d})
		for _, a := range d.Addrs {
			ops = append(ops, Op{Kind: OpAddAddr, Device: d.Name, Addr: a})
		}
		return planPeers(ops, d, ObservedDevice{}, o)
	}
	switch {
	case od.Impl == "":
		return append(ops, fail("exists as a %s link, not a WireGuard device; left untouched", kindName(od.Kind)))
	case !od.Owned && !d.Adopt:
		return append(ops, fail("exists and was not created by nodeagent; left untouched (set adopt: true to take it over)"))
	case !od.Owned || od.Interrupted:
		ops = append(ops, Op{Kind: OpMarkDevice, Device: d.Name, Old: od})
	}
	if d.Impl != ImplAuto && d.Impl != "" && d.Impl != od.Impl {
		if _, why := chooseImpl(d.Impl, o); why != "" {
			return append(ops, fail("runs %s; %s", od.Impl, why))
		}
		ops = append(ops, Op{Kind: OpDeleteDevice, Device: d.Name, Old: od, Detail: fmt.Sprintf("recreate: implementation %s -> %s", od.Impl, d.Impl)})
		ops = append(ops, Op{Kind: OpCreateDevice, Device: d.Name, Impl: d.Impl, Want: d})
		for _, a := range d.Addrs {
			ops = append(ops, Op{Kind: OpAddAddr, Device: d.Name, Addr: a})
		}
		return planPeers(ops, d, ObservedDevice{}, o)
	}
	if mtuOf(d) != od.MTU {
		ops = append(ops, Op{Kind: OpSetMTU, Device: d.Name, Want: d, Old: od})
	}
	for _, a := range d.Addrs {
		if !slices.ContainsFunc(od.Addrs, func(x ObservedAddr) bool { return x.Prefix == a }) {
			ops = append(ops, Op{Kind: OpAddAddr, Device: d.Name, Addr: a})
		}
	}
	for _, a := range od.Addrs {
		if a.Owned && !slices.Contains(d.Addrs, a.Prefix) {
			ops = append(ops, Op{Kind: OpDelAddr, Device: d.Name, Addr: a.Prefix})
		}
	}
	var fields Field
	if d.PrivateKey != od.PrivateKey {
		fields |= FieldPrivateKey
	}
	if d.ListenPort != 0 && d.ListenPort != od.ListenPort {
		fields |= FieldListenPort
	}
	if d.FwMark != od.FwMark {
		fields |= FieldFwMark
	}
	if fields != 0 {
		ops = append(ops, Op{Kind: OpSetDevice, Device: d.Name, Want: d, Old: od, Fields: fields})
	}
	ops = planPeers(ops, d, od, o)
	if !od.Up {
		ops = append(ops, Op{Kind: OpSetUp, Device: d.Name, Old: od})
	}
	return ops
}

// chooseImpl picks the implementation a new device runs with, or says why
// none can run it.
func chooseImpl(want string, o Observed) (string, string) {
	const noHost = "the userspace implementation runs inside nodeagent's own process, which a one-shot apply is not (run the daemon)"
	switch want {
	case ImplKernel:
		if !o.Kernel {
			return "", "the kernel has no WireGuard (implementation: kernel); use auto or userspace"
		}
		return ImplKernel, ""
	case ImplUserspace:
		if !o.Userspace {
			return "", noHost
		}
		return ImplUserspace, ""
	}
	switch {
	case o.Kernel:
		return ImplKernel, ""
	case o.Userspace:
		return ImplUserspace, ""
	}
	return "", "the kernel has no WireGuard, and " + noHost
}

func kindName(k string) string {
	if k == "" {
		return "hardware"
	}
	return k
}

// planPeers appends the peer ops of d to ops, diffing the peers one by
// one. od is the zero value for a device this sync creates.
func planPeers(ops []Op, d Device, od ObservedDevice, o Observed) []Op {
	want := make(map[wgtypes.Key]bool, len(d.Peers))
	for _, p := range d.Peers {
		want[p.PublicKey] = true
	}
	// The peers to remove, in key order (only they are sorted: with
	// thousands of peers and nothing to remove there is nothing to sort).
	// An adoption never removes a peer: those the register lacks are kept
	// and listed (kept.go), and stay so on later syncs.
	adopting := !od.Owned && od.Impl != "" && d.Adopt
	kept := o.Kept[d.Name]
	var gone, keep []wgtypes.Key
	if !d.KeepPeers {
		for k := range od.Peers {
			switch {
			case want[k] || kept[k]:
			case adopting:
				keep = append(keep, k)
			default:
				gone = append(gone, k)
			}
		}
	}
	byKey := func(a, b wgtypes.Key) int { return bytes.Compare(a[:], b[:]) }
	slices.SortFunc(gone, byKey)
	slices.SortFunc(keep, byKey)
	for _, k := range gone {
		ops = append(ops, Op{Kind: OpRemovePeer, Device: d.Name, PeerID: k})
	}
	for _, k := range keep {
		ops = append(ops, Op{Kind: OpKeepPeer, Device: d.Name, PeerID: k})
	}
	if od.Impl != "" && len(kept) > 0 {
		var forget []wgtypes.Key
		for k := range kept {
			if _, in := od.Peers[k]; want[k] || !in {
				forget = append(forget, k)
			}
		}
		slices.SortFunc(forget, byKey)
		for _, k := range forget {
			op := Op{Kind: OpForgetPeer, Device: d.Name, PeerID: k, Detail: "it left the kernel"}
			if want[k] {
				op.Detail = "the register names it now"
				if i := slices.IndexFunc(d.Peers, func(p Peer) bool { return p.PublicKey == k }); i >= 0 {
					op.Peer = d.Peers[i]
				}
			}
			ops = append(ops, op)
		}
	}
	for _, p := range d.Peers {
		var ep netip.AddrPort
		if p.Endpoint != "" {
			r := o.Resolved[p.Endpoint]
			if !r.Addr.IsValid() {
				why := r.Err
				if why == "" {
					why = "not resolved"
				}
				verb := "skipped"
				if _, ok := od.Peers[p.PublicKey]; ok {
					verb = "left as it is"
				}
				ops = append(ops, Op{Kind: OpFail, Device: d.Name, PeerID: p.PublicKey, Peer: p, Failed: true, Skipped: true,
					Detail: fmt.Sprintf("endpoint %s does not resolve (%s); %s", p.Endpoint, why, verb)})
				continue
			}
			ep = r.Addr
		}
		op, ok := od.Peers[p.PublicKey]
		if !ok {
			ops = append(ops, Op{Kind: OpAddPeer, Device: d.Name, PeerID: p.PublicKey, Peer: p, Endpoint: ep})
			continue
		}
		if fields := peerChanges(p, ep, op, o); fields != 0 {
			ops = append(ops, Op{Kind: OpUpdatePeer, Device: d.Name, PeerID: p.PublicKey, Peer: p, Endpoint: ep, Fields: fields, OldPeer: op})
		}
	}
	return ops
}

// peerChanges lists what differs between the desired peer p (endpoint
// resolved to ep) and the kernel's op.
//
// The endpoint is rewritten only where that cannot fight WireGuard's own
// roaming: a peer with no configured endpoint keeps what the kernel learnt;
// one configured as an address gets that address back; one configured as a
// host name is re-pointed when it resolves elsewhere and the peer has not
// completed a handshake in peerlive.Stale (so a live session on an address
// the name no longer gives stays up until it fails); so is one that Roams
// (a VPN provider's server, which may answer from another address of its
// own).
func peerChanges(p Peer, ep netip.AddrPort, op ObservedPeer, o Observed) Field {
	var f Field
	if ep.IsValid() && ep != op.Endpoint {
		literal := false
		if ap, err := netip.ParseAddrPort(p.Endpoint); err == nil && ap == ep {
			literal = true
		}
		stale := peerlive.IsStale(op.LastHandshake, o.Time)
		if literal && !p.Roams || stale || !op.Endpoint.IsValid() {
			f |= FieldEndpoint
		}
	}
	return f | settingsDiffer(p, op.Keepalive, op.PresharedKey, op.AllowedIPs)
}

// settingsDiffer lists which of p's keepalive, preshared key and allowed
// IPs differ from the given ones.
func settingsDiffer(p Peer, keepalive time.Duration, psk Key, allowed []netip.Prefix) Field {
	var f Field
	if p.Keepalive != keepalive {
		f |= FieldKeepalive
	}
	if p.PresharedKey != psk {
		f |= FieldPresharedKey
	}
	if !slices.Equal(p.AllowedIPs, allowed) {
		f |= FieldAllowedIPs
	}
	return f
}

// PeerFields lists what differs between two desired peers of the same key,
// as written to the kernel: the endpoint where both are addresses (a host
// name is resolved by a sync), keepalive, preshared key, allowed IPs.
func PeerFields(old, new Peer) Field {
	var f Field
	if old.Endpoint != new.Endpoint {
		f |= FieldEndpoint
	}
	return f | settingsDiffer(new, old.Keepalive, old.PresharedKey, old.AllowedIPs)
}

func endpointText(ap netip.AddrPort) string {
	if !ap.IsValid() {
		return "(none)"
	}
	return ap.String()
}
