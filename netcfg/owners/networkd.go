package owners

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// networkd finds the .netdev files that create the links and the .network
// files that configure them, in /etc/systemd/network (the operator's
// directory; netplan's are in /run and come from its YAML).
func (r *reader) networkd() {
	dir := filepath.Join(r.etc, "systemd", "network")
	for _, f := range r.list(dir, ".netdev", ".network") {
		b, ok := r.read(f)
		if !ok {
			continue
		}
		ini := parseINI(b)
		if strings.HasSuffix(f, ".netdev") {
			name := ini.last("NetDev", "Name")
			if r.links[name] {
				r.out = append(r.out, Owner{Kind: Networkd, Link: name, File: r.nodePath(f), Makes: true,
					Role: fmt.Sprintf("the .netdev that creates %s (Kind=%s)", name, ini.last("NetDev", "Kind"))})
			}
			continue
		}
		// A .network for the link itself: removed when its [Match] names
		// that link alone; one that matches others as well is named, and
		// narrowing it is left to the operator.
		names := ini.all("Match", "Name")
		for l := range r.links {
			if !matchNames(names, l) {
				continue
			}
			o := Owner{Kind: Networkd, Link: l, File: r.nodePath(f), Role: fmt.Sprintf("the .network that configures %s", l)}
			if len(names) != 1 || names[0] != l || len(ini.all("Match", "")) > 1 {
				// It matches other links too: not ours to remove.
				o.Manual = true
				o.Role = fmt.Sprintf("its [Match] (Name= on line %d) matches %s and more: narrow it so that it no longer matches %s", ini.line("Match", "Name"), l, l)
			}
			r.out = append(r.out, o)
		}
		// The parent's VLAN=, MACVLAN= lines that attach the link.
		for _, kv := range ini.entries("Network") {
			switch kv.key {
			case "VLAN", "MACVLAN", "IPVLAN", "MACVTAP":
			default:
				continue
			}
			for _, l := range strings.Fields(kv.val) {
				if r.links[l] {
					r.out = append(r.out, Owner{Kind: Networkd, Link: l, File: r.nodePath(f), First: kv.line, Last: kv.line,
						Role: fmt.Sprintf("the parent's %s=%s line, which makes networkd create %s with its .netdev", kv.key, l, l)})
				}
			}
		}
	}
}

// matchNames reports whether a [Match] Name= list (globs, space
// separated; several lines add up) matches name.
func matchNames(vals []string, name string) bool {
	for _, v := range vals {
		for _, g := range strings.Fields(v) {
			if ok, _ := path.Match(g, name); ok {
				return true
			}
		}
	}
	return false
}

// iniEntry is one Key=Value line of a section.
type iniEntry struct {
	section, key, val string
	line              int
}

type iniFile []iniEntry

// parseINI reads a systemd or NetworkManager keyfile: [Section] headers,
// Key=Value lines, '#' and ';' comments.
func parseINI(b []byte) iniFile {
	var out iniFile
	section := ""
	for i, raw := range strings.Split(string(b), "\n") {
		s := strings.TrimSpace(raw)
		switch {
		case s == "" || s[0] == '#' || s[0] == ';':
			continue
		case s[0] == '[' && strings.HasSuffix(s, "]"):
			section = strings.TrimSpace(s[1 : len(s)-1])
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			continue
		}
		out = append(out, iniEntry{section, strings.TrimSpace(k), strings.TrimSpace(v), i + 1})
	}
	return out
}

// entries are the section's lines, in order.
func (f iniFile) entries(section string) []iniEntry {
	var out []iniEntry
	for _, e := range f {
		if e.section == section {
			out = append(out, e)
		}
	}
	return out
}

// all are the values of key in section ("" key: every key's).
func (f iniFile) all(section, key string) []string {
	var out []string
	for _, e := range f.entries(section) {
		if key == "" || e.key == key {
			out = append(out, e.val)
		}
	}
	return out
}

// last is key's last value in section ("" when absent).
func (f iniFile) last(section, key string) string {
	v := f.all(section, key)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// line is the line of key's last value in section, 0 when absent.
func (f iniFile) line(section, key string) int {
	n := 0
	for _, e := range f.entries(section) {
		if e.key == key {
			n = e.line
		}
	}
	return n
}
