// Package release is nodeagent release: the way back to the old setup
// after an adoption (nodeagent import, adopt: true). What the config
// adopts is handed back, left as it is and running: its mark is taken off
// (a link's alias, an address's IFA_PROTO, a route's protocol, a rule's
// FRA_PROTOCOL), so that it is no longer nodeagent's. What nodeagent made
// itself is removed, as teardown removes it (its nftables tables, the
// links, devices, routes and rules the config does not adopt).
//
// Who takes an adopted object back decides how it is handed back. The
// network configuration software of the seeds' nodes takes an existing
// link over as it is: systemd-networkd (and netplan, which writes its
// files) finds its .netdev's link there and uses it, NetworkManager
// manages the link again, ifupdown's VLAN stanza makes the link only when
// it is missing. Those links stay, unmarked. wg-quick and a unit that
// runs `ip link add`, `ip route add` or `ip rule add` make their objects
// themselves and fail on one that exists ("already exists", "File
// exists"): what they make is deleted at release, so that the unit starts
// again, and the plan says so, object by object. A link that pods' links
// sit on (a macvlan CNI plugin's, in the pods' namespaces) is never
// deleted unasked: release refuses and names them, as teardown does; with
// --in-place it hands such a link back as it is, and the unit makes it at
// the next boot.
//
// The old owners are read from the files under /etc as they are at
// release: a file the import's steps removed (a .netdev, a
// NetworkManager profile) is not there to find, and the object is handed
// back in place with a note that nothing makes it at the next boot.
package release

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/owners"
	"github.com/nodeagent/nodeagent/netcfg/route"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// Options say how to release.
type Options struct {
	// InPlace hands every adopted object back as it is, also those whose
	// old owner makes them itself: that owner then starts at the next
	// boot, not now. Nothing adopted is deleted.
	InPlace bool
	// PIA are the config's PIA devices (nodeagent's own tunnels, never
	// adopted): the old setup's scripts make theirs again.
	PIA []string
}

// Plan is what release does: the teardown's plan with the adopted
// objects handed back instead of removed, the steps that start the old
// setup again afterwards, and notes.
type Plan struct {
	netcfg.Plans
	// Steps are shell lines with a comment each, in order, for after
	// release.
	Steps []string
	// Notes say what the operator must know: objects nothing makes at the
	// next boot, peers a wg-quick file lacks, files not read.
	Notes []string
	// Deleted are the adopted links and devices release deletes for
	// their owners to make again.
	Deleted []string
}

