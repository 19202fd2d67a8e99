package importer

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/owners"
	"gopkg.in/yaml.v3"
)

// DefaultRoot is where the imported config and its files are to live.
const DefaultRoot = "/etc/nodeagent"

// Options change what Build writes.
type Options struct {
	// Root is the directory the config and its files will be installed
	// in; every path the config names is absolute under it. Default
	// /etc/nodeagent.
	Root string
	// Only imports just these objects, by name: a VLAN's, macvlan's or
	// WireGuard device's name (with the policy routing that belongs to
	// it, scope.go), a routing table's name or id (its routes, whoever
	// made them), "rules" (every rule that is not the kernel's, with the
	// tables they look up), "sysctls". Empty: everything the old setup
	// made.
	Only []string
	// Out names the directory the files are written to, in the steps
	// (default OUT).
	Out string
}

// File is a file the config names, to be written under Root.
type File struct {
	// Path is relative to Root (keys/wg0.key).
	Path string
	Data []byte
	Mode fs.FileMode
}

// Result is an imported config.
type Result struct {
	// Config is nodeagent.yaml's text, with comments.
	Config []byte
	// Files are the key and peer files the config names, sorted by path.
	Files []File
	// Steps are the switch-over, one shell line or instruction each;
	// none when nothing was found to import.
	Steps []string
	// Notes are what the operator should know: what was not imported or
	// could not be read. They never quote a hook line or a secret.
	Notes []string
	// Private is the notes file's text (NotesName, written 0600): what the
	// config and the notes must not quote, such as hook lines, which may
	// carry a token or a password; "" when there is none.
	Private string
}

// maxProblemNotes bounds the notes listing what could not be read.
const maxProblemNotes = 20

// ownNamesFile is the rt_tables.d entry nodeagent writes for the tables
// its config names (routing.tables[].name).
const ownNamesFile = "/etc/iproute2/rt_tables.d/nodeagent.conf"

// foreignName says the table's name comes from a file nodeagent does not
// write: the config leaves it there rather than name the table again in
// a file of its own, which would be a write on the first plan, not an
// adoption (and the same name in two files).
func (b *builder) foreignName(id int) bool {
	f := b.s.TableNameFiles[id]
	return f != "" && f != ownNamesFile
}

// reservedTableNames are the tables every kernel has.
var reservedTableNames = map[int]string{253: "default", 254: "main", 255: "local"}

// Route protocols (rtnetlink.h) named in comments.
var protoNames = map[int]string{1: "redirect", 2: "kernel", 3: "boot", 4: "static", 9: "ra", 11: "zebra",
	12: "bird", 16: "dhcp", 42: "babel", 186: "bgp", 187: "isis", 188: "ospf", 189: "rip", 147: "nodeagent"}

const protoKernel = 2

// builder holds one Build's state.
type builder struct {
	s     Snapshot
	o     Options
	links map[string]Link
	wgq   map[string]WGQuickFile
	// only is Options.Only as a set; nil selects everything.
	only  map[string]bool
	files []File
	notes []string
	// addrs are the addresses emitted so far (each once in a config).
	addrs map[netip.Addr]string
	// sysctls are the sysctls to write, with where each came from.
	sysctls   map[string]string
	sysctlWhy map[string]string
	masq      []masquerade
	forward   []forward
	// used are the links the config names, for the units to disable.
	used    map[string]bool
	wgUnits []string
	tables  map[int]bool
	// scope is the policy routing that is the old setup's (scope.go).
	scope scope
	// foreign are the comment lines for what is another's: rules, tables
	// and routes the import leaves alone.
	foreign []string
	// private are the notes file's entries (NotesName): what may hold a
	// secret, such as hook lines, root's only.
	private []string
	// unrun are the hooks nodeagent does not do, where each is.
	unrun []string
	// pia is the device PIA's manual-connections scripts made ("" for
	// none); piaTables are the tables that route through it (the VLAN's),
	// with the source prefixes whose rules look them up.
	pia         string
	piaTables   map[int]bool
	piaSources  []string
	piaCredStep string
	// peerDirs is how many devices get a peer register (peersDir): with
	// one, it is the package's /etc/nodeagent/peers.d itself; with more,
	// a directory of it per device.
	peerDirs int
}

