package netcfg

// This file is the one place a config becomes desired state: every
// subsystem's typed Desired (netip values, resolved defaults, read keys and
// registers) is derived here from a validated config.Config, so the
// subsystems themselves know nothing of YAML.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/clients"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/route"
	"github.com/nodeagent/nodeagent/netcfg/sysctl"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// FromConfig derives the desired state from a validated config. Names of
// routing tables are written to tablesFile ("" leaves it alone).
func FromConfig(c *config.Config, tablesFile string) (Desired, error) {
	return FromConfigCached(c, tablesFile, nil)
}

// FromConfigCached is FromConfig reading WireGuard peer registers through
// reg (nil: no cache), as the daemon does on every reload and resync.
func FromConfigCached(c *config.Config, tablesFile string, reg *register.Cache) (Desired, error) {
	return FromConfigStaged(c, tablesFile, reg, nil)
}

// FromConfigStaged is FromConfigCached that begins, with st, a staging
// device for each kernel WireGuard device that does not exist yet, and
// writes its peers to it as the register is read (wg.Stager): the
// daemon's start-up. A desired state that is not returned (an error) has
// its stages deleted.
func FromConfigStaged(c *config.Config, tablesFile string, reg *register.Cache, st *wg.Stager) (Desired, error) {
	d, errs := fromConfigAlone(c, tablesFile)
	if errors.Join(errs...) != nil {
		st = nil // no stage for a desired state that will not be returned
	}
	d.WG = wgFromConfig(c, config.Options{}, reg, st)
	if err := errors.Join(errs...); err != nil {
		for _, dev := range d.WG.Devices {
			dev.Stage.Discard()
		}
		return d, err
	}
	return d, nil
}

// CheckOffline derives what FromConfig does from c alone (links, sysctls,
// routing, nftables) and returns what fails, reading no file: not the
// WireGuard keys or registers, which FromConfig reads. It is `nodeagent
// validate --offline`'s last step, after the config's own validation.
func CheckOffline(c *config.Config) error {
	_, errs := fromConfigAlone(c, "")
	return errors.Join(errs...)
}

// fromConfigAlone is FromConfig without the WireGuard devices, which
// read key files and registers: everything derived from c alone.
func fromConfigAlone(c *config.Config, tablesFile string) (Desired, []error) {
	var d Desired
	var errs []error
	prefixes := func(owner string, ss []string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: address %q: %w", owner, s, err))
				continue
			}
			out = append(out, p)
		}
		return out
	}
	for _, v := range c.VLANs {
		d.Link.Links = append(d.Link.Links, link.Link{
			Name: v.Name, Kind: link.VLAN, Parent: v.Parent, VLANID: v.ID, MTU: v.MTU,
			Up: v.IsUp(), Addrs: prefixes(v.Name, v.Addresses), Adopt: v.Adopt,
		})
	}
	for _, m := range c.Macvlans {
		mode := m.Mode
		if mode == "" {
			mode = "bridge"
		}
		mac, _ := config.ParseMAC(m.MAC) // validated; nil when unset
		d.Link.Links = append(d.Link.Links, link.Link{
			Name: m.Name, Kind: link.Macvlan, Parent: m.Parent, Mode: mode, MTU: m.MTU,
			Up: m.IsUp(), Addrs: prefixes(m.Name, m.Addresses), Adopt: m.Adopt, MAC: mac,
		})
	}
	if !c.DAD.Disabled {
		d.Link.DAD = &arp.Config{
			Probes: c.DAD.Probes, Interval: c.DAD.Interval, Wait: c.DAD.Wait,
			Announcements: c.DAD.Announcements,
		}
	}
	d.Sysctl = sysctl.Desired{Values: c.Sysctls}
	var err error
	d.Route, err = routeFromConfig(c.Routing, tablesFile)
	errs = append(errs, err)
	d.Nft, err = nftFromConfig(c.Firewall)
	errs = append(errs, err)
	return d, errs
}

// DefaultTablesFile is where the tables' names are written for `ip`.
const DefaultTablesFile = "/etc/iproute2/rt_tables.d/nodeagent.conf"

