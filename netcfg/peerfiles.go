package netcfg

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/clients"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// maxPeerFiles is the most changed files ApplyPeerFiles takes on its own:
// each costs a scan of its device's peers, and a register rewritten whole
// (config management at work) is a full sync's job.
const maxPeerFiles = 64

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
	if len(files) > maxPeerFiles {
		return d, nil, nil, &NeedFullSync{fmt.Sprintf("%d files changed at once", len(files))}
	}
	now := time.Now()
	d = d.At(now)
	// Each file read first; the ones gone are applied first, so that a
	// peer moved to a new name (a rename) finds its key free.
	type read struct {
		f, dir, name string
		rf           register.File
	}
	var reads []read
	for _, f := range files {
		f = filepath.Clean(f)
		dir, name := filepath.Split(f)
		dir = filepath.Clean(dir)
		reads = append(reads, read{f, dir, name, cache.LoadFile(dir, name, config.Options{})})
	}
	slices.SortStableFunc(reads, func(a, b read) int {
		switch {
		case a.rf.Gone == b.rf.Gone:
			return 0
		case a.rf.Gone:
			return -1
		}
		return 1
	})
	var changes []change
	devs := slices.Clone(d.WG.Devices)
	cloned := map[int]bool{}
	for _, r := range reads {
		f, dir, name, rf := r.f, r.dir, r.name, r.rf
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
			dev.Held = slices.Clone(dev.Held)
			cloned[di] = true
		}
		// The file's held peer, if it had one, goes; it comes back below
		// if the file still holds it out.
		dev.Held = slices.DeleteFunc(dev.Held, func(h wg.HeldPeer) bool { return h.Source == f })
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
		life := clients.LifeOf(rf.Peer.Peer, now)
		p.Expires = life.Expires
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
		for _, q := range dev.Held {
			// A held peer keeps its key and its prefixes in the
			// register's claims.
			if q.PublicKey == p.PublicKey || slices.ContainsFunc(p.AllowedIPs, func(a netip.Prefix) bool { return slices.Contains(q.AllowedIPs, a) }) {
				return d, nil, nil, &NeedFullSync{f + ": its key or a prefix is a held peer's"}
			}
		}
		if life.Held() {
			// Kept out of the device, listed as held: like a file gone,
			// for the kernel.
			dev.Held = append(dev.Held, heldPeer(p, life))
			if old != nil {
				dev.Peers = slices.Delete(dev.Peers, at, at+1)
				changes = append(changes, change{di, old, nil})
			}
			continue
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
	// Per device and key: what the changed files held before and hold
	// now. A key that moved between files (a rename) is an update in
	// place, not a remove and an add, which would drop its session.
	h := c.WG()
	type diff struct {
		dev      string
		old, new *wg.Peer
	}
	var keys []diff
	at := map[string]int{} // device + key -> index in keys
	for _, ch := range changes {
		name := devs[ch.dev].Name
		for _, p := range []*wg.Peer{ch.old, ch.new} {
			if p == nil {
				continue
			}
			id := name + "\x00" + string(p.PublicKey[:])
			i, ok := at[id]
			if !ok {
				i = len(keys)
				at[id] = i
				keys = append(keys, diff{dev: name})
			}
			if p == ch.old && keys[i].old == nil {
				keys[i].old = p
			}
			if p == ch.new {
				keys[i].new = p
			}
		}
	}
	var ops []wg.Op
	for _, k := range keys {
		old := wg.ObservedDevice{Name: k.dev, Impl: h.ImplOf(k.dev)}
		switch {
		case k.new == nil:
			ops = append(ops, wg.Op{Kind: wg.OpRemovePeer, Device: k.dev, PeerID: k.old.PublicKey, Old: old})
		case k.old == nil:
			ops = append(ops, wg.Op{Kind: wg.OpAddPeer, Device: k.dev, PeerID: k.new.PublicKey, Peer: *k.new, Endpoint: literal(k.new.Endpoint), Old: old})
		default:
			// The same key: what differs, in place (a renamed peer's
			// name is the desired state's alone).
			if f := wg.PeerFields(*k.old, *k.new); f != 0 {
				ops = append(ops, wg.Op{Kind: wg.OpUpdatePeer, Device: k.dev, PeerID: k.new.PublicKey, Peer: *k.new, Endpoint: literal(k.new.Endpoint), Fields: f, Old: old})
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
		a.Keepalive == b.Keepalive && a.Roams == b.Roams && slices.Equal(a.AllowedIPs, b.AllowedIPs) && a.Expires.Equal(b.Expires)
}
