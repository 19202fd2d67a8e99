package config

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"golang.org/x/sys/unix"
)

// Validate checks c and returns an ErrorList of every problem, or nil.
// Parse calls it; call it again after changing a Config in code. Errors
// carry c.File but no lines, since those are known only while parsing.
func (c *Config) Validate(opts Options) error {
	v := &validator{file: c.File, opts: opts, maxErrs: MaxConfigErrors}
	v.validate(c)
	return v.result()
}

// validator collects problems. pos (field path -> line) and bad (paths that
// failed to decode) come from the decoder; both are nil for a Config built
// in code.
type validator struct {
	file string
	pos  positions
	bad  map[string]bool
	opts Options
	errs ErrorList
	// maxErrs is how many errors are kept (0: all); dropped counts the
	// rest, which result reports as one line.
	maxErrs, dropped int
	// rename, when set, turns a field path into the name errors print: a
	// wg-quick register file names its fields as wg(8) does (PublicKey).
	rename func(path string) string
}

// fieldName is path as errors print it.
func (v *validator) fieldName(path string) string {
	if v.rename == nil {
		return path
	}
	return v.rename(path)
}

// line returns the line of path, or of its nearest ancestor that was
// written in the file: a missing required field is reported at the
// list item or section that lacks it.
func (v *validator) line(path string) int {
	for p := path; ; p = parentPath(p) {
		if l, ok := v.pos[p]; ok {
			return l
		}
		if p == "" {
			return 0
		}
	}
}

// written reports whether path was present in the file.
func (v *validator) written(path string) bool {
	_, ok := v.pos[path]
	return ok
}

// where names path for "first declared at" messages, with its line if known.
func (v *validator) where(path string) string {
	if l := v.line(path); l > 0 {
		return fmt.Sprintf("%s (line %d)", v.fieldName(path), l)
	}
	return v.fieldName(path)
}

func (v *validator) errorf(path, format string, args ...any) {
	// Stay quiet about a value the decoder already rejected.
	for p := path; p != ""; p = parentPath(p) {
		if v.bad[p] {
			return
		}
	}
	if v.maxErrs > 0 && len(v.errs) >= v.maxErrs {
		v.dropped++
		return
	}
	v.errs = append(v.errs, &FieldError{File: v.file, Line: v.line(path), Field: v.fieldName(path), Msg: fmt.Sprintf(format, args...)})
}

// result is the errors found, with a last line counting those not kept,
// or nil.
func (v *validator) result() error {
	return v.list().err()
}

// list is result as a sorted ErrorList (nil for none).
func (v *validator) list() ErrorList {
	if v.dropped > 0 {
		return append(v.errs, moreErrors(v.file, v.dropped, "in this file")).sorted()
	}
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs.sorted()
}

// check records msg at path unless it is empty; it pairs with the check*
// and parse* helpers, which return "" for a good value.
func (v *validator) check(path, msg string) bool {
	if msg != "" {
		v.errorf(path, "%s", msg)
		return false
	}
	return true
}

// intRange reports n at path unless lo <= n <= hi.
func (v *validator) intRange(path string, n int, lo, hi int64) bool {
	if int64(n) < lo || int64(n) > hi {
		v.errorf(path, "%d is outside %d-%d", n, lo, hi)
		return false
	}
	return true
}

// ifName checks an optional interface name.
func (v *validator) ifName(path, name string) {
	if name != "" {
		v.check(path, checkIfName(name))
	}
}

// absPath checks an optional absolute path.
func (v *validator) absPath(path, file string) {
	if file != "" {
		v.check(path, checkAbsPath(file))
	}
}

// secretFile checks a file holding a key or credentials: absolute, and if
// it exists, readable by its owner only. A missing file is fine here; the
// subsystem that reads it reports that, and nodeagent may create it.
func (v *validator) secretFile(path, file string) {
	if file == "" {
		return
	}
	if checkWGKey(file) == "" {
		// The key itself pasted where its file belongs (base64 may even
		// start with '/'): say so without printing it, as checkAbsPath's
		// message would.
		v.errorf(path, "this is a key itself, not the path of a file holding one; put the key in a file readable by root only and name that file here")
		return
	}
	if !v.check(path, checkAbsPath(file)) || v.opts.SkipFileChecks {
		return
	}
	var st unix.Stat_t
	if err := unix.Lstat(file, &st); err != nil {
		// Missing, or not ours to look at (validate runs without root):
		// the daemon, which runs as root, checks again when it reads it.
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EACCES) {
			v.errorf(path, "%s: %v", file, err)
		}
		return
	}
	// The rules the daemon reads the file by (wg.KeyFileRules), so that
	// validate refuses what the daemon would.
	if err := fsafe.Check(file, &st, fsafe.Rules{Private: true, RootOwned: true}); err != nil {
		v.errorf(path, "%s", err)
	}
}

