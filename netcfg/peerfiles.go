package netcfg

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// NeedFullSync is why ApplyPeerFiles left a change to the full sync.
type NeedFullSync struct{ Reason string }

func (e *NeedFullSync) Error() string { return "needs a full sync: " + e.Reason }

// ApplyPeerFiles carries out what a change to the register files named in
// files (absolute paths, each directly in a peersDir of c) does, without
// reading the rest of the config, the other register files or the kernel:
// each file is read on its own (register.Cache.LoadFile), its peer is
// diffed against the desired peer it gave before, and only that peer is
// written (removed, added, or updated in place). It returns the new
// desired state, the ops it wrote and their report.
//
// It is right only while the device is as d says, which is what the
// daemon knows after a sync that converged (the drift poll watches that
// independently), and only for a change that cannot move another file's
// claim: anything else (a file that does not parse or validate, a key or
// prefix another peer holds, a device with skipped entries, a host name
// endpoint, a file outside the peersDirs) is a *NeedFullSync, and nothing
// was written.
func (c *Converger) ApplyPeerFiles(ctx context.Context, cfg *config.Config, d Desired, files []string, cache *register.Cache) (Desired, []wg.Op, plan.Report, error) {
	type change struct {
		dev      int
		old, new *wg.Peer
	}
	var changes []change
	devs := slices.Clone(d.WG.Devices)
	cloned := map[int]bool{}
	for _, f := range files {
		f = filepath.Clean(f)
		dir, name := filepath.Split(f)
		dir = filepath.Clean(dir)
		di, wi := -1, -1
		for i, w := range cfg.WireGuard {
			if w.PeersDir != "" && filepath.Clean(w.PeersDir) == dir {
				wi = i
			}
		}
		for i := range devs {
			if wi >= 0 && devs[i].Name == cfg.WireGuard[wi].Name {
				di = i
			}
		}
		if di < 0 {
			return d, nil, nil, &NeedFullSync{f + " is in no device's peersDir"}
		}
		dev := &devs[di]
		if dev.Broken != "" || dev.KeepPeers || len(dev.Skipped) > 0 {
			return d, nil, nil, &NeedFullSync{"device " + dev.Name + " has skipped or unreadable entries"}
		}
		if !cloned[di] {
			dev.Peers = slices.Clone(dev.Peers)
			cloned[di] = true
		}
		rf := cache.LoadFile(dir, name, config.Options{})
		switch {
		case rf.Ignored && !register.Transient(name):
			// Not a peer file: a preshared key file beside the peers,
			// which a peer may name, or a directory.
			return d, nil, nil, &NeedFullSync{f + " is not a register file"}
		case rf.Ignored:
			continue
		}
		if len(rf.Errors) > 0 {
			return d, nil, nil, &NeedFullSync{f + " has errors"}
		}
		at := slices.IndexFunc(dev.Peers, func(p wg.Peer) bool { return p.Source == f })
		var old *wg.Peer
		if at >= 0 {
			o := dev.Peers[at]
			old = &o
		}
		if rf.Gone {
			if old == nil {
				continue
			}
			dev.Peers = slices.Delete(dev.Peers, at, at+1)
			changes = append(changes, change{di, old, nil})
			continue
		}
		p, err := wgPeerFromConfig(rf.Peer)
		if err != nil {
			return d, nil, nil, &NeedFullSync{f + ": " + err.Error()}
		}
		p.Source = f
		if p.Endpoint != "" {
			if _, err := netip.ParseAddrPort(p.Endpoint); err != nil {
				return d, nil, nil, &NeedFullSync{f + ": its endpoint is a host name"}
			}
		}
		for i, q := range dev.Peers {
			if i == at {
				continue
			}
			if q.PublicKey == p.PublicKey {
				return d, nil, nil, &NeedFullSync{f + ": its key is another peer's"}
			}
			for _, a := range p.AllowedIPs {
				if slices.Contains(q.AllowedIPs, a) {
					return d, nil, nil, &NeedFullSync{f + ": an allowed prefix is another peer's"}
				}
			}
		}
		if old != nil && samePeer(*old, p) {
			continue
		}
		if at >= 0 {
			dev.Peers[at] = p
		} else {
			// Register peers are in file-name order, after the config's own.
			i, _ := slices.BinarySearchFunc(dev.Peers, f, func(q wg.Peer, f string) int {
				if q.Source == "" {
					return -1
				}
				return strings.Compare(q.Source, f)
			})
			dev.Peers = slices.Insert(dev.Peers, i, p)
		}
		np := p
		changes = append(changes, change{di, old, &np})
	}
	if len(changes) == 0 {
		out := d
		out.WG.Devices = devs
		return out, nil, nil, nil
	}
	h := c.WG()
	var ops []wg.Op
	for _, ch := range changes {
		name := devs[ch.dev].Name
		old := wg.ObservedDevice{Name: name, Impl: h.ImplOf(name)}
		switch {
		case ch.new == nil:
			ops = append(ops, wg.Op{Kind: wg.OpRemovePeer, Device: name, PeerID: ch.old.PublicKey, Old: old})
		case ch.old == nil || ch.old.PublicKey != ch.new.PublicKey:
			if ch.old != nil {
				ops = append(ops, wg.Op{Kind: wg.OpRemovePeer, Device: name, PeerID: ch.old.PublicKey, Old: old})
			}
			ops = append(ops, wg.Op{Kind: wg.OpAddPeer, Device: name, PeerID: ch.new.PublicKey, Peer: *ch.new, Endpoint: literal(ch.new.Endpoint), Old: old})
		default:
			// The same key: what differs, in place (a renamed peer's
			// name is the desired state's alone).
			if f := wg.PeerFields(*ch.old, *ch.new); f != 0 {
				ops = append(ops, wg.Op{Kind: wg.OpUpdatePeer, Device: name, PeerID: ch.new.PublicKey, Peer: *ch.new, Endpoint: literal(ch.new.Endpoint), Fields: f, Old: old})
			}
		}
	}
	if len(ops) == 0 {
		out := d
		out.WG.Devices = devs
		return out, nil, nil, nil
	}
	// One device's ops together, as Execute writes them per device.
	slices.SortStableFunc(ops, func(a, b wg.Op) int { return strings.Compare(a.Device, b.Device) })
	rep := wg.Execute(ctx, h, c.Host.Snapshot(), wg.Plan{Ops: ops})
	c.poll.Moved(devsOf(ops))
	out := d
	out.WG.Devices = devs
	return out, ops, rep, nil
}

func devsOf(ops []wg.Op) []string {
	var out []string
	for _, o := range ops {
		if !slices.Contains(out, o.Device) {
			out = append(out, o.Device)
		}
	}
	return out
}

// literal is an address endpoint, or none.
func literal(ep string) netip.AddrPort {
	ap, err := netip.ParseAddrPort(ep)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// samePeer reports whether two desired peers configure the same.
func samePeer(a, b wg.Peer) bool {
	return a.PublicKey == b.PublicKey && a.Name == b.Name && a.PresharedKey == b.PresharedKey && a.Endpoint == b.Endpoint &&
		a.Keepalive == b.Keepalive && a.Roams == b.Roams && slices.Equal(a.AllowedIPs, b.AllowedIPs)
}