var (
	routeTypes  = map[string]uint8{"": unix.RTN_UNICAST, "unicast": unix.RTN_UNICAST, "unreachable": unix.RTN_UNREACHABLE, "blackhole": unix.RTN_BLACKHOLE, "prohibit": unix.RTN_PROHIBIT}
	routeScopes = map[string]uint8{"global": unix.RT_SCOPE_UNIVERSE, "link": unix.RT_SCOPE_LINK, "host": unix.RT_SCOPE_HOST}
	ruleActions = map[string]uint8{"": unix.FR_ACT_TO_TBL, "table": unix.FR_ACT_TO_TBL, "unreachable": unix.FR_ACT_UNREACHABLE, "blackhole": unix.FR_ACT_BLACKHOLE, "prohibit": unix.FR_ACT_PROHIBIT}
)

// routeFromConfig derives the routing subsystem's desired state. The config
// is validated already; what fails here is reported, not assumed away.
//
// Resolved here so that desired routes compare with what the kernel reports:
// "default" is 0.0.0.0/0 unless via or src is IPv6; a unicast route without
// a gateway has scope link (as `ip route add` gives it); an IPv6 metric of 0
// is the kernel's 1024. A rule without from/to is installed for IPv4 and
// IPv6, so a catch-all rule cannot leak the other family to the main table.
func routeFromConfig(c config.Routing, tablesFile string) (route.Desired, error) {
	d := route.Desired{TablesFile: tablesFile}
	var errs []error
	for ti, t := range c.Tables {
		d.Tables = append(d.Tables, route.Table{ID: t.ID, Name: t.Name})
		for ri, r := range t.Routes {
			rt, err := convertRoute(t.ID, r)
			if err != nil {
				errs = append(errs, fmt.Errorf("routing.tables[%d].routes[%d]: %w", ti, ri, err))
				continue
			}
			d.Routes = append(d.Routes, rt)
			if r.Adopt {
				if d.AdoptRoutes == nil {
					d.AdoptRoutes = map[route.Route]bool{}
				}
				d.AdoptRoutes[rt] = true
			}
		}
		if t.KillSwitch {
			for _, dflt := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
				d.Routes = append(d.Routes, route.Route{
					Table: t.ID, To: dflt, Type: unix.RTN_UNREACHABLE, Metric: route.KillSwitchMetric,
				})
			}
		}
	}
	for i, r := range c.Rules {
		rules, err := convertRule(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("routing.rules[%d]: %w", i, err))
			continue
		}
		d.Rules = append(d.Rules, rules...)
		if r.Adopt {
			if d.AdoptRules == nil {
				d.AdoptRules = map[route.Rule]bool{}
			}
			for _, rr := range rules {
				d.AdoptRules[rr] = true
			}
		}
	}
	return d, errors.Join(errs...)
}

func convertRoute(table int, r config.Route) (route.Route, error) {
	out := route.Route{Table: table, Dev: r.Dev, Metric: uint32(r.Metric), OnLink: r.OnLink}
	var err error
	if r.Via != "" {
		if out.Via, err = netip.ParseAddr(r.Via); err != nil {
			return out, fmt.Errorf("via: %w", err)
		}
	}
	if r.Src != "" {
		if out.Src, err = netip.ParseAddr(r.Src); err != nil {
			return out, fmt.Errorf("src: %w", err)
		}
	}
	switch r.To {
	case "default", "":
		out.To = netip.MustParsePrefix("0.0.0.0/0")
		if out.Via.Is6() || out.Src.Is6() {
			out.To = netip.MustParsePrefix("::/0")
		}
	default:
		if out.To, err = netip.ParsePrefix(r.To); err != nil {
			return out, fmt.Errorf("to: %w", err)
		}
		out.To = out.To.Masked()
	}
	var ok bool
	if out.Type, ok = routeTypes[r.Type]; !ok {
		return out, fmt.Errorf("type %q", r.Type)
	}
	switch {
	case r.Scope != "":
		out.Scope = routeScopes[r.Scope]
	case out.Type == unix.RTN_UNICAST && !out.Via.IsValid():
		out.Scope = unix.RT_SCOPE_LINK
	default:
		out.Scope = unix.RT_SCOPE_UNIVERSE
	}
	if out.To.Addr().Is6() {
		out.Scope = unix.RT_SCOPE_UNIVERSE // the kernel reports every IPv6 route as global
		if out.Metric == 0 {
			out.Metric = 1024
		}
	}
	if out.Type != unix.RTN_UNICAST {
		out.Dev, out.Via = "", netip.Addr{}
	}
	return out, nil
}