// addrSeen remembers where each interface address was first declared.
type addrSeen map[netip.Addr]string

func (v *validator) addresses(path string, addrs []string, seen addrSeen) {
	for i, s := range addrs {
		p := indexPath(path, i)
		pfx, msg := parseHostPrefix(s)
		if !v.check(p, msg) {
			continue
		}
		if first, dup := seen[pfx.Addr()]; dup {
			v.errorf(p, "%s is already assigned at %s", pfx.Addr(), v.where(first))
			continue
		}
		seen[pfx.Addr()] = p
	}
}

// link is what validation needs to know about a declared link.
type link struct {
	kind   string // vlan, macvlan, wireguard
	path   string // vlans[0]
	parent string
	mtu    int
}

func (v *validator) validate(c *Config) {
	links := v.links(c)
	v.node(c.Node)
	v.dad(c.DAD)
	v.sysctls(c.Sysctls)
	seenAddrs := addrSeen{}
	v.vlans(c.VLANs, links, seenAddrs)
	v.macvlans(c.Macvlans, links, seenAddrs)
	v.macs(c.Macvlans)
	v.parentChains(links)
	v.wireguard(c.WireGuard, seenAddrs)
	v.peersDirs(c.WireGuard)
	v.routing(c.Routing)
	v.piaRouting(c)
	v.firewall(c.Firewall)
	v.killSwitchTo(c.Firewall)
	v.clients(c)
	v.kubernetes(c)
	v.adoptLabels(c.Kubernetes)
	v.checks(c.Checks)
	v.gateway(c, links, seenAddrs)
}

// links indexes the declared links by name and reports duplicate names.
func (v *validator) links(c *Config) map[string]link {
	m := map[string]link{}
	add := func(name string, l link) {
		if name == "" {
			return
		}
		if first, dup := m[name]; dup {
			v.errorf(fieldPath(l.path, "name"), "duplicate link name %q; first declared at %s", name, v.where(fieldPath(first.path, "name")))
			return
		}
		m[name] = l
	}
	for i, x := range c.VLANs {
		add(x.Name, link{kind: "vlan", path: indexPath("vlans", i), parent: x.Parent, mtu: x.MTU})
	}
	for i, x := range c.Macvlans {
		add(x.Name, link{kind: "macvlan", path: indexPath("macvlans", i), parent: x.Parent, mtu: x.MTU})
	}
	for i, x := range c.WireGuard {
		add(x.Name, link{kind: "wireguard", path: indexPath("wireguard", i), mtu: x.MTU})
	}
	return m
}

func (v *validator) node(n Node) {
	if n.Name != "" && (len(n.Name) > maxSubdomainLen || !dns1123RE.MatchString(n.Name)) {
		v.errorf("node.name", "%q is not a valid node name (a lowercase DNS subdomain)", n.Name)
	}
}

func (v *validator) dad(d DAD) {
	// Zero means "default" for a Config that has not been through Parse.
	if d.Probes != 0 {
		v.intRange("dad.probes", d.Probes, 1, 10)
	}
	v.duration("dad.interval", d.Interval)
	v.duration("dad.wait", d.Wait)
	v.intRange("dad.announcements", d.Announcements, 0, 10)
}

func (v *validator) duration(path string, d time.Duration) {
	if d != 0 && (d < time.Millisecond || d > 10*time.Second) {
		v.errorf(path, "%s is outside 1ms-10s", d)
	}
}

func (v *validator) sysctls(m map[string]string) {
	for _, k := range sortedKeys(m) {
		p := mapKeyPath("sysctls", k)
		if !v.check(p, checkSysctlKey(k)) {
			continue
		}
		switch val := m[k]; {
		case strings.TrimSpace(val) == "":
			v.errorf(p, "value is empty")
		case strings.ContainsAny(val, "\n\r\x00"):
			v.errorf(p, "value %q contains a line break or NUL", val)
		}
	}
}

