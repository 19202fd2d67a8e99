// Package neighbours follows the network software beside nodeagent on a
// node, for the daemon's Coexistence condition: it watches their files
// and their state on the bus, and says, with netcfg/hazard, what on the
// node would undo nodeagent's work (systemd-networkd, udev, ifupdown,
// NetworkManager) and what to do about it. It also puts a repair down to
// the hazard that explains it, once per cause.
//
// It imports nothing of the daemon (package agent): the daemon feeds it
// the desired state and what its syncs observed, and sets the condition
// from what it says.
package neighbours

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/nmbus"
	"github.com/nodeagent/nodeagent/netcfg/sdbus"
)

// Options configure the neighbours' watch.
type Options struct {
	// Paths is where their files are read ("" root: the node's; tests
	// point it at a fixture tree).
	Paths hazard.Paths
	// System, when set, is what systemd says (whether networkd runs, its
	// version, the virtualization and architecture) instead of asking it
	// over the bus; the node's files fill the rest. Tests set it.
	System *hazard.System
	// BusAddress is the system bus ("" the node's).
	BusAddress string
	// Log receives what the watches see; Changed (which must not block)
	// is called whenever a neighbour's files or state changed.
	Log     *slog.Logger
	Changed func()
}

// Neighbours is the watch of the neighbours. Look and Causes are the
// daemon loop's; the watches' goroutines only update what Look reads.
type Neighbours struct {
	o  Options
	nm *nmWatch

	mu sync.Mutex
	// facts are what systemd said last; factsErr why it did not.
	facts    sdbus.Facts
	factsErr error

	// Loop-owned.
	logged string
	found  []hazard.Hazard
	causes map[string]bool
}

// Start starts the watches: the files, NetworkManager and systemd over
// the bus. They stop with ctx.
func Start(ctx context.Context, o Options) *Neighbours {
	n := &Neighbours{o: o}
	watchNeighbours(ctx, o.Paths, n.changed, o.Log)
	n.nm = startNetworkManager(ctx, o.Log, n.changed)
	if o.System == nil {
		go n.watchSystemd(ctx)
	}
	return n
}

func (n *Neighbours) changed() {
	if n.o.Changed != nil {
		n.o.Changed()
	}
}