func convertRule(r config.Rule) ([]route.Rule, error) {
	base := route.Rule{Priority: r.Priority, IIF: r.IIF, OIF: r.OIF, Invert: r.Invert, Suppress: -1}
	var ok bool
	if base.Action, ok = ruleActions[r.Action]; !ok {
		return nil, fmt.Errorf("action %q", r.Action)
	}
	if base.Action == unix.FR_ACT_TO_TBL {
		base.Table = r.Table
	}
	if r.SuppressPrefixLength != nil {
		base.Suppress = *r.SuppressPrefixLength
	}
	if r.FwMark != "" {
		m, k, err := config.ParseFwMark(r.FwMark)
		if err != nil {
			return nil, fmt.Errorf("fwMark: %w", err)
		}
		base.HasMark, base.Mark, base.Mask = true, m, k
	}
	parse := func(s string) (netip.Prefix, error) {
		if s == "" || s == "all" || s == "default" {
			return netip.Prefix{}, nil
		}
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	var err error
	if base.From, err = parse(r.From); err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	if base.To, err = parse(r.To); err != nil {
		return nil, fmt.Errorf("to: %w", err)
	}
	switch {
	case base.From.IsValid():
		base.Family = familyOf(base.From)
	case base.To.IsValid():
		base.Family = familyOf(base.To)
	default:
		v6 := base
		base.Family, v6.Family = unix.AF_INET, unix.AF_INET6
		return []route.Rule{base, v6}, nil
	}
	return []route.Rule{base}, nil
}

func familyOf(p netip.Prefix) int {
	if p.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// nftFromConfig derives the nftables subsystem's desired state. The config
// is validated already; what fails here is reported, not assumed away.
// Prefixes are masked, so that a source compares as the kernel holds it.
func nftFromConfig(c config.Firewall) (nft.Desired, error) {
	var d nft.Desired
	var errs []error
	prefix := func(path, s string) (netip.Prefix, bool) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			return p, false
		}
		return p.Masked(), true
	}
	for i, m := range c.Masquerade {
		if p, ok := prefix(fmt.Sprintf("firewall.masquerade[%d].from", i), m.From); ok {
			d.Masquerade = append(d.Masquerade, nft.Masquerade{From: p, Out: m.Out})
		}
	}
	for i, s := range c.SNAT {
		p, ok := prefix(fmt.Sprintf("firewall.snat[%d].from", i), s.From)
		to, err := netip.ParseAddr(s.To)
		if err != nil {
			errs = append(errs, fmt.Errorf("firewall.snat[%d].to: %w", i, err))
			continue
		}
		if ok {
			d.SNAT = append(d.SNAT, nft.SNAT{From: p, Out: s.Out, To: to})
		}
	}
	for _, f := range c.Forward {
		d.Forward = append(d.Forward, nft.Forward{In: f.In, Out: f.Out})
	}
	for i, k := range c.KillSwitch {
		if p, ok := prefix(fmt.Sprintf("firewall.killSwitch[%d].from", i), k.From); ok {
			ks := nft.KillSwitch{From: p, AllowOut: slices.Clone(k.AllowOut)}
			for j, s := range k.AllowTo {
				if q, ok := prefix(fmt.Sprintf("firewall.killSwitch[%d].allowTo[%d]", i, j), s); ok {
					ks.AllowTo = append(ks.AllowTo, q)
				}
			}
			d.KillSwitch = append(d.KillSwitch, ks)
		}
	}
	d.MSSClamp = slices.Clone(c.MSSClamp)
	return d, errors.Join(errs...)
}

// wgFromConfig derives the WireGuard subsystem's desired state from a
// validated config, reading
// key files and every device's peer register (through reg, which may be
// nil, so an unchanged register file is not parsed again). It never fails
// as a whole:
// a device whose private key cannot be read is Broken, and a register
// entry (or static peer) that cannot be used is Skipped, each with the
// reason, so the other devices and peers are converged.
func wgFromConfig(c *config.Config, opts config.Options, reg *register.Cache, st *wg.Stager) wg.Desired {
	var d wg.Desired
	for i, w := range c.WireGuard {
		d.Devices = append(d.Devices, wgDeviceFromConfig(c.File, i, w, opts, reg, st))
	}
	return d
}