func (v *validator) vlans(vlans []VLAN, links map[string]link, seenAddrs addrSeen) {
	type key struct {
		parent string
		id     int
	}
	seen := map[key]string{}
	for i, x := range vlans {
		p := indexPath("vlans", i)
		v.check(fieldPath(p, "name"), checkIfName(x.Name))
		v.check(fieldPath(p, "parent"), checkIfName(x.Parent))
		v.linkParent(p, x.Name, x.Parent, x.MTU, links)
		switch idp := fieldPath(p, "id"); {
		case x.ID == 0 && !v.written(idp):
			v.errorf(idp, "required (1-4094)")
		case v.intRange(idp, x.ID, 1, 4094) && x.Parent != "":
			k := key{x.Parent, x.ID}
			if first, dup := seen[k]; dup {
				v.errorf(idp, "VLAN %d on %s is already declared at %s", x.ID, x.Parent, v.where(first))
			} else {
				seen[k] = idp
			}
		}
		v.mtu(fieldPath(p, "mtu"), x.MTU)
		v.addresses(fieldPath(p, "addresses"), x.Addresses, seenAddrs)
	}
}

var macvlanModes = []string{"bridge", "private", "vepa", "passthru"}

func (v *validator) macvlans(macvlans []Macvlan, links map[string]link, seenAddrs addrSeen) {
	passthru := map[string]string{} // parent -> path of its passthru macvlan
	count := map[string]int{}
	for _, x := range macvlans {
		count[x.Parent]++
	}
	for i, x := range macvlans {
		p := indexPath("macvlans", i)
		v.check(fieldPath(p, "name"), checkIfName(x.Name))
		v.check(fieldPath(p, "parent"), checkIfName(x.Parent))
		v.linkParent(p, x.Name, x.Parent, x.MTU, links)
		if x.Mode != "" && !slices.Contains(macvlanModes, x.Mode) {
			v.errorf(fieldPath(p, "mode"), "%q is not one of %s", x.Mode, strings.Join(macvlanModes, ", "))
		}
		if x.Mode == "passthru" && x.Parent != "" && count[x.Parent] > 1 {
			if _, done := passthru[x.Parent]; !done {
				v.errorf(fieldPath(p, "mode"), "a passthru macvlan must be the only macvlan on %s, but %d are declared", x.Parent, count[x.Parent])
			}
			passthru[x.Parent] = p
		}
		v.mtu(fieldPath(p, "mtu"), x.MTU)
		v.addresses(fieldPath(p, "addresses"), x.Addresses, seenAddrs)
	}
}

// linkParent checks a VLAN's or macvlan's parent against the links declared
// here. A physical parent is checked at plan time, against the kernel.
func (v *validator) linkParent(p, name, parent string, mtu int, links map[string]link) {
	if parent == "" {
		return
	}
	pp := fieldPath(p, "parent")
	if parent == name {
		v.errorf(pp, "a link cannot be its own parent")
		return
	}
	pl, ok := links[parent]
	if !ok {
		return
	}
	if pl.kind == "wireguard" {
		v.errorf(pp, "%s is a WireGuard interface, which carries no Ethernet frames; use an Ethernet link or VLAN", parent)
		return
	}
	if mtu != 0 && pl.mtu != 0 && mtu > pl.mtu {
		v.errorf(fieldPath(p, "mtu"), "mtu %d is above parent %s's mtu %d", mtu, parent, pl.mtu)
	}
}

// parentChains reports declared links whose parents lead back to
// themselves, which no order of creation can satisfy.
func (v *validator) parentChains(links map[string]link) {
	reported := map[string]bool{}
	for _, name := range sortedKeys(links) {
		if reported[name] || links[name].parent == name { // self-parent is reported by linkParent
			continue
		}
		chain := []string{name}
		inChain := map[string]bool{name: true}
		for cur := links[name].parent; ; cur = links[cur].parent {
			l, declared := links[cur]
			if !declared || reported[cur] || l.parent == cur {
				break
			}
			if inChain[cur] {
				if cur == name { // the loop runs through name; a link leading into a loop is not itself in one
					v.errorf(fieldPath(links[name].path, "parent"), "parents form a loop: %s", strings.Join(append(chain, cur), " -> "))
					for _, n := range chain {
						reported[n] = true
					}
				}
				break
			}
			chain = append(chain, cur)
			inChain[cur] = true
		}
	}
}

// mtu checks an MTU; 0 means the kernel default.
func (v *validator) mtu(path string, mtu int) {
	if mtu != 0 {
		v.intRange(path, mtu, 68, 65535)
	}
}

var wgImplementations = []string{"auto", "kernel", "userspace"}