// Make turns tp, the teardown plan of this node (netcfg's TeardownPlan:
// every object nodeagent owns removed), into release's plan, given d, the
// desired state of the config whose adopt: true marks say what was
// adopted, and own, the old owners found under /etc. It is pure.
func Make(tp netcfg.Plans, d netcfg.Desired, own Owners, o Options) Plan {
	p := Plan{Plans: tp}
	m := maker{own: own, o: o, gone: map[string]bool{}, steps: map[string]bool{}, remakes: map[string][]string{}}
	adoptedLinks := map[string]bool{}
	for _, l := range d.Link.Links {
		if l.Adopt {
			adoptedLinks[l.Name] = true
		}
	}
	adoptedDevs := map[string]bool{}
	for _, dev := range d.WG.Devices {
		if dev.Adopt {
			adoptedDevs[dev.Name] = true
		}
	}

	// Links: deleted for a unit that makes them, else handed back. A
	// link whose parent is deleted goes with it.
	p.Link.Ops = slices.Clone(tp.Link.Ops)
	for i, op := range p.Link.Ops {
		if op.Kind != link.OpDeleteLink || !adoptedLinks[op.Link] {
			if op.Kind == link.OpDeleteLink {
				m.gone[op.Link] = true
			}
			continue
		}
		if u := own.unitLink(op.Link); u != nil && !o.InPlace {
			op.Reason = fmt.Sprintf("%s makes it again (its ip link add fails while it exists)", u.Name)
			p.Link.Ops[i] = op
			m.gone[op.Link] = true
			p.Deleted = append(p.Deleted, op.Link)
			m.restart(u.Name, op.Link)
			continue
		}
		p.Link.Ops[i] = link.Release(op.Old, m.linkOwner(op.Link, op.Old.Kind))
	}
	for i, op := range p.Link.Ops {
		if op.Kind == link.OpReleaseLink && m.gone[op.Old.Parent] {
			// The kernel deletes it with its parent.
			p.Link.Ops[i] = link.Op{Kind: link.OpDeleteLink, Link: op.Link, Old: op.Old, Reason: "goes with its parent " + op.Old.Parent + ", which release deletes"}
			m.gone[op.Link] = true
		}
	}

	// WireGuard devices: deleted for wg-quick, else handed back.
	p.WG.Ops = slices.Clone(tp.WG.Ops)
	for i, op := range p.WG.Ops {
		if op.Kind != wg.OpDeleteDevice {
			continue
		}
		if !adoptedDevs[op.Device] {
			m.gone[op.Device] = true
			continue
		}
		if q, ok := own.WGQuick[op.Device]; ok && !o.InPlace {
			op.Detail = fmt.Sprintf("wg-quick@%s makes it again from %s (wg-quick up fails while it exists)", op.Device, q.File)
			p.WG.Ops[i] = op
			m.gone[op.Device] = true
			p.Deleted = append(p.Deleted, op.Device)
			m.restart("wg-quick@"+op.Device, op.Device)
			m.missingPeers(op.Device, op.Old, q)
			continue
		}
		p.WG.Ops[i] = wg.Release(op.Old, m.deviceOwner(op.Device))
	}

	// Routes and rules: deleted when a unit adds them, or when their
	// device goes; else handed back.
	adoptedRoutes := map[routeKey]bool{}
	for r := range d.Route.AdoptRoutes {
		adoptedRoutes[keyOf(r)] = true
	}
	p.Route.Ops = slices.Clone(tp.Route.Ops)
	for i, op := range p.Route.Ops {
		switch op.Kind {
		case route.OpDelRoute:
			r := op.Route
			if !adoptedRoutes[keyOf(r)] || m.gone[r.Dev] {
				continue
			}
			if u := own.unitRoute(keyOf(r)); u != nil && !o.InPlace {
				op.Reason = fmt.Sprintf("%s adds it again (its ip route add fails while it exists)", u.Name)
				p.Route.Ops[i] = op
				m.restart(u.Name, "")
				continue
			}
			p.Route.Ops[i] = route.ReleaseRoute(r, m.unitLater(own.unitRoute(keyOf(r))))
		case route.OpDelRule:
			r := op.Rule
			if !adoptedRule(d.Route.AdoptRules, r) {
				continue
			}
			if u := own.unitRule(r); u != nil && !o.InPlace {
				op.Reason = fmt.Sprintf("%s adds it again (its ip rule add fails while it exists)", u.Name)
				p.Route.Ops[i] = op
				m.restart(u.Name, "")
				continue
			}
			p.Route.Ops[i] = route.ReleaseRule(r, m.unitLater(own.unitRule(r)))
		}
	}
	if own.NodeagentEnabled {
		p.Steps = append(p.Steps, "systemctl disable nodeagent   # else the next boot starts it, and it takes every object of the config over again")
	}
	for _, f := range own.DropIns {
		p.Steps = append(p.Steps, fmt.Sprintf("rm %s && systemctl daemon-reload   # it names nodeagent: its Wants= would start nodeagent again with its unit, and its ExecStartPre waits for it", f))
	}
	// The units that make what release deleted, each stopped first: a
	// oneshot unit the import only disabled is still active
	// (RemainAfterExit), and a start would not run it again; wg-quick's
	// stop, finding its device gone, fails harmlessly.
	for _, u := range m.units {
		what := "what release deleted for it"
		if len(m.remakes[u]) > 0 {
			what = strings.Join(m.remakes[u], ", ")
		}
		p.Steps = append(p.Steps, fmt.Sprintf("systemctl stop %s; systemctl enable --now %s   # makes %s again", u, u, what))
	}
	p.Steps = append(p.Steps, m.ordered...)
	if len(o.PIA) > 0 {
		for _, u := range own.PIAUnits {
			p.Steps = append(p.Steps, fmt.Sprintf("systemctl enable --now %s   # PIA's manual-connections scripts make their tunnel again", u))
		}
	}
	if len(d.Nft.KillSwitch) > 0 {
		p.Notes = append(p.Notes, "the kill switch goes with nodeagent's nftables table: until the old setup's tunnel and firewall are up again, nothing holds the VLAN's forwarded traffic back from the other links")
	}
	p.Notes = append(p.Notes, m.notes...)
	p.Notes = append(p.Notes, own.Problems...)
	return p
}

// maker is Make's state.
type maker struct {
	own     Owners
	o       Options
	gone    map[string]bool // links and devices release deletes
	steps   map[string]bool
	ordered []string
	notes   []string
	// units are the units that make what release deletes, in the order
	// met; remakes the links and devices each makes.
	units   []string
	remakes map[string][]string
}

func (m *maker) step(s string) {
	if !m.steps[s] {
		m.steps[s] = true
		m.ordered = append(m.ordered, s)
	}
}

// restart records that unit makes what (a link or device, or "" for a
// route or rule) again after release, now.
func (m *maker) restart(unit, what string) {
	if _, ok := m.remakes[unit]; !ok {
		m.units = append(m.units, unit)
		m.remakes[unit] = nil
	}
	if what != "" {
		m.remakes[unit] = append(m.remakes[unit], what)
	}
}

// unitLater is why an object a unit adds is handed back in place
// (--in-place): the unit adds it at the next boot.
func (m *maker) unitLater(u *Unit) string {
	if u == nil {
		return ""
	}
	m.step(fmt.Sprintf("systemctl enable %s   # at the next boot; not now: it fails on what release left in place", u.Name))
	return u.Name + " adds it at the next boot"
}

