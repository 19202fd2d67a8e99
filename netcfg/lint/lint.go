// Package lint finds what a valid config gets wrong about the network it
// runs in: settings the kernel accepts that do not do what the operator
// meant. Each finding is a warning at the line it is about, naming the fix;
// it never rejects a config (validation does that).
//
// It depends on the config alone, so validate, plan and the daemon's
// status all give the same warnings.
package lint

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// Check returns c's warnings, ordered by line.
func Check(c *config.Config) []*config.FieldError {
	w := &checker{c: c}
	w.shims()
	w.translatedPorts()
	slices.SortStableFunc(w.out, func(a, b *config.FieldError) int { return a.Line - b.Line })
	return w.out
}

type checker struct {
	c   *config.Config
	out []*config.FieldError
}

func (w *checker) warn(path, format string, args ...any) {
	w.out = append(w.out, &config.FieldError{File: w.c.File, Line: w.c.Lines.Line(path), Field: path, Msg: fmt.Sprintf(format, args...)})
}

// link is a configured VLAN or macvlan: its field path and addresses.
type link struct {
	path  string
	addrs []netip.Prefix
}

// shims warns about the layout that cuts a node off from its own macvlan
// pods. A macvlan child (a pod attached by the macvlan CNI plugin) never
// receives what its parent link sends, and never reaches the parent's own
// addresses: the kernel hands frames between a macvlan parent and its
// children to the wire, where nothing sends them back (a real 802.1Q link
// does the same). So a pod on enp1s0.50 whose gateway is an address of
// enp1s0.50 gets no replies, and a route to the pods' subnet out of
// enp1s0.50 sends the node's packets past them. A macvlan of the node's own
// on the same parent (the shim) is a sibling of the pods, which they do
// reach: the gateway and the route belong on it.
func (w *checker) shims() {
	links := map[string]link{}
	for i, v := range w.c.VLANs {
		links[v.Name] = link{fmt.Sprintf("vlans[%d]", i), prefixes(v.Addresses)}
	}
	for i, m := range w.c.Macvlans {
		links[m.Name] = link{fmt.Sprintf("macvlans[%d]", i), prefixes(m.Addresses)}
	}
	// shimsOn maps a parent to the names of the macvlans on it, in config order.
	shimsOn := map[string][]string{}
	for _, m := range w.c.Macvlans {
		if m.Mode == "" || m.Mode == "bridge" {
			shimsOn[m.Parent] = append(shimsOn[m.Parent], m.Name)
		}
	}
	// shimFor is the shim on parent for prefix p: one holding an address
	// in p's subnet, else the first.
	shimFor := func(parent string, p netip.Prefix) (string, bool) {
		for _, s := range shimsOn[parent] {
			if overlapsAny(links[s].addrs, p) {
				return s, true
			}
		}
		return shimsOn[parent][0], false
	}
	for _, parent := range slices.Sorted(maps.Keys(shimsOn)) {
		l, ok := links[parent]
		if !ok {
			continue // not ours: its addresses are not in the config
		}
		for j, a := range l.addrs {
			if !a.IsValid() {
				continue // validation reports it
			}
			shim, same := shimFor(parent, a)
			if !same && len(links[shim].addrs) > 0 {
				continue // the shim serves another subnet: a's is not the pods'
			}
			w.warn(fmt.Sprintf("%s.addresses[%d]", l.path, j),
				"macvlan pods on %s cannot reach %s on %s itself; put it on %s", parent, a.Addr(), parent, shim)
		}
	}
	for ti, t := range w.c.Routing.Tables {
		for ri, r := range t.Routes {
			if len(shimsOn[r.Dev]) == 0 || r.To == "" || r.To == "default" {
				continue
			}
			to, err := netip.ParsePrefix(r.To)
			if err != nil {
				continue // validation reports it
			}
			shim, same := shimFor(r.Dev, to)
			if !same && len(links[shim].addrs) > 0 {
				continue // as above: to is not the pods' subnet
			}
			w.warn(fmt.Sprintf("routing.tables[%d].routes[%d].dev", ti, ri),
				"macvlan pods on %s never receive what the node sends out of %s itself; route %s via %s", r.Dev, r.Dev, to, shim)
		}
	}
}

// translatedPorts warns about a PIA port forwarded to another port. PIA
// forwards one port, chosen by PIA; a torrent client announces to trackers
// and the DHT the port it listens on, so one listening on a fixed toPort
// announces a port peers cannot reach, and the forwarded port, which they
// could, is never announced. The client should listen on the forwarded
// port itself (onChange, the port file).
func (w *checker) translatedPorts() {
	for i, d := range w.c.WireGuard {
		if d.PIA == nil || !d.PIA.PortForward.Enabled || d.PIA.PortForward.ToPort == 0 {
			continue
		}
		w.warn(fmt.Sprintf("wireguard[%d].pia.portForward.toPort", i),
			"the forwarded port is PIA's, not %d: a torrent client listening on %d announces a port peers cannot reach; drop toPort and set the client's port to the forwarded one (onChange)",
			d.PIA.PortForward.ToPort, d.PIA.PortForward.ToPort)
	}
}

// prefixes parses ss, index for index; one that does not parse is the
// zero Prefix (validation reports it).
func prefixes(ss []string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i], _ = netip.ParsePrefix(s)
	}
	return out
}

func overlapsAny(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q.IsValid() && q.Masked().Overlaps(p.Masked()) {
			return true
		}
	}
	return false
}