// system is what networkd and udevd read of the node: its files', and
// what systemd last said on the bus.
func (n *Neighbours) system() hazard.System {
	s := n.o.Paths.ReadSystem()
	if n.o.System != nil {
		o := *n.o.System
		o.Hostname, o.MachineID = cmp(o.Hostname, s.Hostname), cmp(o.MachineID, s.MachineID)
		o.KernelCmdline, o.KernelRelease = cmp(o.KernelCmdline, s.KernelCmdline), cmp(o.KernelRelease, s.KernelRelease)
		if o.NetworkdUser == nil {
			o.NetworkdUser = s.NetworkdUser
		}
		if o.Native == "" {
			o.Native = s.Native
		}
		o.Ifupdown = o.Ifupdown || s.Ifupdown
		return o
	}
	n.mu.Lock()
	f := n.facts
	n.mu.Unlock()
	s.Networkd, s.Version = f.Networkd, f.Version
	s.Virtualization, s.VirtualizationKnown, s.Architecture = f.Virtualization, f.Known, f.Architecture
	return s
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Links are nodeagent's links of d as networkd and udev see them: what
// obs (the links a sync observed) says of those that exist, completed
// from sysfs and udev's database; what the kernel will make of those
// that do not yet (hazard.Predict), a VLAN with its parent's address.
func Links(p hazard.Paths, d netcfg.Desired, obs link.Observed) []hazard.Link {
	var out []hazard.Link
	one := func(name, kind, parent string, mac net.HardwareAddr) {
		ol, seen := obs.Links[name]
		if seen {
			mac = obs.MACs[ol.Index]
		}
		l := hazard.Predict(name, kind, mac)
		l.Parent = parent
		if seen {
			l.AltNames = ol.AltNames
			if ol.Owned {
				l.Alias = "nodeagent"
			}
			l = p.Observe(l, ol.Index)
		}
		out = append(out, l)
	}
	for _, l := range d.Link.Links {
		mac := l.MAC
		if l.Kind == link.VLAN {
			if pl, ok := obs.Links[l.Parent]; ok {
				mac = obs.MACs[pl.Index]
			}
		}
		one(l.Name, string(l.Kind), l.Parent, mac)
	}
	for _, dev := range d.WG.Devices {
		one(dev.Name, "wireguard", "", nil)
	}
	return out
}

// Look says what on the node would undo nodeagent's work on links (and,
// where routing is whether d has routing, on its rules and routes): the
// hazards of networkd, udev, ifupdown and NetworkManager. It never
// blocks: what the bus says is the watches' last word.
func (n *Neighbours) Look(links []hazard.Link, routing bool) []hazard.Hazard {
	s := n.system()
	p := n.o.Paths
	var out []hazard.Hazard
	for _, hz := range hazard.Networkd(p, s, links) {
		if hz.Setting != "" && !routing {
			continue
		}
		out = append(out, hz)
	}
	out = append(out, hazard.Udev(p, s, links)...)
	out = append(out, hazard.Ifupdown(p, s, links)...)
	var names []string
	for _, l := range links {
		names = append(names, l.Name)
	}
	out = append(out, n.nm.hazards(names)...)
	return out
}

// Eval looks (Look), keeps what it found for Causes, and logs a new set
// at WARN, each hazard with its fix, once; it returns the hazards.
func (n *Neighbours) Eval(links []hazard.Link, routing bool) []hazard.Hazard {
	if n == nil {
		return nil
	}
	hs := n.Look(links, routing)
	n.found = hs
	lines := make([]string, len(hs))
	for i, hz := range hs {
		lines[i] = hz.String()
	}
	if key := strings.Join(lines, "\n"); key != n.logged {
		n.logged = key
		for _, hz := range hs {
			n.o.Log.Warn("a neighbour undoes nodeagent's work", "source", hz.Source, "what", hz.What, "fix", hz.Fix)
		}
	}
	return hs
}

// Found are the hazards the last Eval found.
func (n *Neighbours) Found() []hazard.Hazard {
	if n == nil {
		return nil
	}
	return n.found
}

// Causes logs, at WARN and once per cause for the daemon's life, the
// hazards that explain the repairs (kind to count) of a drift sync: an
// operator reads why nodeagent keeps putting things back, and its fix,
// not a line per repair. A repair no known hazard explains is logged once
// per kind. It returns whether anything was logged.
func (n *Neighbours) Causes(repairs map[string]int) bool {
	if n == nil {
		return false
	}
	if n.causes == nil {
		n.causes = map[string]bool{}
	}
	logged := false
	for _, kind := range slices.Sorted(maps.Keys(repairs)) {
		explained := false
		for _, hz := range n.found {
			if !slices.Contains(hz.Kinds, kind) {
				continue
			}
			explained = true
			if key := hz.Source + "\x00" + hz.What; !n.causes[key] {
				n.causes[key] = true
				logged = true
				n.o.Log.Warn("repairing what a neighbour deleted", "kind", kind, "cause", hz.Source+": "+hz.What, "fix", hz.Fix)
			}
		}
		if key := "\x00" + kind; !explained && !n.causes[key] {
			n.causes[key] = true
			logged = true
			n.o.Log.Warn("repairing what another program changed; no known neighbour explains it", "kind", kind,
				"hint", "nodeagent_drift_repairs_total counts every repair; nodeagentctl status lists the neighbours it knows of")
		}
	}
	return logged
}

// Once says what on the node would undo nodeagent's work, for the
// one-shot commands (plan, apply --once): it asks systemd on the bus
// once, within a few seconds.
func Once(ctx context.Context, p hazard.Paths, d netcfg.Desired, obs link.Observed) []hazard.Hazard {
	n := &Neighbours{o: Options{Paths: p, Log: slog.New(slog.DiscardHandler)}}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if c, err := nmbus.Dial(ctx, ""); err == nil {
		n.facts, n.factsErr = sdbus.Read(ctx, c)
		c.Close()
	}
	return n.Look(Links(p, d, obs), Routing(d))
}

// Routing reports whether d has policy routing: networkd's settings that
// delete foreign rules and routes matter then.
func Routing(d netcfg.Desired) bool {
	return len(d.Route.Rules) > 0 || len(d.Route.Routes) > 0
}

// Suspect names the program most likely changing an object nodeagent
// keeps repairing: a hazard found that explains its kind on its link (or
// a setting that explains its kind), else what the form it came back in
// suggests (text is the repair's plan line).
func (n *Neighbours) Suspect(kind, object, text string) string {
	var found []hazard.Hazard
	if n != nil {
		found = n.found
	}
	onLink := func(l string) bool {
		return l != "" && (object == "link "+l || strings.HasSuffix(object, " on "+l) || strings.Contains(object, " dev "+l))
	}
	for _, pass := range []func(hazard.Hazard) bool{
		func(h hazard.Hazard) bool { return onLink(h.Link) },
		func(h hazard.Hazard) bool { return h.Link == "" },
	} {
		for _, h := range found {
			if slices.Contains(h.Kinds, kind) && pass(h) {
				return h.Manager + " (" + h.Source + ")"
			}
		}
	}
	switch {
	case strings.Contains(text, "_lft"):
		return "a DHCP client or NetworkManager (it came back with a lease's lifetime); no known neighbour's configuration explains it"
	case strings.Contains(text, "noprefixroute"):
		return "NetworkManager or a DHCP client (it came back as noprefixroute); no known neighbour's configuration explains it"
	}
	return "unknown: no known neighbour's configuration explains it"
}