func (v *validator) wireguard(wgs []WireGuard, seenAddrs addrSeen) {
	for i, w := range wgs {
		p := indexPath("wireguard", i)
		v.check(fieldPath(p, "name"), checkIfName(w.Name))
		if w.PrivateKeyFile == "" && w.Name != "" && w.PIA == nil {
			v.errorf(fieldPath(p, "privateKeyFile"), "required (a file holding the interface's private key, as wg genkey writes it, chmod 600)")
		}
		v.secretFile(fieldPath(p, "privateKeyFile"), w.PrivateKeyFile)
		v.intRange(fieldPath(p, "listenPort"), w.ListenPort, 0, 65535)
		v.intRange(fieldPath(p, "fwMark"), w.FwMark, 0, math.MaxUint32)
		v.mtu(fieldPath(p, "mtu"), w.MTU)
		v.addresses(fieldPath(p, "addresses"), w.Addresses, seenAddrs)
		if w.Implementation != "" && !slices.Contains(wgImplementations, w.Implementation) {
			v.errorf(fieldPath(p, "implementation"), "%q is not one of %s", w.Implementation, strings.Join(wgImplementations, ", "))
		}
		v.absPath(fieldPath(p, "peersDir"), w.PeersDir)
		v.peers(p, w.Peers)
		if w.PIA != nil {
			v.pia(p, w)
		}
	}
}

// pia checks a PIA device: its pia section, and that nothing the
// registration gives is configured beside it.
func (v *validator) pia(p string, w WireGuard) {
	pp := fieldPath(p, "pia")
	rp := fieldPath(pp, "region")
	switch {
	case w.PIA.Region == "":
		v.errorf(rp, "required (a PIA region id, like nl_amsterdam, or auto)")
	case w.PIA.Region == "auto":
	case !validRegionID(w.PIA.Region):
		v.errorf(rp, "%q is not a PIA region id (lower-case letters, digits and _, like nl_amsterdam), nor auto", clipValue(w.PIA.Region))
	case v.opts.PIARegion != nil:
		if msg := v.opts.PIARegion(*w.PIA); msg != "" {
			v.errorf(rp, "%s", msg)
		}
	}
	if w.PIA.CredentialsFile == "" {
		v.errorf(fieldPath(pp, "credentialsFile"), "required (a file, chmod 600, holding the PIA username and password on two lines)")
	}
	v.secretFile(fieldPath(pp, "credentialsFile"), w.PIA.CredentialsFile)
	for _, f := range []struct{ name, url string }{{"serverList", w.PIA.ServerList}, {"tokenURL", w.PIA.TokenURL}} {
		if f.url != "" {
			v.check(fieldPath(pp, f.name), checkHTTPSURL(f.url))
		}
	}
	v.absPath(fieldPath(pp, "caFile"), w.PIA.CAFile)
	v.absPath(fieldPath(pp, "serverListKeyFile"), w.PIA.ServerListKeyFile)
	v.absPath(fieldPath(pp, "webCAFile"), w.PIA.WebCAFile)
	v.portForward(fieldPath(pp, "portForward"), w.PIA.PortForward)
	dp := fieldPath(fieldPath(pp, "dns"), "for")
	for i, s := range w.PIA.DNS.For {
		ip := indexPath(dp, i)
		if pfx, msg := parseNetPrefix(s); msg != "" {
			v.errorf(ip, "%s", msg)
		} else if !pfx.Addr().Is4() {
			v.errorf(ip, "%s: PIA's resolvers are IPv4 only; IPv6 DNS from the VLAN is dropped by the kill switch anyway", s)
		}
	}
	from := "a PIA tunnel gets its %s from PIA's addKey; remove %s or pia"
	if len(w.Peers) > 0 {
		v.errorf(fieldPath(p, "peers"), from, "peer", "peers")
	}
	if w.PeersDir != "" {
		v.errorf(fieldPath(p, "peersDir"), from, "peer", "peersDir")
	}
	if len(w.Addresses) > 0 {
		v.errorf(fieldPath(p, "addresses"), from, "address", "addresses")
	}
	if w.ListenPort != 0 {
		v.errorf(fieldPath(p, "listenPort"), "a PIA tunnel only connects out (its port is the kernel's choice); remove listenPort or pia")
	}
}

