// Package hazard finds what on this node will undo nodeagent's work: the
// network software beside it, configured the way it ships. Today that is
// systemd-networkd: with its defaults it deletes every routing rule and
// route it did not make whenever it configures a link it manages, and a
// .network file whose [Match] is broad (Name=en*) takes nodeagent's links
// as its own. Each hazard names its source and the fix.
//
// The reading follows networkd's own: networkd.conf(5) and
// systemd.network(5), every directory of the search path, a file in an
// earlier directory hiding one of the same name in a later one, drop-ins
// in file-name order.
package hazard

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"iter"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SearchDirs are networkd's configuration directories, highest priority
// first: a file in one hides a file of the same name in the later ones.
var SearchDirs = []string{"/etc/systemd", "/run/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd"}

// Paths says where to read; Root "" is the node's own filesystem, tests
// point it at a fixture tree.
type Paths struct {
	Root string
	// Proc is scanned for a running systemd-networkd ("" is Root/proc).
	Proc string
}

func (p Paths) path(elem ...string) string {
	return filepath.Join(append([]string{p.Root, "/"}, elem...)...)
}

// Link is one of nodeagent's links, as networkd's [Match] sees it.
type Link struct {
	Name string
	// Kind is the netdev kind: vlan, macvlan, wireguard.
	Kind string
	// MAC is its hardware address (a VLAN's is its parent's); nil when
	// not known.
	MAC net.HardwareAddr
}

// Hazard is one thing found, with what to do about it.
type Hazard struct {
	// Source is the file or the service it comes from.
	Source string
	// Setting is the networkd.conf key for a setting's hazard, "" for a
	// file that matches a link.
	Setting string
	// What happens to nodeagent's objects.
	What string
	// Fix is the change that removes it.
	Fix string
	// Kinds are the kinds of object it deletes or rewrites (the drift
	// kinds: link, address, route, rule), so that a repair of one of
	// them can be put down to it.
	Kinds []string
}

func (h Hazard) String() string { return h.Source + ": " + h.What + "; " + h.Fix }

// maxFile bounds what is read of one configuration file.
const maxFile = 1 << 20

// foreignSettings are networkd.conf's settings that delete what networkd
// did not make, all on by default.
var foreignSettings = []struct {
	key, what string
	kinds     []string
}{
	{"ManageForeignRoutingPolicyRules", "deletes every routing rule it did not make (nodeagent's policy rules, the kill switch's) whenever it configures a link it manages", []string{"rule"}},
	{"ManageForeignRoutes", "deletes routes it did not make (the kill-switch table's unreachable default among them) whenever it configures a link it manages", []string{"route"}},
}

// Networkd reports the hazards of a running systemd-networkd for links:
// each networkd.conf setting that deletes foreign routing (read from the
// main file and its drop-ins across the search path), and each .network
// file that matches one of links.
func Networkd(p Paths, links []Link) []Hazard {
	proc := p.Proc
	if proc == "" {
		proc = p.path("proc")
	}
	if !running(proc, "systemd-network") {
		return nil
	}
	var out []Hazard
	settings, sources := p.networkdConf()
	for _, s := range foreignSettings {
		v, set := settings[s.key]
		if set && !isTrue(v) {
			continue
		}
		src := "systemd-networkd (default)"
		if set {
			src = sources[s.key]
		}
		out = append(out, Hazard{Source: src, Setting: s.key, What: fmt.Sprintf("%s=yes %s", s.key, s.what),
			Fix:   fmt.Sprintf("set %s=no under [Network] in /etc/systemd/networkd.conf.d/nodeagent.conf, then systemctl restart systemd-networkd", s.key),
			Kinds: s.kinds})
	}
	for _, l := range links {
		if f, why := p.matchingNetwork(l); f != "" {
			out = append(out, Hazard{Source: f, What: fmt.Sprintf("its [Match] (%s) catches nodeagent's link %s, which networkd then configures as its own", why, l.Name),
				Fix:   fmt.Sprintf("narrow the match so that it leaves %s alone (Name=!%s, or a name glob that does not cover it)", l.Name, l.Name),
				Kinds: []string{"link", "address", "route"}})
		}
	}
	return out
}

// networkdConf is the [Network] section of networkd.conf as networkd reads
// it: the main file (the first of the search path that has one), then the
// drop-ins of every networkd.conf.d in file-name order. sources says which
// file set each key last.
func (p Paths) networkdConf() (settings, sources map[string]string) {
	settings, sources = map[string]string{}, map[string]string{}
	for _, d := range SearchDirs {
		f := p.path(d, "networkd.conf")
		if b, ok := readFile(f); ok {
			parseSection(b, "Network", f, settings, sources)
			break
		}
	}
	for _, f := range p.ordered("networkd.conf.d", ".conf") {
		if b, ok := readFile(f); ok {
			parseSection(b, "Network", f, settings, sources)
		}
	}
	return settings, sources
}