// linkOwner says who takes the link back as it is, with the step for it.
func (m *maker) linkOwner(name, kind string) string {
	if u := m.own.unitLink(name); u != nil {
		m.unitLater(u)
		return u.Name + " makes it at the next boot; not now, as its ip link add fails while it exists"
	}
	return m.fileOwner(name, kind)
}

// deviceOwner is linkOwner for a WireGuard device.
func (m *maker) deviceOwner(name string) string {
	if q, ok := m.own.WGQuick[name]; ok {
		m.step(fmt.Sprintf("systemctl enable wg-quick@%s   # at the next boot; not now: wg-quick up fails while %s exists", name, name))
		return fmt.Sprintf("wg-quick@%s makes it at the next boot from %s; not now, as wg-quick up fails while it exists", name, q.File)
	}
	return m.fileOwner(name, "wireguard")
}

// fileOwner says which network configuration file takes the link back,
// with the step that hands it over; a link none takes is noted.
func (m *maker) fileOwner(name, kind string) string {
	var files []owners.Owner
	for _, f := range m.own.Files {
		if f.Link == name {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		m.notes = append(m.notes, fmt.Sprintf("%s (%s) is handed back as it is, and nothing under /etc makes it: it stays until the next boot. Put back what made it (what the import's steps retired) before then, or it is gone after it", name, kind))
		return "nothing under /etc makes it now"
	}
	f := files[0]
	for _, x := range files {
		if x.Makes {
			f = x
			break
		}
	}
	switch {
	case f.Kind == owners.NetworkManager || f.Kind == owners.Netplan && f.Renderer == "NetworkManager":
		m.step(fmt.Sprintf("nmcli device set %s managed yes   # NetworkManager takes %s back with its profile (%s)", name, name, f.File))
	case f.Kind == owners.Netplan:
		m.step(fmt.Sprintf("netplan generate && networkctl reload   # systemd-networkd takes %s over as it is (netplan's %s)", name, f.File))
	case f.Kind == owners.Networkd:
		m.step(fmt.Sprintf("networkctl reload   # systemd-networkd finds %s there and uses it as it is (%s)", name, f.File))
	case f.Kind == owners.Ifupdown:
		m.notes = append(m.notes, fmt.Sprintf("%s: ifupdown (%s) brings it up at the next boot; do not run ifup %s now, its ip addr add fails on the address that is there", name, f.File, name))
	}
	return fmt.Sprintf("%s takes it as it is (%s)", f.Kind, f.File)
}

// missingPeers notes the device's peers that its wg-quick file does not
// list (added to nodeagent's register since the import): wg-quick makes
// the device without them.
func (m *maker) missingPeers(dev string, od wg.ObservedDevice, q WGQuick) {
	var missing []string
	for k := range od.Peers {
		if !q.Peers[k.String()] {
			missing = append(missing, k.String())
		}
	}
	if len(missing) == 0 {
		return
	}
	slices.Sort(missing)
	shown := missing[:min(len(missing), 5)]
	more := ""
	if len(missing) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(missing)-len(shown))
	}
	m.notes = append(m.notes, fmt.Sprintf("%d peer(s) of %s are not in %s (added since the import, in nodeagent's register): %s%s; add their [Peer] stanzas to %s before wg-quick@%s starts, or they lose the tunnel",
		len(missing), dev, q.File, strings.Join(shown, ", "), more, q.File, dev))
}

func keyOf(r route.Route) routeKey { return routeKey{Table: r.Table, To: r.To, Metric: r.Metric} }

// adoptedRule reports whether r is a rule the config adopts: one of
// adopt, or like one of them but for fields that do not tell rules apart
// at their priority (a drifted copy).
func adoptedRule(adopt map[route.Rule]bool, r route.Rule) bool {
	if adopt[r] {
		return true
	}
	for a := range adopt {
		if a.Priority == r.Priority && a.Family == r.Family && a.From == r.From && a.To == r.To && a.Table == r.Table {
			return true
		}
	}
	return false
}

func (o Owners) unitLink(name string) *Unit {
	for i, u := range o.Units {
		if slices.Contains(u.Links, name) {
			return &o.Units[i]
		}
	}
	return nil
}

func (o Owners) unitRoute(k routeKey) *Unit {
	for i, u := range o.Units {
		if slices.Contains(u.Routes, k) {
			return &o.Units[i]
		}
	}
	return nil
}

func (o Owners) unitRule(r route.Rule) *Unit {
	for i, u := range o.Units {
		for _, k := range u.Rules {
			if k.Family == r.Family && (k.Priority < 0 || k.Priority == r.Priority) && k.From == r.From && k.To == r.To && (k.Table < 0 || k.Table == r.Table) {
				return &o.Units[i]
			}
		}
	}
	return nil
}