// Build turns a Snapshot into a config that adopts what the node has. It
// is pure: the same Snapshot and Options give the same Result, byte for
// byte. It fails on an Only name that names nothing importable, and if the
// config it made does not validate (a bug, reported as such).
func Build(s Snapshot, o Options) (Result, error) {
	if o.Root == "" {
		o.Root = DefaultRoot
	}
	o.Root = path.Clean(o.Root)
	if !path.IsAbs(o.Root) {
		return Result{}, fmt.Errorf("root %q is not an absolute path", o.Root)
	}
	if o.Out == "" {
		o.Out = "OUT"
	}
	b := &builder{s: s, o: o, links: map[string]Link{}, wgq: map[string]WGQuickFile{}, addrs: map[netip.Addr]string{},
		sysctls: map[string]string{}, sysctlWhy: map[string]string{}, used: map[string]bool{}, tables: map[int]bool{}}
	for _, l := range s.Links {
		if l.Group == host.CreatingGroup || l.Group == host.StagingGroup {
			// nodeagent's own link between its creation and its mark, or
			// a WireGuard device it is filling under a name of its own:
			// its sync finishes or removes it.
			continue
		}
		b.links[l.Name] = l
	}
	for _, w := range s.WGQuick {
		b.wgq[w.Name] = w
	}
	if err := b.selectOnly(); err != nil {
		return Result{}, err
	}
	var out strings.Builder
	out.WriteString("# nodeagent.yaml, imported by `nodeagent import` from what this node has.\n")
	out.WriteString("# Every object below is taken over in place (adopt: true): nodeagent marks it\n")
	out.WriteString("# as its own without deleting it first. Read the comments, then follow the\n")
	out.WriteString("# steps `nodeagent import` printed.\n")
	vlans, macvlans := b.buildLinks()
	b.pia = b.piaDevice()
	wgs := b.buildWireGuard()
	b.scope = b.buildScope()
	rules := b.buildRules()
	tables := b.buildTables()
	mainRoutes := b.mainRoutes()
	b.buildSysctls()

	if len(b.sysctls) > 0 {
		out.WriteString("sysctls:\n")
		for _, k := range sortedKeys(b.sysctls) {
			if why := b.sysctlWhy[k]; why != "" {
				fmt.Fprintf(&out, "  # %s\n", why)
			}
			fmt.Fprintf(&out, "  %s: %s\n", k, scalar(b.sysctls[k]))
		}
	}
	section(&out, "vlans", vlans)
	section(&out, "macvlans", macvlans)
	section(&out, "wireguard", wgs)
	if len(tables) > 0 || len(rules) > 0 {
		out.WriteString("routing:\n")
		if len(tables) > 0 {
			out.WriteString("  tables:\n")
			writeIndented(&out, tables, "    ")
		}
		if len(rules) > 0 {
			out.WriteString("  rules:\n")
			writeIndented(&out, rules, "    ")
		}
		writeIndented(&out, mainRoutes, "  ")
		b.writeForeign(&out, "  ")
	} else {
		writeIndented(&out, mainRoutes, "")
		b.writeForeign(&out, "")
	}
	b.writeFirewall(&out)

	cfg := []byte(out.String())
	if _, err := config.ParseWith(path.Join(o.Root, "nodeagent.yaml"), cfg, config.Options{SkipFileChecks: true}); err != nil {
		return Result{Config: cfg}, fmt.Errorf("the imported config does not validate, a bug in nodeagent import (please report it with these lines):\n%w", err)
	}
	nothing := len(vlans)+len(macvlans)+len(wgs)+len(tables)+len(rules)+len(b.sysctls) == 0
	if nothing {
		b.notes = append(b.notes, "nothing found to import: no VLAN, macvlan or WireGuard device, no rule or table of its own, no sysctl off its default")
	}
	slices.SortFunc(b.files, func(x, y File) int { return strings.Compare(x.Path, y.Path) })
	for i, p := range s.Problems {
		if i == maxProblemNotes {
			b.notes = append(b.notes, fmt.Sprintf("not read: %d more, not listed", len(s.Problems)-i))
			break
		}
		b.notes = append(b.notes, "not read: "+p)
	}
	var steps []string
	if !nothing {
		steps = b.steps()
	}
	var private string
	if len(b.private) > 0 {
		private = "# nodeagent import: what the config does not quote because it may hold a secret.\n" +
			"# Root's only (0600): the wg-quick hook lines, as written.\n\n" + strings.Join(b.private, "\n") + "\n"
	}
	return Result{Config: cfg, Files: b.files, Steps: steps, Notes: b.notes, Private: private}, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func section(out *strings.Builder, key string, lines []string) {
	if len(lines) == 0 {
		return
	}
	out.WriteString(key + ":\n")
	writeIndented(out, lines, "  ")
}

func writeIndented(out *strings.Builder, lines []string, indent string) {
	for _, l := range lines {
		out.WriteString(indent + l + "\n")
	}
}

// scalar is s as a YAML scalar that reads back as the string s: plain
// where that is unambiguous, quoted where YAML would read a number, a
// bool, null, or something else.
func scalar(s string) string {
	b, err := yaml.Marshal(s)
	out := strings.TrimSuffix(string(b), "\n")
	if err != nil || strings.HasPrefix(out, ":") || strings.ContainsAny(out, ",[]{}#\n") {
		// Quoted: flow sequences and mappings end a plain scalar at these.
		return strconv.Quote(s)
	}
	return out
}

// opt is scalar(s), or "" (left out by flow) for an empty s.
func opt(s string) string {
	if s == "" {
		return ""
	}
	return scalar(s)
}

// flow renders key/value pairs as a YAML flow mapping, leaving out the
// pairs whose value is "".
func flow(kv ...string) string {
	var parts []string
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			parts = append(parts, kv[i]+": "+kv[i+1])
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// list renders strings as a YAML flow sequence.
func list(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = scalar(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// selectOnly checks Options.Only against what can be imported.
func (b *builder) selectOnly() error {
	if len(b.o.Only) == 0 {
		return nil
	}
	known := map[string]bool{"rules": true, "sysctls": true}
	for _, l := range b.links {
		if l.Kind == "vlan" || l.Kind == "macvlan" || l.Kind == "wireguard" {
			known[l.Name] = true
		}
	}
	for _, d := range b.s.WireGuard {
		known[d.Name] = true
	}
	for _, w := range b.s.WGQuick {
		known[w.Name] = true
	}
	for _, id := range b.routeTables() {
		known[strconv.Itoa(id)] = true
		if n := b.s.TableNames[id]; n != "" {
			known[n] = true
		}
	}
	b.only = map[string]bool{}
	for _, n := range b.o.Only {
		if !known[n] {
			names := sortedKeys(known)
			msg := fmt.Sprintf("--only %q names nothing this node has to import; it has: %s", n, strings.Join(names, ", "))
			if sug := config.Suggest(n, names); sug != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", sug)
			}
			return fmt.Errorf("%s", msg)
		}
		b.only[n] = true
	}
	return nil
}

// selected reports whether the object named name is to be imported.
func (b *builder) selected(names ...string) bool {
	if b.only == nil {
		return true
	}
	for _, n := range names {
		if b.only[n] {
			return true
		}
	}
	return false
}

// takeAddrs returns the addresses of l the config gives it: permanent,
// global scope, not IPv6 link-local, each once in the config; and comments
// for the rest.
func (b *builder) takeAddrs(owner string, addrs []Addr) (keep []string, comments []string) {
	sorted := slices.Clone(addrs)
	slices.SortStableFunc(sorted, func(x, y Addr) int { return comparePrefixStrings(x.Prefix, y.Prefix) })
	for _, a := range sorted {
		p, err := netip.ParsePrefix(a.Prefix)
		if err != nil {
			comments = append(comments, fmt.Sprintf("# address %s not imported: not a prefix", a.Prefix))
			continue
		}
		switch {
		case p.Addr().Is6() && p.Addr().IsLinkLocalUnicast():
			continue
		case a.Scope != "global":
			comments = append(comments, fmt.Sprintf("# address %s (scope %s) not imported: nodeagent assigns global addresses", a.Prefix, a.Scope))
			continue
		case a.Dynamic:
			comments = append(comments, fmt.Sprintf("# address %s not imported: dynamic (DHCP, SLAAC or with a lifetime); whatever gives it keeps it", a.Prefix))
			continue
		}
		if first, dup := b.addrs[p.Addr()]; dup {
			comments = append(comments, fmt.Sprintf("# address %s not imported: %s has it as well, and an address is one link's in the config", a.Prefix, first))
			continue
		}
		b.addrs[p.Addr()] = owner
		keep = append(keep, p.String())
	}
	return keep, comments
}

func comparePrefixStrings(x, y string) int {
	px, ex := netip.ParsePrefix(x)
	py, ey := netip.ParsePrefix(y)
	if ex != nil || ey != nil {
		return strings.Compare(x, y)
	}
	if c := px.Addr().Compare(py.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(px.Bits(), py.Bits())
}

// unmanagedKind names a link kind nodeagent does not make, for comments.
func unmanagedKind(k string) string {
	switch k {
	case "", "vlan", "macvlan", "wireguard":
		return ""
	}
	return k
}

// parentComment is the comment for a parent link nodeagent does not
// manage, or "".
func (b *builder) parentComment(parent string) string {
	p, ok := b.links[parent]
	if !ok {
		return fmt.Sprintf("# parent %s is not in this namespace; the link waits for it (pending) until it is", parent)
	}
	if k := unmanagedKind(p.Kind); k != "" {
		return fmt.Sprintf("# parent %s is a %s, which nodeagent does not manage: whatever makes it must keep making it before nodeagent starts", parent, k)
	}
	return ""
}

func (b *builder) buildLinks() (vlans, macvlans []string) {
	vlanIDs := map[string]string{}
	for _, l := range sortedLinks(b.links) {
		if (l.Kind != "vlan" && l.Kind != "macvlan") || !b.selected(l.Name) {
			continue
		}
		var lines []string
		if l.Kind == "macvlan" && !slices.Contains([]string{"bridge", "private", "vepa", "passthru"}, l.MacvlanMode) {
			macvlans = append(macvlans, fmt.Sprintf("# macvlan %s not imported: mode %q is not one nodeagent makes", l.Name, l.MacvlanMode))
			continue
		}
		if l.Parent == "" || l.Parent == l.Name {
			lines = append(lines, fmt.Sprintf("# %s %s not imported: its parent is in another namespace or unknown", l.Kind, l.Name))
			if l.Kind == "vlan" {
				vlans = append(vlans, lines...)
			} else {
				macvlans = append(macvlans, lines...)
			}
			continue
		}
		if l.Kind == "vlan" {
			k := fmt.Sprintf("%s/%d", l.Parent, l.VLANID)
			if first, dup := vlanIDs[k]; dup {
				vlans = append(vlans, fmt.Sprintf("# vlan %s not imported: VLAN %d on %s is %s's", l.Name, l.VLANID, l.Parent, first))
				continue
			}
			vlanIDs[k] = l.Name
		}
		b.used[l.Name] = true
		lines = append(lines, "- name: "+scalar(l.Name))
		lines = append(lines, b.ownerComments(l.Name)...)
		if c := b.parentComment(l.Parent); c != "" {
			lines = append(lines, "  "+c)
		}
		lines = append(lines, "  parent: "+scalar(l.Parent))
		if l.Kind == "vlan" {
			lines = append(lines, fmt.Sprintf("  id: %d", l.VLANID))
		} else {
			lines = append(lines, "  mode: "+l.MacvlanMode)
		}
		switch p, ok := b.links[l.Parent]; {
		case l.MTU == 0 || ok && p.MTU == l.MTU:
		case ok && p.MTU != 0 && l.MTU > p.MTU:
			lines = append(lines, fmt.Sprintf("  # mtu %d not imported: above the parent's %d, which the kernel does not allow", l.MTU, p.MTU))
		default:
			lines = append(lines, fmt.Sprintf("  mtu: %d", l.MTU))
		}
		if !l.Up {
			lines = append(lines, "  up: false")
		}
		keep, comments := b.takeAddrs(l.Kind+"s "+l.Name, l.Addresses)
		for _, c := range comments {
			lines = append(lines, "  "+c)
		}
		if len(keep) > 0 {
			lines = append(lines, "  addresses: "+list(keep))
		}
		lines = append(lines, "  adopt: true")
		if l.Kind == "vlan" {
			vlans = append(vlans, lines...)
		} else {
			macvlans = append(macvlans, lines...)
		}
	}
	return vlans, macvlans
}

// ownerComments name what made or configures a link (its owners' files),
// whose retiring steps come before the switch-over.
func (b *builder) ownerComments(name string) []string {
	var out []string
	for _, o := range b.s.Owners {
		if o.Link == name {
			out = append(out, fmt.Sprintf("  # %s: %s (%s); retired by a step before the switch-over", o.Kind, o.File, o.Role))
		}
	}
	return out
}

func sortedLinks(ls map[string]Link) []Link {
	out := make([]Link, 0, len(ls))
	for _, k := range sortedKeys(ls) {
		out = append(out, ls[k])
	}
	return out
}

// keyShaped reports whether s is a WireGuard key in base64.
func keyShaped(s string) bool {
	b, err := base64.StdEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

func (b *builder) buildWireGuard() []string {
	devs := map[string]WGDevice{}
	for _, d := range b.s.WireGuard {
		devs[d.Name] = d
	}
	names := map[string]bool{}
	for _, l := range b.links {
		if l.Kind == "wireguard" || (l.Kind == "tun" && devs[l.Name].Name != "") {
			names[l.Name] = true
		}
	}
	for _, w := range b.s.WGQuick {
		names[w.Name] = true
	}
	for _, name := range sortedKeys(names) {
		if b.wgImported(name) && len(b.wgPeers(name, devs)) > 0 {
			b.peerDirs++
		}
	}
	var lines []string
	for _, name := range sortedKeys(names) {
		if !b.selected(name) {
			continue
		}
		if name == b.pia {
			lines = append(lines, b.piaEntry(name)...)
			continue
		}
		if !b.wgImported(name) {
			// A file left behind: nothing brings it up at boot. Taking it
			// would make a new device on the first sync, not adopt one.
			lines = append(lines, fmt.Sprintf("# /etc/wireguard/%s.conf: not up, and wg-quick@%s is not enabled: not imported (a file left", name, name),
				fmt.Sprintf("# behind? importing it would make a new device); --only %s imports it", name))
			continue
		}
		lines = append(lines, b.wireguard(name, devs)...)
	}
	return lines
}

// wgImported reports whether the device name gets an entry of its own:
// selected, not PIA's, and up or brought up at boot (a wg-quick file left
// behind is not imported unless --only names it).
func (b *builder) wgImported(name string) bool {
	if !b.selected(name) || name == b.pia {
		return false
	}
	_, inKernel := b.links[name]
	return inKernel || slices.Contains(b.s.WGQuickUnits, name) || b.only[name]
}

// wgPeers are the peers the entry of device name takes (wireguard): the
// kernel's where they can be read, else its wg-quick file's.
func (b *builder) wgPeers(name string, devs map[string]WGDevice) []WGPeer {
	link, inKernel := b.links[name]
	dev, read := devs[name]
	inKernel = inKernel && (link.Kind == "wireguard" || link.Kind == "tun" && read)
	switch {
	case inKernel && read:
		return dev.Peers
	case inKernel:
		return nil
	}
	return b.wgq[name].Peers
}

// peersDir is where device dev's peer files go, relative to the config's
// directory: the package's peers.d (nodeagent.service may write there, for
// nodeagentctl peer add) when one device has a register, peers.d/DEV for
// each when several have.
func (b *builder) peersDir(dev string) string {
	if b.peerDirs > 1 {
		return path.Join("peers.d", dev)
	}
	return "peers.d"
}

func (b *builder) wireguard(name string, devs map[string]WGDevice) []string {
	wq, hasFile := b.wgq[name]
	link, inKernel := b.links[name]
	dev, read := devs[name]
	userspace := inKernel && link.Kind == "tun" && read
	inKernel = inKernel && (link.Kind == "wireguard" || userspace)
	var pre []string // comments before the entry's fields
	if userspace {
		pre = append(pre,
			fmt.Sprintf("# %s is a userspace device (over TUN: wireguard-go or the like), adopted while", name),
			"# that process runs; once it is gone (after the reboot) nodeagent makes the device",
			"# itself (implementation auto: the kernel's if it has WireGuard, else its own userspace one)")
	}
	var peers []WGPeer
	var addrs []string
	var addrComments []string
	mtu, port, mark := 0, 0, 0
	key := ""
	switch {
	case inKernel && read:
		key, port, mark, peers = dev.PrivateKey, dev.ListenPort, dev.FwMark, dev.Peers
		mtu = link.MTU
		addrs, addrComments = b.takeAddrs("wireguard "+name, link.Addresses)
		if hasFile && wq.ListenPort == 0 && port != 0 {
			// wg-quick left the port to the kernel, which picked this
			// one: peers that know it reach it there, after a reboot too.
			pre = append(pre, fmt.Sprintf("# /etc/wireguard/%s.conf has no ListenPort: the kernel picked %d, kept so that", name, port),
				"# peers that reach it there still do (without listenPort each start picks another)")
		}
	case inKernel:
		return []string{fmt.Sprintf("# WireGuard device %s not imported: its keys and peers could not be read (run nodeagent import as root)", name)}
	case hasFile:
		pre = append(pre, fmt.Sprintf("# %s is not up: imported from /etc/wireguard/%s.conf alone", name, name))
		key, port, peers, mtu = wq.PrivateKey, wq.ListenPort, wq.Peers, wq.MTU
		if m, err := strconv.ParseUint(wq.FwMark, 0, 32); err == nil {
			mark = int(m)
		}
		var hostAddrs []Addr
		for _, a := range wq.Addresses {
			if !strings.Contains(a, "/") {
				if ip, err := netip.ParseAddr(a); err == nil {
					a = netip.PrefixFrom(ip, ip.BitLen()).String()
				}
			}
			hostAddrs = append(hostAddrs, Addr{Prefix: a, Scope: "global"})
		}
		addrs, addrComments = b.takeAddrs("wireguard "+name, hostAddrs)
	default:
		return nil
	}
	b.used[name] = true
	if hasFile && slices.Contains(b.s.WGQuickUnits, name) {
		b.wgUnits = append(b.wgUnits, name)
	}
	root := b.o.Root
	lines := []string{"- name: " + scalar(name)}
	for _, c := range pre {
		lines = append(lines, "  "+c)
	}
	keyFile := path.Join(root, "keys", name+".key")
	lines = append(lines, "  privateKeyFile: "+scalar(keyFile))
	if keyShaped(key) {
		b.files = append(b.files, File{Path: path.Join("keys", name+".key"), Data: []byte(key + "\n"), Mode: 0o600})
	} else {
		b.notes = append(b.notes, fmt.Sprintf("%s: the private key could not be read; write it to %s (chmod 600) before nodeagent starts", name, keyFile))
	}
	if port != 0 {
		lines = append(lines, fmt.Sprintf("  listenPort: %d", port))
	}
	if mark != 0 {
		lines = append(lines, fmt.Sprintf("  fwMark: %d", mark))
	}
	if mtu != 0 && mtu != 1420 {
		lines = append(lines, fmt.Sprintf("  mtu: %d", mtu))
	}
	for _, c := range addrComments {
		lines = append(lines, "  "+c)
	}
	if inKernel && hasFile {
		for _, a := range wq.Addresses {
			p, err := netip.ParsePrefix(a)
			if err != nil {
				if ip, err2 := netip.ParseAddr(a); err2 == nil {
					p = netip.PrefixFrom(ip, ip.BitLen())
				} else {
					continue
				}
			}
			if !slices.Contains(addrs, p.String()) && b.addrs[p.Addr()] == "" {
				lines = append(lines, fmt.Sprintf("  # wg-quick's Address %s is not on the device, so it is not imported", a))
			}
		}
	}
	if len(addrs) > 0 {
		lines = append(lines, "  addresses: "+list(addrs))
	}
	if len(peers) > 0 {
		lines = append(lines, "  peersDir: "+scalar(path.Join(root, b.peersDir(name))))
		lines = append(lines, b.peerFiles(name, peers, wq, hasFile, !hasFile && listens(peers))...)
	}
	lines = append(lines, "  adopt: true")
	if hasFile {
		lines = append(lines, b.wgQuickExtras(name, wq)...)
	}
	return lines
}

// listens reports whether a device known only from the kernel (no
// wg-quick file says what was configured) is a server, whose peers come to
// it: anything but one peer that it keeps alive or sends everything to,
// which is a client of that peer.
func listens(peers []WGPeer) bool {
	if len(peers) != 1 {
		return true
	}
	p := peers[0]
	full := slices.Contains(p.AllowedIPs, "0.0.0.0/0") || slices.Contains(p.AllowedIPs, "::/0")
	return p.PersistentKeepalive == 0 && !full
}

var nameRE = regexp.MustCompile(`[^a-z0-9_-]+`)

// sanitize turns a peer's name hint into a file name: lower case, runs of
// anything but a-z, 0-9, '_' and '-' made one '-', at most 48 bytes.
func sanitize(s string) string {
	s = nameRE.ReplaceAllString(strings.ToLower(s), "-")
	s = strings.Trim(s, "-_")
	if len(s) > 48 {
		s = strings.TrimRight(s[:48], "-_")
	}
	return s
}

// keyName is a stable name from a public key: "peer-" and the start of
// its URL-safe base64.
func keyName(key string, n int) string {
	k := strings.NewReplacer("+", "-", "/", "_").Replace(strings.TrimRight(key, "="))
	return "peer-" + k[:min(n, len(k))]
}

// peerFiles writes one register file per peer and returns the comments
// for the entry. A peer without a preshared key is a wg-quick [Peer]
// stanza (NAME.conf); one with a key is YAML (NAME.yaml) naming the key's
// file, so that the key sits in a file of its own, readable by root only.
func (b *builder) peerFiles(dev string, peers []WGPeer, wq WGQuickFile, hasFile, server bool) []string {
	hints := map[string]WGPeer{}
	for _, p := range wq.Peers {
		hints[p.PublicKey] = p
	}
	type named struct {
		p    WGPeer
		name string
	}
	var all []named
	taken := map[string]int{}
	for _, p := range peers {
		// A commented-out key above [Peer] is no name: it would put
		// most of a key into a file name.
		n := sanitize(redact(hints[p.PublicKey].NameHint))
		if n == "" || strings.HasPrefix(n, "peer-") {
			n = keyName(p.PublicKey, 8)
		}
		taken[n]++
		all = append(all, named{p, n})
	}
	for i := range all {
		if taken[all[i].name] > 1 {
			all[i].name += "-" + strings.TrimPrefix(keyName(all[i].p.PublicKey, 8), "peer-")
		}
	}
	slices.SortFunc(all, func(x, y named) int { return strings.Compare(x.name, y.name) })
	var comments []string
	kernelEndpoints, roaming := 0, 0
	for _, x := range all {
		p := x.p
		switch {
		case hasFile:
			// The file's endpoint, where it states one: the kernel's is
			// where the peer was last seen, a roaming client's address,
			// which a configured endpoint would pin it to.
			p.Endpoint = hints[p.PublicKey].Endpoint
		case server && p.Endpoint != "":
			p.Endpoint = ""
			roaming++
		case p.Endpoint != "":
			kernelEndpoints++
		}
		allowed := slices.Clone(p.AllowedIPs)
		slices.SortFunc(allowed, comparePrefixStrings)
		dir := b.peersDir(dev)
		if p.PresharedKey == "" {
			var t strings.Builder
			t.WriteString("[Peer]\n")
			fmt.Fprintf(&t, "PublicKey = %s\n", p.PublicKey)
			if p.Endpoint != "" {
				fmt.Fprintf(&t, "Endpoint = %s\n", p.Endpoint)
			}
			if len(allowed) > 0 {
				fmt.Fprintf(&t, "AllowedIPs = %s\n", strings.Join(allowed, ", "))
			}
			if p.PersistentKeepalive != 0 {
				fmt.Fprintf(&t, "PersistentKeepalive = %d\n", p.PersistentKeepalive)
			}
			b.files = append(b.files, File{Path: path.Join(dir, x.name+".conf"), Data: []byte(t.String()), Mode: 0o644})
			continue
		}
		// A directory per device: wg0 with peer a-b and wg0-a with peer b
		// would share keys/wg0-a-b.psk.
		pskRel := path.Join("keys", dev, x.name+".psk")
		b.files = append(b.files, File{Path: pskRel, Data: []byte(p.PresharedKey + "\n"), Mode: 0o600})
		var t strings.Builder
		fmt.Fprintf(&t, "publicKey: %s\n", scalar(p.PublicKey))
		fmt.Fprintf(&t, "presharedKeyFile: %s\n", scalar(path.Join(b.o.Root, pskRel)))
		if p.Endpoint != "" {
			fmt.Fprintf(&t, "endpoint: %s\n", scalar(p.Endpoint))
		}
		if len(allowed) > 0 {
			fmt.Fprintf(&t, "allowedIPs: %s\n", list(allowed))
		}
		if p.PersistentKeepalive != 0 {
			fmt.Fprintf(&t, "persistentKeepalive: %d\n", p.PersistentKeepalive)
		}
		b.files = append(b.files, File{Path: path.Join(dir, x.name+".yaml"), Data: []byte(t.String()), Mode: 0o644})
	}
	comments = append(comments, fmt.Sprintf("  # %d peer(s), one file each in peersDir", len(all)))
	if roaming > 0 {
		comments = append(comments, fmt.Sprintf("  # no wg-quick file states an endpoint, and %s listens for its peers: the %d endpoint(s) the", dev, roaming),
			"  # kernel holds (where each was last seen) are not imported, so every client keeps roaming")
		b.notes = append(b.notes, fmt.Sprintf("%s: %d peer endpoint(s) the kernel holds are not imported: no file states them and %s is a server, whose clients roam (a configured endpoint would pin each to its last address)", dev, roaming, dev))
	}
	if kernelEndpoints > 0 {
		b.notes = append(b.notes, fmt.Sprintf("%s: %d peer endpoint(s) come from the kernel, which holds where a peer was last seen: check them in %s", dev, kernelEndpoints, path.Join(b.o.Root, b.peersDir(dev))))
	}
	return comments
}

// wgQuickExtras are the comments for what a wg-quick file says that the
// kernel does not hold: Table, DNS, SaveConfig and the hooks.
func (b *builder) wgQuickExtras(name string, wq WGQuickFile) []string {
	var c []string
	add := func(format string, args ...any) { c = append(c, "  # "+fmt.Sprintf(format, args...)) }
	switch t := strings.ToLower(wq.Table); t {
	case "off":
	case "", "auto", "main", "254":
		var routes []string
		for _, r := range b.s.Routes {
			if r.Table == 254 && r.Dev == name && r.Protocol != protoKernel {
				routes = append(routes, routeText(r))
			}
		}
		slices.Sort(routes)
		if len(routes) > 0 {
			add("wg-quick (Table = %s) added main-table routes for the peers' AllowedIPs; nodeagent adds none:", cmp.Or(wq.Table, "auto"))
			add("the device's own prefixes reach peers inside them; for prefixes beyond, declare a table")
			add("under routing.tables with routes dev %s and a rule that looks it up.", name)
			for _, r := range routes {
				add("  wg-quick's: %s", r)
			}
		}
		if fullTunnel(wq.Peers) {
			add("a peer allows a default route: wg-quick routed everything through %s with its fwmark, a table", name)
			add("of its own and rules (imported above from the kernel, with fwMark), and an nftables table")
			add("wg-quick-%s, not imported: it drops packets for %s's addresses that come in by another", name, name)
			add("interface and carries the fwmark through conntrack. It is no kill switch: nothing in it stops")
			add("traffic leaving by another interface while %s is down (nodeagent's firewall.killSwitch does)", name)
		}
		if len(routes) > 0 {
			b.notes = append(b.notes, fmt.Sprintf("%s: wg-quick's main-table routes (%d) stay until the reboot and are not made again by nodeagent; see the comment at wireguard %s", name, len(routes), name))
		}
	default:
		add("wg-quick (Table = %s) put the AllowedIPs routes in that table: imported under routing.tables when it is not main", wq.Table)
	}
	if len(wq.DNS) > 0 {
		add("wg-quick DNS = %s: nodeagent does not manage resolv.conf; set the resolver elsewhere (systemd-resolved, resolvconf)", strings.Join(wq.DNS, ", "))
	}
	if wq.SaveConfig {
		add("wg-quick SaveConfig = true: nodeagent never writes /etc/wireguard/%s.conf; peers live in peersDir", name)
	}
	// The hooks' text is never in the config, which is 0644 and copied
	// around: a hook may carry a token or a password. The config says what
	// each did; the lines themselves go to the notes file, root's only.
	down := false
	for i, h := range wq.Hooks {
		cmd := strings.ReplaceAll(h.Command, "%i", name)
		where := fmt.Sprintf("%s's %s (hook %d of /etc/wireguard/%s.conf)", name, h.When, i+1, name)
		b.private = append(b.private, fmt.Sprintf("%s:\n  %s = %s", where, h.When, h.Command))
		r := parseHook(cmd)
		if h.When == "PreDown" || h.When == "PostDown" {
			if len(r.masq)+len(r.forward)+len(r.sysctls) > 0 || (len(r.other) == 0 && cmd != "") {
				down = true
			}
			for _, o := range r.other {
				b.unrun = append(b.unrun, where)
				add("%s: %s (the line is in %s)", where, commandKind(o), NotesName)
			}
			continue
		}
		for _, m := range r.masq {
			add("%s masquerades %s out %s: see firewall.masquerade at the end", where, m.from, m.out)
			b.addMasq(m)
		}
		for _, f := range r.forward {
			add("%s accepts forwarding in %s out %s: see firewall.forward at the end", where, f.in, f.out)
			b.addForward(f)
		}
		for _, kv := range r.sysctls {
			if _, ok := b.sysctls[kv[0]]; !ok && b.selected("sysctls", name) {
				b.sysctls[kv[0]] = kv[1]
				b.sysctlWhy[kv[0]] = fmt.Sprintf("from %s's %s (wg-quick)", name, h.When)
			}
			add("%s sets %s=%s: see sysctls", where, kv[0], kv[1])
		}
		for _, o := range r.other {
			b.unrun = append(b.unrun, where)
			add("%s: %s (the line is in %s)", where, commandKind(o), NotesName)
		}
	}
	if down {
		add("the PreDown/PostDown lines that undo the lines above are not needed: nodeagent removes what it made itself")
	}
	return c
}

// fullTunnel reports whether a peer allows 0.0.0.0/0 or ::/0, for which
// wg-quick's Table = auto sets up policy routing instead of a main route.
func fullTunnel(peers []WGPeer) bool {
	for _, p := range peers {
		if slices.Contains(p.AllowedIPs, "0.0.0.0/0") || slices.Contains(p.AllowedIPs, "::/0") {
			return true
		}
	}
	return false
}

func (b *builder) addMasq(m masquerade) {
	if !slices.Contains(b.masq, m) {
		b.masq = append(b.masq, m)
	}
}

func (b *builder) addForward(f forward) {
	if !slices.Contains(b.forward, f) {
		b.forward = append(b.forward, f)
	}
}

// writeFirewall writes the firewall stanzas the hooks stood for, commented
// out: while wg-quick's own rules are in place they would match twice, and
// whether nodeagent's nftables table replaces iptables rules is the
// operator's call.
func (b *builder) writeFirewall(out *strings.Builder) {
	if b.pia != "" && len(b.piaSources) > 0 {
		// Forwarded traffic from the sources routed into PIA's tunnel
		// leaves by it alone, also while it is down (the switch-over's
		// gap), and is masqueraded to the tunnel's address.
		fmt.Fprintf(out, "firewall:\n  # what is routed into PIA's tunnel leaves by %s alone, and not at all while it is down\n  killSwitch:\n", b.pia)
		for _, src := range b.piaSources {
			fmt.Fprintf(out, "    - %s\n", flow("from", scalar(src), "allowOut", list([]string{b.pia})))
		}
		out.WriteString("  masquerade:\n")
		for _, src := range b.piaSources {
			fmt.Fprintf(out, "    - %s\n", flow("from", scalar(src), "out", scalar(b.pia)))
		}
	}
	if len(b.masq) == 0 && len(b.forward) == 0 {
		return
	}
	out.WriteString("# wg-quick's hooks did this firewalling. Once wg-quick is disabled nothing does\n")
	out.WriteString("# it after the next boot: uncomment this for nodeagent to (its own nftables table).\n")
	out.WriteString("# firewall:\n")
	if len(b.masq) > 0 {
		out.WriteString("#   masquerade:\n")
		for _, m := range b.masq {
			name, wild := strings.CutSuffix(m.out, "+")
			if !wild {
				fmt.Fprintf(out, "#     - %s\n", flow("from", scalar(m.from), "out", scalar(m.out)))
				continue
			}
			// iptables' -o eth+ is every interface whose name starts with
			// eth; nodeagent's out is one interface, compared byte for
			// byte (an eth+ would never match): the node's such links,
			// one entry each.
			links := b.expandWild(m.out)
			fmt.Fprintf(out, "#     # -o %s is every interface whose name starts with %s; nodeagent's out names one:\n", m.out, name)
			if len(links) == 0 {
				fmt.Fprintf(out, "#     # this node has none now: add an entry for each that comes\n")
				continue
			}
			fmt.Fprintf(out, "#     # the ones this node has now (one that comes later needs an entry of its own)\n")
			for _, l := range links {
				fmt.Fprintf(out, "#     - %s\n", flow("from", scalar(m.from), "out", scalar(l)))
			}
		}
	}
	if len(b.forward) > 0 {
		out.WriteString("#   forward:\n")
		for _, f := range b.forward {
			ins, outs := b.expandWild(f.in), b.expandWild(f.out)
			if strings.HasSuffix(f.in, "+") || strings.HasSuffix(f.out, "+") {
				fmt.Fprintf(out, "#     # -i %s -o %s: a name ending in + is every interface it starts; nodeagent's names one: the node's now\n", f.in, f.out)
			}
			for _, i := range ins {
				for _, o := range outs {
					fmt.Fprintf(out, "#     - %s\n", flow("in", scalar(i), "out", scalar(o)))
				}
			}
		}
	}
}

// expandWild is an iptables interface name as the config's names: itself,
// or for one ending in + (every interface whose name starts with the
// rest) the node's links that do.
func (b *builder) expandWild(name string) []string {
	prefix, wild := strings.CutSuffix(name, "+")
	if !wild {
		return []string{name}
	}
	var out []string
	for _, l := range b.s.Links {
		if strings.HasPrefix(l.Name, prefix) {
			out = append(out, l.Name)
		}
	}
	return out
}

// routeTables are the ids of the tables whose routes are imported: not
// main, default or local, with a route that is not the kernel's.
func (b *builder) routeTables() []int {
	ids := map[int]bool{}
	for _, r := range b.s.Routes {
		if reservedTableNames[r.Table] == "" && r.Table != 0 && r.Protocol != protoKernel {
			ids[r.Table] = true
		}
	}
	out := make([]int, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// allTables are the ids of every table with a route but main, default
// and local, the kernel's routes counted: Cilium's, say, are of protocol
// kernel.
func (b *builder) allTables() []int {
	ids := map[int]bool{}
	for _, r := range b.s.Routes {
		if reservedTableNames[r.Table] == "" && r.Table != 0 {
			ids[r.Table] = true
		}
	}
	return sortedInts(ids)
}

var tableNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// tableName is the config's name for table id, from rt_tables, or "": a
// name the config does not take, or one rt_tables gives more than one
// table, is left out.
func (b *builder) tableName(id int) string {
	n := b.s.TableNames[id]
	if b.foreignName(id) {
		return ""
	}
	if n == "" || !tableNameRE.MatchString(n) || isDigits(n) || slices.Contains([]string{"unspec", "default", "main", "local"}, n) {
		return ""
	}
	for other, m := range b.s.TableNames {
		if m == n && other != id {
			return ""
		}
	}
	return n
}

func isDefaultRule(r Rule) bool {
	plain := r.From == "" && r.To == "" && r.IIF == "" && r.OIF == "" && r.FwMark == "" && !r.Invert &&
		r.SuppressPrefixLength == nil && r.Action == "table" && len(r.Extra) == 0
	return plain && (r.Priority == 0 && r.Table == 255 || r.Priority == 32766 && r.Table == 254 || r.Priority == 32767 && r.Table == 253)
}

// buildRules renders the rules and records the tables they look up.
func (b *builder) buildRules() []string {
	var rules []Rule
	for i, r := range b.s.Rules {
		switch {
		case isDefaultRule(r):
		case b.scope.rules[i]:
			rules = append(rules, r)
		default:
			b.foreignRule(r)
		}
	}
	slices.SortStableFunc(rules, func(x, y Rule) int {
		return cmp.Or(cmp.Compare(x.Priority, y.Priority), strings.Compare(x.Family, y.Family))
	})
	var lines []string
	prios := map[int]Rule{}
	// same: the IPv6 twin of a rule without from and to, which the
	// config's one rule makes for both families.
	same := func(x, y Rule) bool {
		return x.Priority == y.Priority && x.From == "" && y.From == "" && x.To == "" && y.To == "" &&
			fmt.Sprint(x.IIF, x.OIF, x.FwMark, x.Table, x.Action, x.Invert, ptrInt(x.SuppressPrefixLength)) ==
				fmt.Sprint(y.IIF, y.OIF, y.FwMark, y.Table, y.Action, y.Invert, ptrInt(y.SuppressPrefixLength))
	}
	families := map[int]map[string]bool{}
	for _, r := range rules {
		if families[r.Priority] == nil {
			families[r.Priority] = map[string]bool{}
		}
		if r.From == "" && r.To == "" {
			families[r.Priority][r.Family] = true
		}
	}
	for _, r := range rules {
		if isDefaultRule(r) {
			continue
		}
		if first, dup := prios[r.Priority]; dup {
			if !same(first, r) {
				lines = append(lines, fmt.Sprintf("# not imported: %s; priority %d is the rule's above, and the config gives each priority one rule", ruleText(r), r.Priority))
			}
			continue
		}
		if r.Priority == 0 {
			lines = append(lines, fmt.Sprintf("# not imported: %s; priority 0 is the kernel's", ruleText(r)))
			continue
		}
		if len(r.Extra) > 0 {
			// Without them the rule would match more than it does now.
			lines = append(lines, fmt.Sprintf("# not imported: %s; it also matches on %s, which nodeagent's rules cannot", ruleText(r), strings.Join(r.Extra, ", ")))
			continue
		}
		action := r.Action
		if action != "table" && action != "unreachable" && action != "blackhole" && action != "prohibit" {
			lines = append(lines, fmt.Sprintf("# not imported: %s; nodeagent makes no %s rules", ruleText(r), action))
			continue
		}
		if action == "table" && r.Table == 0 {
			lines = append(lines, fmt.Sprintf("# not imported: %s; a rule that names no table (l3mdev's, say) is not one nodeagent makes", ruleText(r)))
			continue
		}
		prios[r.Priority] = r
		var c []string
		if r.From == "" && r.To == "" {
			// The same words whatever the kernel has, so that importing
			// again once nodeagent made the other family's twin prints
			// the same config (a fixed point); what the kernel has now
			// is a note.
			c = append(c, "# without from and to, nodeagent makes this rule for IPv4 and IPv6")
			if len(families[r.Priority]) == 1 {
				b.notes = append(b.notes, fmt.Sprintf("rule %d: the kernel has it for %s only; nodeagent will add the other family's twin (give from or to to keep it to one family)", r.Priority, map[string]string{"inet": "IPv4", "inet6": "IPv6"}[r.Family]))
			}
		}
		kv := []string{"priority", strconv.Itoa(r.Priority), "from", opt(r.From), "to", opt(r.To),
			"iif", opt(r.IIF), "oif", opt(r.OIF), "fwMark", opt(r.FwMark)}
		if action == "table" {
			kv = append(kv, "table", b.ruleTable(r.Table))
		} else {
			kv = append(kv, "action", action)
		}
		if r.Invert {
			kv = append(kv, "invert", "true")
		}
		if r.SuppressPrefixLength != nil {
			kv = append(kv, "suppressPrefixLength", strconv.Itoa(*r.SuppressPrefixLength))
		}
		kv = append(kv, "adopt", "true")
		lines = append(lines, c...)
		lines = append(lines, "- "+flow(kv...))
	}
	return lines
}

func ptrInt(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}

// ruleTable is how a rule names table id, as YAML: main, default or local,
// the table's name, or its id (a number, unquoted); a table that is not
// reserved is declared.
func (b *builder) ruleTable(id int) string {
	if n := reservedTableNames[id]; n != "" {
		return n
	}
	b.tables[id] = true
	if n := b.tableName(id); n != "" {
		return scalar(n)
	}
	return strconv.Itoa(id)
}

// ruleText is a rule in ip-rule words, for comments.
func ruleText(r Rule) string {
	w := []string{fmt.Sprintf("rule %d:", r.Priority)}
	if r.Family == "inet6" {
		w[0] = fmt.Sprintf("IPv6 rule %d:", r.Priority)
	}
	if r.Invert {
		w = append(w, "not")
	}
	w = append(w, "from", cmp.Or(r.From, "all"))
	if r.To != "" {
		w = append(w, "to", r.To)
	}
	if r.FwMark != "" {
		w = append(w, "fwmark", r.FwMark)
	}
	if r.IIF != "" {
		w = append(w, "iif", r.IIF)
	}
	if r.OIF != "" {
		w = append(w, "oif", r.OIF)
	}
	if r.Action == "table" {
		w = append(w, "lookup", cmp.Or(reservedTableNames[r.Table], strconv.Itoa(r.Table)))
		if r.SuppressPrefixLength != nil {
			w = append(w, "suppress_prefixlength", strconv.Itoa(*r.SuppressPrefixLength))
		}
	} else {
		w = append(w, r.Action)
	}
	return strings.Join(w, " ")
}

// routeText is a route in ip-route words, for comments.
func routeText(r Route) string {
	w := []string{}
	if r.Type != "unicast" {
		w = append(w, r.Type)
	}
	to := r.To
	if to == "0.0.0.0/0" || to == "::/0" {
		to = "default"
		if r.To == "::/0" {
			to = "default (IPv6)"
		}
	}
	w = append(w, to)
	if r.From != "" {
		w = append(w, "from", r.From)
	}
	if r.Via != "" {
		w = append(w, "via", r.Via)
	}
	if r.Dev != "" {
		w = append(w, "dev", r.Dev)
	}
	if p := protoNames[r.Protocol]; p != "" {
		w = append(w, "proto", p)
	} else {
		w = append(w, "proto", strconv.Itoa(r.Protocol))
	}
	if r.Src != "" {
		w = append(w, "src", r.Src)
	}
	if r.Metric != 0 {
		w = append(w, "metric", strconv.Itoa(r.Metric))
	}
	return strings.Join(w, " ")
}

// buildTables renders routing.tables: the selected tables with routes,
// and the tables imported rules look up.
func (b *builder) buildTables() []string {
	imported := b.routeTables()
	for _, id := range b.allTables() {
		switch {
		case b.scope.tables[id] && slices.Contains(imported, id):
			b.tables[id] = true
		case !b.scope.tables[id]:
			b.foreignTable(id)
		}
	}
	var lines []string
	for _, id := range sortedInts(b.tables) {
		lines = append(lines, fmt.Sprintf("- id: %d", id))
		if n := b.tableName(id); n != "" {
			lines = append(lines, "  name: "+scalar(n))
		} else if n := b.s.TableNames[id]; n != "" && b.foreignName(id) {
			lines = append(lines, fmt.Sprintf("  # %s names it %s and stays as it is; a name: here would have nodeagent write it again in %s", b.s.TableNameFiles[id], n, ownNamesFile))
		} else if n != "" {
			lines = append(lines, fmt.Sprintf("  # rt_tables names it %q, which is not a name the config takes", n))
		}
		if b.piaTables[id] {
			lines = append(lines, fmt.Sprintf("  # the way into PIA's tunnel: closed (unreachable) whenever %s is not there, through the", b.pia),
				"  # switch-over's gap too",
				"  killSwitch: true")
		}
		routes, comments, ks := b.tableRoutes(id)
		if ks {
			// killSwitch: true makes the same two routes but takes no
			// adopt: routes the old way made would be conflicts left
			// alone.
			lines = append(lines, "  # the two unreachable defaults at metric 4294967295 are what killSwitch: true makes;")
			lines = append(lines, "  # they are listed as routes so that they are adopted")
		}
		for _, c := range comments {
			lines = append(lines, "  "+c)
		}
		if len(routes) > 0 {
			lines = append(lines, "  routes:")
			for _, r := range routes {
				lines = append(lines, "    - "+r)
			}
		}
	}
	return lines
}

func sortedInts(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// tableRoutes renders table id's routes; ks reports the kill switch's
// pair of unreachable defaults (IPv4 and IPv6 at the highest metric).
func (b *builder) tableRoutes(id int) (routes, comments []string, ks bool) {
	var rs []Route
	for _, r := range b.s.Routes {
		if r.Table == id {
			rs = append(rs, r)
		}
	}
	// Stable: of two routes with one key (to, metric), the kernel's dump
	// order says which one a replace changes (the first), and that is the
	// one imported.
	slices.SortStableFunc(rs, func(x, y Route) int {
		return cmp.Or(boolCmp(strings.Contains(x.To, ":"), strings.Contains(y.To, ":")), comparePrefixStrings(x.To, y.To), cmp.Compare(x.Metric, y.Metric))
	})
	isKS := func(r Route) bool {
		return r.Type == "unreachable" && (r.To == "0.0.0.0/0" || r.To == "::/0") && r.Metric == math.MaxUint32
	}
	n := 0
	for _, r := range rs {
		if isKS(r) {
			n++
		}
	}
	ks = n == 2
	type key struct {
		to     string
		metric int
	}
	seen := map[key]bool{}
	for _, r := range rs {
		switch {
		case r.From != "":
			b.notes = append(b.notes, fmt.Sprintf("table %d: %s is source-specific (from %s), which nodeagent's routes cannot say: not imported, left as it is, and nodeagent's own routes never replace it", id, routeText(r), r.From))
			comments = append(comments, "# not imported: "+routeText(r)+"; a source-specific route (from), which nodeagent's routes cannot say: left as it is, never replaced")
			continue
		case r.Protocol == protoKernel:
			continue
		case r.Multipath:
			comments = append(comments, "# not imported: "+routeText(r)+"; nodeagent makes no multipath routes")
			continue
		case len(r.Extra) > 0:
			// Adopting it (a replace with nodeagent's fields) would drop them.
			comments = append(comments, "# not imported: "+routeText(r)+"; it has "+strings.Join(r.Extra, ", ")+", which nodeagent's routes do not")
			continue
		case !slices.Contains([]string{"unicast", "unreachable", "blackhole", "prohibit"}, r.Type):
			comments = append(comments, "# not imported: "+routeText(r)+"; nodeagent makes no "+r.Type+" routes")
			continue
		case r.Type == "unicast" && r.Dev == "" && r.Via == "":
			comments = append(comments, "# not imported: "+routeText(r)+"; its device is unknown")
			continue
		}
		v6 := strings.Contains(r.To, ":")
		if v6 && r.Metric == 0 {
			r.Metric = 1024 // the kernel's IPv6 default, and the config's
		}
		k := key{r.To, r.Metric}
		if seen[k] {
			comments = append(comments, "# not imported: "+routeText(r)+"; the table has a route to it at this metric already, and the config holds one")
			continue
		}
		seen[k] = true
		to := r.To
		if to == "0.0.0.0/0" {
			to = "default"
		}
		kv := []string{"to", scalar(to)}
		if r.Type == "unicast" {
			kv = append(kv, "via", opt(r.Via), "dev", opt(r.Dev))
			if r.Dev != "" {
				if c := b.devComment(r.Dev); c != "" {
					comments = append(comments, c)
				}
			}
		}
		kv = append(kv, "src", opt(r.Src))
		if (v6 && r.Metric != 1024) || (!v6 && r.Metric != 0) {
			kv = append(kv, "metric", strconv.FormatUint(uint64(uint32(r.Metric)), 10))
		}
		if !v6 {
			def := "global"
			if r.Type == "unicast" && r.Via == "" {
				def = "link"
			}
			if r.Scope != def {
				kv = append(kv, "scope", r.Scope)
			}
		}
		if r.Type != "unicast" {
			kv = append(kv, "type", r.Type)
		}
		if r.OnLink {
			kv = append(kv, "onlink", "true")
		}
		kv = append(kv, "adopt", "true")
		routes = append(routes, flow(kv...))
	}
	return routes, slices.Compact(comments), ks
}

func boolCmp(x, y bool) int {
	switch {
	case x == y:
		return 0
	case !x:
		return -1
	}
	return 1
}

// devComment is the comment for a route's device that nodeagent does not
// make, or "".
func (b *builder) devComment(dev string) string {
	l, ok := b.links[dev]
	switch {
	case dev == b.pia:
		return "" // nodeagent's own once the scripts' is gone
	case !ok:
		return fmt.Sprintf("# %s is not in this namespace: its routes wait for it", dev)
	case unmanagedKind(l.Kind) != "" && l.Kind != "veth":
		return fmt.Sprintf("# %s is a %s, which nodeagent does not manage: whatever makes it must keep making it", dev, l.Kind)
	}
	return ""
}

// mainRoutes are comments listing the main table's routes that are not
// the kernel's (DHCP's, a script's): nodeagent declares no main table.
func (b *builder) mainRoutes() []string {
	var rs []string
	for _, r := range b.s.Routes {
		if r.Table != 254 || r.Protocol == protoKernel || r.Type == "multicast" {
			continue
		}
		if b.only != nil && !b.only[r.Dev] {
			continue
		}
		if o := linkOwner(r.Dev); o != "" {
			rs = append(rs, routeText(r)+": "+o)
			continue
		}
		rs = append(rs, routeText(r))
	}
	if len(rs) == 0 {
		return nil
	}
	slices.Sort(rs)
	out := []string{"# The main table's routes are not imported (nodeagent fills the tables it declares,",
		"# never main); whatever made these keeps making them:"}
	for _, r := range slices.Compact(rs) {
		out = append(out, "#   "+r)
	}
	return out
}

// buildSysctls adds the kernel's sysctls that are not at their default.
func (b *builder) buildSysctls() {
	if !b.selected("sysctls") {
		return
	}
	dflt := b.s.Sysctls["net.ipv4.conf.default.rp_filter"]
	for k, v := range b.s.Sysctls {
		d, global := sysctlDefaults[k]
		switch {
		case global && v == d:
			continue
		case !global && strings.HasSuffix(k, ".rp_filter"):
			link := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(k, "net.ipv4.conf."), ".rp_filter"), "/", ".")
			if v == cmp.Or(dflt, "0") || !b.used[link] {
				continue
			}
		}
		if strings.TrimSpace(v) == "" {
			continue
		}
		b.sysctls[k] = v
		delete(b.sysctlWhy, k)
	}
}

// steps is the switch-over for what was imported.
func (b *builder) steps() []string {
	root := b.o.Root
	st := []string{
		fmt.Sprintf("install -d -m 0750 %s && cp -a %s/* %s/   # as root: keys stay 0600, key directories 0700", root, b.o.Out, root),
	}
	if b.piaCredStep != "" {
		st = append(st, b.piaCredStep)
	}
	st = append(st, "nodeagent validate")
	if b.pia != "" {
		st = append(st, fmt.Sprintf("nodeagent plan   # expect adoptions, the kill switch added, and %s left alone while the scripts' tunnel is there", b.pia))
	} else {
		st = append(st, "nodeagent plan   # expect only adoptions (~ ... adopt), nothing added or removed")
	}
	slices.Sort(b.wgUnits)
	for _, n := range b.wgUnits {
		st = append(st, fmt.Sprintf("systemctl disable wg-quick@%s   # disable, do NOT stop: wg-quick down deletes the device", n))
	}
	var units []string
	for _, u := range b.s.Units {
		for _, l := range u.Links {
			if b.used[l] {
				units = append(units, u.Name)
				break
			}
		}
	}
	slices.Sort(units)
	var unmade []string
	for _, l := range sortedKeys(b.used) {
		if k := b.links[l].Kind; k != "vlan" && k != "macvlan" {
			continue
		}
		made := false
		for _, u := range b.s.Units {
			made = made || slices.Contains(u.Links, l)
		}
		if !made {
			unmade = append(unmade, l)
		}
	}
	// The owners' retiring steps, for the links imported: each link is
	// made by nothing but nodeagent after the reboot.
	var own []owners.Owner
	for _, o := range b.s.Owners {
		if b.used[o.Link] {
			own = append(own, o)
		}
	}
	st = append(st, owners.Steps(own)...)
	unmade = slices.DeleteFunc(unmade, func(l string) bool {
		return slices.ContainsFunc(own, func(o owners.Owner) bool { return o.Link == l && (o.Makes || o.Kind == owners.Networkd) })
	})
	if len(unmade) > 0 {
		b.notes = append(b.notes, fmt.Sprintf("nothing found makes %s (no unit running ip link add, no systemd-networkd, netplan, ifupdown or NetworkManager file under /etc): if something else does, retire it before the reboot", strings.Join(unmade, ", ")))
	}
	for _, u := range slices.Compact(units) {
		st = append(st, fmt.Sprintf("systemctl disable %s   # it made links nodeagent now makes; do not stop it", u))
	}
	if len(b.masq)+len(b.forward) > 0 {
		st = append(st, fmt.Sprintf("edit %s: uncomment the firewall section (wg-quick's hooks no longer run after the reboot)", path.Join(root, "nodeagent.yaml")))
	}
	if len(b.unrun) > 0 {
		b.notes = append(b.notes, fmt.Sprintf("%d hook command(s) nodeagent does not run or translate (%s): after the reboot nothing runs them; their lines are in %s, root's only",
			len(b.unrun), strings.Join(slices.Compact(slices.Clone(b.unrun)), "; "), NotesName))
		st = append(st, fmt.Sprintf("read %s (root's only): %d hook command(s) nodeagent does not run (%s); do what they did some other way, or nothing does after the reboot",
			path.Join(b.o.Out, NotesName), len(b.unrun), strings.Join(slices.Compact(slices.Clone(b.unrun)), "; ")))
	}
	if b.pia != "" {
		st = append(st, fmt.Sprintf("systemctl enable --now nodeagent   # the kill switch closes the VLAN to all but %s now; the scripts' tunnel still carries it", b.pia))
		st = append(st, b.piaSteps()...)
	} else {
		st = append(st, "systemctl enable --now nodeagent")
	}
	st = append(st,
		"nodeagent plan   # expect nothing to change",
		"reboot   # proves the node comes up from nodeagent alone; then nodeagent plan again",
	)
	return st
}