// ordered lists the files ending in suffix of sub across the search path,
// one per name (the earliest directory's), in file-name order. A file
// that is empty or a link to /dev/null masks the name.
func (p Paths) ordered(sub, suffix string) []string {
	byName := map[string]string{}
	for _, d := range SearchDirs {
		dir := p.path(d, sub)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), suffix) {
				continue
			}
			if _, seen := byName[e.Name()]; !seen {
				byName[e.Name()] = filepath.Join(dir, e.Name())
			}
		}
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		f := byName[name]
		if t, err := os.Readlink(f); err == nil && t == "/dev/null" {
			continue
		}
		out = append(out, f)
	}
	return out
}

// matchingNetwork is the .network file networkd applies to l (the first
// in file-name order whose [Match] matches it), and which keys matched;
// "" when none does.
func (p Paths) matchingNetwork(l Link) (file, why string) {
	for _, f := range p.ordered("network", ".network") {
		b, ok := readFile(f)
		if !ok {
			continue
		}
		if ok, why := matches(b, l); ok {
			return f, why
		}
	}
	return "", ""
}

// matches applies a .network file's [Match] sections (merged, as networkd
// merges them) to l. A key that tests a property nodeagent's links lack or
// that cannot be known here (Path=, Driver=, Property=) does not match: no
// hazard is claimed that networkd would not act on.
func matches(b []byte, l Link) (bool, string) {
	keys := map[string][]string{}
	sawMatch := false
	section := ""
	for line := range lines(b) {
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
			sawMatch = sawMatch || section == "Match"
			continue
		}
		if section != "Match" {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if v == "" {
				delete(keys, k) // an empty assignment resets the list
				continue
			}
			keys[k] = append(keys[k], strings.Fields(v)...)
		}
	}
	if !sawMatch {
		return false, ""
	}
	var why []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		vals := keys[k]
		var ok bool
		switch k {
		case "Name", "OriginalName":
			ok = globList(vals, l.Name)
		case "Kind":
			ok = globList(vals, l.Kind)
		case "Type":
			ok = globList(vals, linkType(l.Kind))
		case "MACAddress", "PermanentMACAddress":
			ok = l.MAC != nil && macList(vals, l.MAC)
		default:
			return false, ""
		}
		if !ok {
			return false, ""
		}
		why = append(why, k+"="+strings.Join(vals, " "))
	}
	if len(why) == 0 {
		return true, "an empty [Match], which matches every link"
	}
	return true, strings.Join(why, ", ")
}

// linkType is networkd's Type= of a link of that kind (from its ARPHRD):
// VLANs and macvlans are ether, WireGuard none.
func linkType(kind string) string {
	if kind == "wireguard" {
		return "none"
	}
	return "ether"
}

// globList applies a [Match] list: any glob matches, or, for a list whose
// first entry starts with "!", none does.
func globList(globs []string, s string) bool {
	invert := len(globs) > 0 && strings.HasPrefix(globs[0], "!")
	any := false
	for i, g := range globs {
		if i == 0 && invert {
			g = g[1:]
		}
		if ok, err := filepath.Match(g, s); err == nil && ok {
			any = true
		}
	}
	return any != invert
}

func macList(vals []string, mac net.HardwareAddr) bool {
	for _, v := range vals {
		if m, err := net.ParseMAC(v); err == nil && bytes.Equal(m, mac) {
			return true
		}
	}
	return false
}

// parseSection reads the key=value lines of one section of an INI file.
func parseSection(b []byte, want, file string, into, sources map[string]string) {
	section := ""
	for line := range lines(b) {
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
			continue
		}
		if section != want {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			k = strings.TrimSpace(k)
			into[k], sources[k] = strings.TrimSpace(v), file
		}
	}
}

// lines yields the non-blank, non-comment lines of an INI file, trimmed.
func lines(b []byte) iter.Seq[string] {
	return func(yield func(string) bool) {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 0, 4096), maxFile)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || line[0] == '#' || line[0] == ';' {
				continue
			}
			if !yield(line) {
				return
			}
		}
	}
}

// readFile reads at most maxFile bytes of a regular file (following
// links, as networkd does); false for anything else.
func readFile(path string) ([]byte, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile))
	return b, err == nil
}

func isTrue(v string) bool {
	switch strings.ToLower(v) {
	case "1", "yes", "y", "true", "t", "on":
		return true
	}
	return false
}

// running reports whether a process of that comm exists (comm is cut to
// 15 bytes: systemd-networkd is "systemd-network").
func running(proc, comm string) bool {
	comms, _ := filepath.Glob(filepath.Join(proc, "[0-9]*", "comm"))
	for _, c := range comms {
		if b, err := os.ReadFile(c); err == nil && strings.TrimSpace(string(b)) == comm {
			return true
		}
	}
	return false
}

// WatchDirs are the directories whose changes can change what Networkd
// finds: each search directory (where networkd.conf lives) and its
// network and networkd.conf.d. A watcher watches those that exist and
// finds the others at its next periodic look.
func (p Paths) WatchDirs() []string {
	var out []string
	for _, d := range SearchDirs {
		out = append(out, p.path(d), p.path(d, "network"), p.path(d, "networkd.conf.d"))
	}
	return out
}
