package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// The checks of a remote-access device's clients (wireguard[].clients),
// of a peer's disabled and expires, and of a kill switch's allowTo: what
// `nodeagentctl peer add` relies on, kept out of validate.go.

// peerLife checks a peer's expires (disabled needs no check).
func (v *validator) peerLife(p string, peer WGPeer) {
	if peer.Expires == "" {
		return
	}
	if _, err := time.Parse(time.RFC3339, peer.Expires); err != nil {
		v.errorf(fieldPath(p, "expires"), "%q is not an RFC 3339 time, like 2027-01-31T18:00:00Z", clipValue(peer.Expires))
	}
}

// killSwitchTo checks each kill switch's allowTo.
func (v *validator) killSwitchTo(f Firewall) {
	for i, k := range f.KillSwitch {
		from, err := netip.ParsePrefix(k.From)
		for j, s := range k.AllowTo {
			p := indexPath(fieldPath(indexPath("firewall.killSwitch", i), "allowTo"), j)
			to, msg := parseNetPrefix(s)
			switch {
			case !v.check(p, msg):
			case err == nil && to.Addr().Is4() != from.Addr().Is4():
				v.errorf(p, "%s and from %s are different address families", s, k.From)
			case to.Bits() == 0:
				v.errorf(p, "%s lets the traffic go anywhere, which is no kill switch; list the LAN's prefixes", s)
			}
		}
	}
}

// DefaultClientKeepalive is a client's PersistentKeepalive when
// clients.persistentKeepalive is not set.
const DefaultClientKeepalive = 25

// clients checks every device's clients section: its own fields, and
// that each egress pool is routed through its device's tunnel as a VLAN
// is (a rule to a kill-switch table with a default route by the device, a
// kill switch allowing out by it, a masquerade out by it), so that a
// client added with --via never reaches the internet any other way.
func (v *validator) clients(c *Config) {
	pia := map[string]bool{}
	for _, w := range c.WireGuard {
		if w.PIA != nil && w.Name != "" {
			pia[w.Name] = true
		}
	}
	for i, w := range c.WireGuard {
		if w.Clients == nil {
			continue
		}
		wp := indexPath("wireguard", i)
		cp := fieldPath(wp, "clients")
		cl := w.Clients
		if w.PIA != nil {
			v.errorf(cp, "a PIA tunnel has no clients of its own; put clients on the remote-access device")
			continue
		}
		if w.PeersDir == "" {
			v.errorf(cp, "needs peersDir: peer add writes each client's peer file there")
		}
		var subnets []netip.Prefix
		for _, s := range w.Addresses {
			if p, err := netip.ParsePrefix(s); err == nil {
				subnets = append(subnets, p.Masked())
			}
		}
		if len(subnets) == 0 && !v.failedUnder(fieldPath(wp, "addresses")) {
			v.errorf(cp, "needs addresses: a client's address is taken from the device's subnets")
		}
		ep := fieldPath(cp, "endpoint")
		if cl.Endpoint == "" {
			v.errorf(ep, "required: the host:port clients dial (the name or address the router forwards to listenPort), like vpn.example.org:%d", max(w.ListenPort, 51820))
		} else {
			v.check(ep, checkEndpoint(cl.Endpoint))
		}
		for j, s := range cl.AllowedIPs {
			_, msg := parseNetPrefix(s)
			v.check(indexPath(fieldPath(cp, "allowedIPs"), j), msg)
		}
		v.clientDNS(fieldPath(cp, "dns"), cl.DNS)
		if cl.PersistentKeepalive != nil {
			v.intRange(fieldPath(cp, "persistentKeepalive"), *cl.PersistentKeepalive, 0, 65535)
		}
		var pools []netip.Prefix
		for j, e := range cl.Egress {
			eg := indexPath(fieldPath(cp, "egress"), j)
			v.clientDNS(fieldPath(eg, "dns"), e.DNS)
			vp := fieldPath(eg, "via")
			switch {
			case e.Via == "":
				v.errorf(vp, "required: the PIA device the pool's internet leaves by")
			case !pia[e.Via]:
				v.errorf(vp, "%q is not a PIA device of this config", clipValue(e.Via))
			}
			pp := fieldPath(eg, "pool")
			if e.Pool == "" {
				v.errorf(pp, "required: the IPv4 prefix of the device's subnet whose clients leave by %s, like 10.90.0.128/25", e.Via)
				continue
			}
			pool, msg := parseNetPrefix(e.Pool)
			if !v.check(pp, msg) {
				continue
			}
			if !pool.Addr().Is4() {
				v.errorf(pp, "%s: a pool is IPv4 (PIA carries IPv4 only; its clients get no IPv6 address)", e.Pool)
				continue
			}
			if !slices.ContainsFunc(subnets, func(s netip.Prefix) bool { return s.Bits() <= pool.Bits() && s.Contains(pool.Addr()) }) && len(subnets) > 0 {
				v.errorf(pp, "%s is not inside the device's subnets (%s)", e.Pool, prefixList(subnets))
				continue
			}
			if k := slices.IndexFunc(pools, pool.Overlaps); k >= 0 {
				v.errorf(pp, "%s overlaps the pool of egress[%d]", e.Pool, k)
				continue
			}
			pools = append(pools, pool)
			if e.Via != "" && pia[e.Via] {
				v.egressRouting(c, pp, pool, e.Via)
			}
		}
	}
}