// portForward checks a PIA device's portForward section (where To sits is
// checked against the routing by piaRouting, once the whole config is
// known).
func (v *validator) portForward(p string, pf PortForward) {
	if pf.To != "" {
		if a, msg := parseAddr(pf.To); msg != "" {
			v.errorf(fieldPath(p, "to"), "%s", msg)
		} else if !a.Is4() {
			v.errorf(fieldPath(p, "to"), "%s: PIA forwards IPv4 only", pf.To)
		}
		if !pf.Enabled {
			v.errorf(fieldPath(p, "to"), "set, but enabled is false")
		}
	}
	v.intRange(fieldPath(p, "toPort"), pf.ToPort, 0, 65535)
	if pf.ToPort != 0 && pf.To == "" {
		v.errorf(fieldPath(p, "toPort"), "needs to (the address the port is forwarded to)")
	}
	if len(pf.OnChange) > 0 {
		v.check(indexPath(fieldPath(p, "onChange"), 0), checkAbsPath(pf.OnChange[0]))
	}
	v.portHook(p, pf)
}

// validRegionID reports whether s looks like a PIA region id.
func validRegionID(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// checkHTTPSURL reports whether s is an https URL with a host.
func checkHTTPSURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return fmt.Sprintf("%q is not an https URL (https://host/path)", clipValue(s))
	}
	return ""
}

func (v *validator) peers(wgPath string, peers []WGPeer) {
	seen := newPeerSeen()
	for i, peer := range peers {
		v.peer(indexPath(fieldPath(wgPath, "peers"), i), peer, seen)
	}
}

// peerSeen remembers where each public key and allowed prefix was first
// declared among peers checked together: the static peers of one
// interface, or the one peer of a register file.
type peerSeen struct {
	keys    map[string]string
	allowed map[netip.Prefix]string
}

func newPeerSeen() peerSeen {
	return peerSeen{keys: map[string]string{}, allowed: map[netip.Prefix]string{}}
}

// peer checks one peer whose fields are under path p: wireguard[0].peers[1]
// in the config, "" in a register file (whose top level is the peer). The
// config and the register share it so a peer is held to the same rules
// wherever it is written.
func (v *validator) peer(p string, peer WGPeer, seen peerSeen) {
	kp := fieldPath(p, "publicKey")
	if v.check(kp, checkWGKey(peer.PublicKey)) {
		if first, dup := seen.keys[peer.PublicKey]; dup {
			v.errorf(kp, "duplicate peer public key; first at %s", v.where(first))
		} else {
			seen.keys[peer.PublicKey] = kp
		}
	}
	v.secretFile(fieldPath(p, "presharedKeyFile"), peer.PresharedKeyFile)
	if peer.Endpoint != "" {
		v.check(fieldPath(p, "endpoint"), checkEndpoint(peer.Endpoint))
	}
	aps := fieldPath(p, "allowedIPs")
	for j, s := range peer.AllowedIPs {
		ap := indexPath(aps, j)
		pfx, msg := parseNetPrefix(s)
		if !v.check(ap, msg) {
			continue
		}
		first, dup := seen.allowed[pfx]
		switch {
		case !dup:
			seen.allowed[pfx] = ap
		case parentPath(first) == aps:
			v.errorf(ap, "duplicate allowed IP %s; first at %s", pfx, v.where(first))
		default:
			// WireGuard routes each allowed IP to one peer; a second peer
			// claiming it silently takes it from the first.
			v.errorf(ap, "%s is already allowed for the peer at %s; WireGuard routes a prefix to one peer only", pfx, v.where(first))
		}
	}
	v.intRange(fieldPath(p, "persistentKeepalive"), peer.PersistentKeepalive, 0, 65535)
	v.peerLife(p, peer)
}

// Reserved routing tables (rt_tables): they exist in every kernel, so rules
// may name them without declaring them, and they may not be declared.
var reservedTables = map[int]string{0: "unspec", 253: "default", 254: "main", 255: "local"}

var (
	routeTypes  = []string{"unicast", "unreachable", "blackhole", "prohibit"}
	routeScopes = []string{"global", "link", "host"}
	ruleActions = []string{"table", "unreachable", "blackhole", "prohibit"}
)