func wgDeviceFromConfig(file string, i int, w config.WireGuard, opts config.Options, cache *register.Cache, stager *wg.Stager) wg.Device {
	impl := w.Implementation
	if impl == "" {
		impl = wg.ImplAuto
	}
	dev := wg.Device{Name: w.Name, Impl: impl, ListenPort: w.ListenPort, FwMark: w.FwMark, MTU: w.MTU, Adopt: w.Adopt}
	now := time.Now()
	for _, s := range w.Addresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			dev.Addrs = append(dev.Addrs, p)
		}
	}
	if w.PrivateKeyFile != "" {
		dev.KeyFiles = append(dev.KeyFiles, w.PrivateKeyFile)
	}
	if w.PrivateKeyFile == "" && w.PIA != nil {
		// The PIA provider supplies the key it keeps, and the peer.
		dev.Broken = "no private key yet (the PIA provider keeps it under the state directory)"
	} else if w.PrivateKeyFile == "" {
		dev.Broken = "no privateKeyFile"
	} else if k, err := wg.ReadPrivateKeyFile(w.PrivateKeyFile); err != nil {
		dev.Broken = fmt.Sprintf("private key: %v", err)
	} else {
		dev.PrivateKey = k
	}
	if w.PIA == nil && w.PeersDir != "" {
		dev.Stage = stager.Begin(dev)
	}
	// The static peers first, then the register's as they are read and
	// claimed (register.Merge, a batch at a time), each converted as it
	// comes and handed to the stage.
	m, static := register.NewMerger(w.Peers, func(j int) string {
		return fmt.Sprintf("%s: wireguard[%d].peers[%d]", file, i, j)
	})
	var mergeErrs, convErrs []error
	nStatic := 0
	convert := func(peers []register.Peer) {
		for _, rp := range peers {
			static := -1
			if rp.File == "" {
				static = nStatic
				nStatic++
			}
			if rp.Peer.PresharedKeyFile != "" {
				dev.KeyFiles = append(dev.KeyFiles, rp.Peer.PresharedKeyFile)
			}
			p, err := wgPeerFromConfig(rp)
			if err != nil {
				where := fmt.Sprintf("%s:%d", rp.File, rp.Line)
				if static >= 0 {
					where = fmt.Sprintf("%s: wireguard[%d].peers[%d]", file, i, static)
				}
				convErrs = append(convErrs, fmt.Errorf("%s: %v", where, err))
				continue
			}
			p.Source = rp.File
			if life := clients.LifeOf(rp.Peer, now); life.Held() {
				dev.Held = append(dev.Held, heldPeer(p, life))
				continue
			} else {
				p.Expires = life.Expires
			}
			dev.Peers = append(dev.Peers, p)
			dev.Stage.Add(p)
		}
	}
	convert(static)
	take := func(peers []register.Peer) {
		keep, errs := m.AddLoaded(peers)
		mergeErrs = append(mergeErrs, errs...)
		convert(keep)
	}
	var reg register.Contents
	switch {
	case w.PeersDir != "" && dev.Stage != nil:
		reg = cache.LoadStream(w.PeersDir, opts, take)
	case w.PeersDir != "":
		// Without a stage nothing waits for the peers: all workers read.
		reg = cache.Load(w.PeersDir, opts)
		take(reg.Peers)
	}
	dev.Stage.Seal()
	dev.KeepPeers = reg.Unreadable
	for _, err := range slices.Concat(reg.Errors, mergeErrs, convErrs) {
		dev.Skipped = append(dev.Skipped, err.Error())
	}
	return dev
}

func wgPeerFromConfig(rp register.Peer) (wg.Peer, error) {
	c := rp.Peer
	k, err := wgtypes.ParseKey(c.PublicKey)
	if err != nil {
		return wg.Peer{}, fmt.Errorf("publicKey: not a WireGuard key")
	}
	name := c.Name
	p := wg.Peer{PublicKey: k, Name: name, Endpoint: c.Endpoint,
		Keepalive: time.Duration(c.PersistentKeepalive) * time.Second}
	switch {
	case c.PresharedKeyFile != "":
		if p.PresharedKey, err = wg.ReadKeyFile(c.PresharedKeyFile); err != nil {
			return wg.Peer{}, fmt.Errorf("presharedKeyFile: %w", err)
		}
	case rp.PresharedKey != "":
		if p.PresharedKey, err = wg.ParseKey(rp.PresharedKey.Value()); err != nil {
			return wg.Peer{}, fmt.Errorf("PresharedKey: %w", err)
		}
	}
	for _, s := range c.AllowedIPs {
		a, err := netip.ParsePrefix(s)
		if err != nil {
			return wg.Peer{}, fmt.Errorf("allowedIPs: %q: %w", s, err)
		}
		p.AllowedIPs = append(p.AllowedIPs, a.Masked())
	}
	slices.SortFunc(p.AllowedIPs, comparePrefixes)
	return p, nil
}

// comparePrefixes orders prefixes by address, then length, as the
// WireGuard subsystem sorts allowed IPs.
func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