// clientDNS checks a list of resolver addresses.
func (v *validator) clientDNS(p string, dns []string) {
	for j, s := range dns {
		_, msg := parseAddr(s)
		v.check(indexPath(p, j), msg)
	}
}

// egressRouting checks that pool is routed through via's kill switch: the
// rule, the table's default route by via and its kill switch, the
// firewall kill switch and the masquerade. Like piaRouting it holds back
// while the routing or the firewall has errors of its own.
func (v *validator) egressRouting(c *Config, pp string, pool netip.Prefix, via string) {
	if len(v.bad) > 0 || v.unknownField() || v.failedUnder("routing") || v.failedUnder("firewall") {
		return
	}
	holds := func(s string) bool {
		p, err := netip.ParsePrefix(s)
		return err == nil && p.Addr().Is4() && p.Bits() <= pool.Bits() && p.Masked().Contains(pool.Addr())
	}
	tables := map[int]bool{}
	for _, t := range c.Routing.Tables {
		if t.KillSwitch && slices.ContainsFunc(t.Routes, func(r Route) bool {
			return r.Dev == via && (r.To == "default" || r.To == "0.0.0.0/0") && (r.Type == "" || r.Type == "unicast")
		}) {
			tables[t.ID] = true
		}
	}
	routed := slices.ContainsFunc(c.Routing.Rules, func(r Rule) bool {
		return tables[r.Table] && holds(r.From) && (r.Action == "" || r.Action == "table") && !r.Invert &&
			r.IIF == "" && r.OIF == "" && r.FwMark == "" && r.To == "" && r.SuppressPrefixLength == nil
	})
	if !routed {
		v.errorf(pp, "%s is not routed through %s's kill switch: add a rule {priority: N, from: %s, table: T} to a routing table with killSwitch: true and a route {to: default, dev: %s} (the table a VLAN behind %s uses will do)", pool, via, pool, via, via)
	}
	if !slices.ContainsFunc(c.Firewall.KillSwitch, func(k KillSwitch) bool { return holds(k.From) && slices.Contains(k.AllowOut, via) }) {
		v.errorf(pp, "%s has no kill switch: add firewall.killSwitch {from: %s, allowOut: [%s], allowTo: [the LAN's prefixes]}, so its clients reach nothing outside while %s is down", pool, pool, via, via)
	} else if slices.ContainsFunc(c.Firewall.KillSwitch, func(k KillSwitch) bool {
		return holds(k.From) && slices.ContainsFunc(k.AllowOut, func(o string) bool { return o != via })
	}) {
		v.errorf(pp, "the kill switch for %s allows out by more than %s: its clients' internet could leave another way; list the LAN in allowTo instead", pool, via)
	}
	if !slices.ContainsFunc(c.Firewall.Masquerade, func(m Masquerade) bool { return holds(m.From) && m.Out == via }) {
		v.errorf(pp, "%s is not masqueraded out %s: add firewall.masquerade {from: %s, out: %s} (PIA routes only the address it gave)", pool, via, pool, via)
	}
}

func prefixList(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

// ClientKeepalive is c's client keepalive in seconds.
func (c *Clients) ClientKeepalive() int {
	if c == nil || c.PersistentKeepalive == nil {
		return DefaultClientKeepalive
	}
	return *c.PersistentKeepalive
}

// String names an egress pool for messages.
func (e ClientEgress) String() string { return fmt.Sprintf("%s via %s", e.Pool, e.Via) }