func (v *validator) routing(r Routing) {
	ids := map[int]string{}
	names := map[string]string{}
	for i, t := range r.Tables {
		p := indexPath("routing.tables", i)
		idp := fieldPath(p, "id")
		switch name, reserved := reservedTables[t.ID]; {
		case t.ID == 0 && !v.written(idp):
			v.errorf(idp, "required")
		case reserved:
			v.errorf(idp, "table %d (%s) is reserved; rules may use it by number without declaring it", t.ID, name)
		case v.intRange(idp, t.ID, 1, math.MaxUint32):
			if first, dup := ids[t.ID]; dup {
				v.errorf(idp, "duplicate table id %d; first declared at %s", t.ID, v.where(first))
			} else {
				ids[t.ID] = idp
			}
		}
		if t.Name != "" {
			np := fieldPath(p, "name")
			switch {
			case !tableNameRE.MatchString(t.Name) || isDigits(t.Name):
				v.errorf(np, "%q is not a table name (letters, digits, '-' and '_', not all digits)", t.Name)
			case slices.Contains([]string{"unspec", "default", "main", "local"}, t.Name):
				v.errorf(np, "%q is the name of a reserved table", t.Name)
			default:
				if first, dup := names[t.Name]; dup {
					v.errorf(np, "duplicate table name %q; first declared at %s", t.Name, v.where(first))
				} else {
					names[t.Name] = np
				}
			}
		}
		v.routes(p, t.Routes)
	}

	prios := map[int]string{}
	for i, rule := range r.Rules {
		v.rule(indexPath("routing.rules", i), rule, ids, prios)
	}
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

func (v *validator) routes(tablePath string, routes []Route) {
	type key struct {
		to     string
		metric int
	}
	seen := map[key]string{}
	for i, r := range routes {
		p := indexPath(fieldPath(tablePath, "routes"), i)
		tp := fieldPath(p, "to")
		var to netip.Prefix
		toOK := false
		switch r.To {
		case "":
			v.errorf(tp, "required (a CIDR prefix or default)")
		case "default":
			toOK = true
		default:
			var msg string
			to, msg = parseNetPrefix(r.To)
			toOK = v.check(tp, msg)
		}
		if toOK {
			k := key{r.To, r.Metric}
			if first, dup := seen[k]; dup {
				v.errorf(tp, "duplicate route to %s with metric %d; first at %s", r.To, r.Metric, v.where(first))
			} else {
				seen[k] = tp
			}
		}
		if r.Via != "" {
			via, msg := parseAddr(r.Via)
			if v.check(fieldPath(p, "via"), msg) && to.IsValid() && via.Is4() != to.Addr().Is4() {
				v.errorf(fieldPath(p, "via"), "%s and %s are different address families", r.Via, r.To)
			}
		}
		if r.Src != "" {
			src, msg := parseAddr(r.Src)
			if v.check(fieldPath(p, "src"), msg) && to.IsValid() && src.Is4() != to.Addr().Is4() {
				v.errorf(fieldPath(p, "src"), "%s and %s are different address families", r.Src, r.To)
			}
		}
		v.ifName(fieldPath(p, "dev"), r.Dev)
		v.intRange(fieldPath(p, "metric"), r.Metric, 0, math.MaxUint32)
		if r.Scope != "" && !slices.Contains(routeScopes, r.Scope) {
			v.errorf(fieldPath(p, "scope"), "%q is not one of %s", r.Scope, strings.Join(routeScopes, ", "))
		}
		switch {
		case r.Type != "" && !slices.Contains(routeTypes, r.Type):
			v.errorf(fieldPath(p, "type"), "%q is not one of %s", r.Type, strings.Join(routeTypes, ", "))
		case r.Type == "" || r.Type == "unicast":
			if r.Via == "" && r.Dev == "" {
				v.errorf(p, "a unicast route needs via, dev or both")
			}
		default:
			if r.Via != "" || r.Dev != "" {
				v.errorf(p, "a %s route takes no via or dev", r.Type)
			}
		}
	}
}

func (v *validator) rule(p string, r Rule, tables map[int]string, prios map[int]string) {
	pp := fieldPath(p, "priority")
	switch {
	case r.Priority == 0 && !v.written(pp):
		v.errorf(pp, "required, so the rule's place is fixed (1-4294967295)")
	case r.Priority == 0:
		v.errorf(pp, "0 is the kernel's rule for the local table; use 1-4294967295")
	case v.intRange(pp, r.Priority, 1, math.MaxUint32):
		if first, dup := prios[r.Priority]; dup {
			v.errorf(pp, "duplicate priority %d; first used at %s", r.Priority, v.where(first))
		} else {
			prios[r.Priority] = pp
		}
	}
	from := v.rulePrefix(fieldPath(p, "from"), r.From)
	to := v.rulePrefix(fieldPath(p, "to"), r.To)
	if from.IsValid() && to.IsValid() && from.Addr().Is4() != to.Addr().Is4() {
		v.errorf(fieldPath(p, "to"), "from %s and to %s are different address families", r.From, r.To)
	}
	v.ifName(fieldPath(p, "iif"), r.IIF)
	v.ifName(fieldPath(p, "oif"), r.OIF)
	if r.FwMark != "" {
		if _, _, err := ParseFwMark(r.FwMark); err != nil {
			v.errorf(fieldPath(p, "fwMark"), "%v", err)
		}
	}
	if r.SuppressPrefixLength != nil {
		v.intRange(fieldPath(p, "suppressPrefixLength"), *r.SuppressPrefixLength, 0, 128)
	}
	tp := fieldPath(p, "table")
	switch {
	case r.Action != "" && !slices.Contains(ruleActions, r.Action):
		v.errorf(fieldPath(p, "action"), "%q is not one of %s", r.Action, strings.Join(ruleActions, ", "))
	case r.Action == "" || r.Action == "table":
		_, reserved := reservedTables[r.Table]
		switch {
		case r.Table == 0:
			v.errorf(tp, "required (a table declared in routing.tables, or main 254, default 253, local 255)")
		case reserved:
		case tables[r.Table] == "":
			v.errorf(tp, "table %d is not declared in routing.tables (declare it, or use main 254, default 253 or local 255)", r.Table)
		}
	default:
		if r.Table != 0 {
			v.errorf(tp, "a %s rule takes no table", r.Action)
		}
	}
}

// rulePrefix checks a rule selector: empty, "all"/"default" (everything),
// or a network prefix. It returns the prefix when one was given.
func (v *validator) rulePrefix(path, s string) netip.Prefix {
	if s == "" || s == "all" || s == "default" {
		return netip.Prefix{}
	}
	p, msg := parseNetPrefix(s)
	v.check(path, msg)
	return p
}

func (v *validator) firewall(f Firewall) {
	type mkey struct{ from, out string }
	masq := map[mkey]string{}
	for i, m := range f.Masquerade {
		p := indexPath("firewall.masquerade", i)
		_, msg := parseNetPrefix(m.From)
		okFrom := v.check(fieldPath(p, "from"), msg)
		okOut := v.check(fieldPath(p, "out"), checkIfName(m.Out))
		if okFrom && okOut {
			k := mkey{m.From, m.Out}
			if first, dup := masq[k]; dup {
				v.errorf(p, "duplicate masquerade from %s out %s; first at %s", m.From, m.Out, v.where(first))
			} else {
				masq[k] = p
			}
		}
	}
	snat := map[mkey]string{}
	for i, x := range f.SNAT {
		p := indexPath("firewall.snat", i)
		from, msg := parseNetPrefix(x.From)
		okFrom := v.check(fieldPath(p, "from"), msg)
		okOut := v.check(fieldPath(p, "out"), checkIfName(x.Out))
		to, msg := parseAddr(x.To)
		if v.check(fieldPath(p, "to"), msg) && okFrom && to.Is4() != from.Addr().Is4() {
			v.errorf(fieldPath(p, "to"), "%s and %s are different address families", x.To, x.From)
		}
		if okFrom && okOut {
			k := mkey{x.From, x.Out}
			if first, dup := snat[k]; dup {
				v.errorf(p, "duplicate snat from %s out %s; first at %s", x.From, x.Out, v.where(first))
			} else if first, dup := masq[k]; dup {
				v.errorf(p, "traffic from %s out %s is already masqueraded at %s", x.From, x.Out, v.where(first))
			} else {
				snat[k] = p
			}
		}
	}
	type fkey struct{ in, out string }
	fwd := map[fkey]string{}
	for i, x := range f.Forward {
		p := indexPath("firewall.forward", i)
		okIn := v.check(fieldPath(p, "in"), checkIfName(x.In))
		okOut := v.check(fieldPath(p, "out"), checkIfName(x.Out))
		if okIn && okOut {
			k := fkey{x.In, x.Out}
			if first, dup := fwd[k]; dup {
				v.errorf(p, "duplicate forward in %s out %s; first at %s", x.In, x.Out, v.where(first))
			} else {
				fwd[k] = p
			}
		}
	}
	ks := map[string]string{}
	for i, k := range f.KillSwitch {
		p := indexPath("firewall.killSwitch", i)
		fp := fieldPath(p, "from")
		_, msg := parseNetPrefix(k.From)
		if v.check(fp, msg) {
			if first, dup := ks[k.From]; dup {
				v.errorf(fp, "a kill switch for %s is already declared at %s; list every allowed interface in one entry", k.From, v.where(first))
			} else {
				ks[k.From] = fp
			}
		}
		ap := fieldPath(p, "allowOut")
		if len(k.AllowOut) == 0 {
			v.errorf(ap, "required: the interfaces traffic from %s may leave by", k.From)
		}
		for j, name := range k.AllowOut {
			v.check(indexPath(ap, j), checkIfName(name))
		}
	}
	clamp := map[string]string{}
	for i, name := range f.MSSClamp {
		p := indexPath("firewall.mssClamp", i)
		if !v.check(p, checkIfName(name)) {
			continue
		}
		if first, dup := clamp[name]; dup {
			v.errorf(p, "duplicate interface %q; first at %s", name, v.where(first))
		} else {
			clamp[name] = p
		}
	}
}

func (v *validator) kubernetes(c *Config) {
	k := c.Kubernetes
	v.absPath("kubernetes.kubeconfig", k.Kubeconfig)
	if k.Hold < 0 || k.Hold > time.Hour {
		v.errorf("kubernetes.hold", "%s is outside 0s-1h", k.Hold)
	}
	for _, key := range sortedKeys(k.Labels) {
		p := mapKeyPath("kubernetes.labels", key)
		if v.check(p, checkLabelKey(key)) {
			v.check(p, checkLabelValue(k.Labels[key]))
		}
	}
	conds := map[string]string{}
	for i, cl := range k.ConditionalLabels {
		p := indexPath("kubernetes.conditionalLabels", i)
		kp := fieldPath(p, "key")
		switch {
		case cl.Key == "":
			v.errorf(kp, "required")
		case !v.check(kp, checkLabelKey(cl.Key)):
		case hasKey(k.Labels, cl.Key):
			v.errorf(kp, "%q is also a static label in kubernetes.labels; a label is either static or conditional", cl.Key)
		default:
			if first, dup := conds[cl.Key]; dup {
				v.errorf(kp, "duplicate conditional label %q; first at %s", cl.Key, v.where(first))
			} else {
				conds[cl.Key] = kp
			}
		}
		if cl.Value == "" {
			v.errorf(fieldPath(p, "value"), "required")
		} else {
			v.check(fieldPath(p, "value"), checkLabelValue(cl.Value))
		}
		wp := fieldPath(p, "when")
		if cl.When == "" {
			v.errorf(wp, "required (%s)", whenForms)
			continue
		}
		w, err := ParseWhen(cl.When)
		if err != nil {
			v.errorf(wp, "%v", err)
			continue
		}
		switch {
		case w.Subsystem == "wireguard" && !slices.ContainsFunc(c.WireGuard, func(x WireGuard) bool { return x.Name == w.Name }):
			v.errorf(wp, "no WireGuard interface %q is declared", w.Name)
		case w.Subsystem == "vlan" && !slices.ContainsFunc(c.VLANs, func(x VLAN) bool { return x.Name == w.Name }):
			v.errorf(wp, "no VLAN %q is declared", w.Name)
		case w.Subsystem == "checks" && len(c.Checks.ARPReachable) == 0:
			// With nothing to probe the condition would hold vacuously,
			// which is surely not what the label means.
			v.errorf(wp, "checks.arpReachable lists no addresses")
		}
	}
}

func hasKey[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}

func (v *validator) checks(c Checks) {
	if c.APIServer != "" {
		v.check("checks.apiServer", checkEndpoint(c.APIServer))
	}
	if c.ProbeDeadline != 0 && (c.ProbeDeadline < 100*time.Millisecond || c.ProbeDeadline > 5*time.Minute) {
		v.errorf("checks.probeDeadline", "%s is outside 100ms-5m", c.ProbeDeadline)
	}
	seen := map[netip.Addr]string{}
	for i, s := range c.ARPReachable {
		p := indexPath("checks.arpReachable", i)
		a, msg := parseAddr(s)
		if !v.check(p, msg) {
			continue
		}
		if !a.Is4() {
			v.errorf(p, "%s is not an IPv4 address; ARP is IPv4 only", s)
			continue
		}
		if first, dup := seen[a]; dup {
			v.errorf(p, "duplicate address %s; first at %s", a, v.where(first))
		} else {
			seen[a] = p
		}
	}
}

// sortedKeys returns m's keys in order, so errors come out deterministically.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
