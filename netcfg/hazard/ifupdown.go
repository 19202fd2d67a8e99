package hazard

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// stanza is one `iface` of ifupdown's configuration.
type stanza struct {
	name, family, method string
	file                 string
	line                 int
	options              map[string]string
}

// ifupdownConfig is /etc/network/interfaces as ifupdown 0.8 reads it
// (config.c: read_interfaces_defn()).
type ifupdownConfig struct {
	stanzas []stanza
	// allow are the interfaces of each auto and allow-CLASS line, by
	// class ("auto", "hotplug", ...), with where each was named.
	allow map[string]map[string]string
}

// maxIfupdownFiles bounds the files a `source` tree may name.
const maxIfupdownFiles = 256

// readIfupdown reads /etc/network/interfaces and what it sources: `source
// PATTERN` (a glob, relative to the file's directory) and
// `source-directory DIR` (the files of DIR whose names are letters,
// digits, '_' and '-', in order), each file once. Lines are ifupdown's
// get_line(): leading blanks dropped, '#' lines skipped, a trailing
// backslash joins the next line.
func (p Paths) readIfupdown() *ifupdownConfig {
	c := &ifupdownConfig{allow: map[string]map[string]string{}}
	seen := map[string]bool{}
	var read func(file string)
	read = func(file string) {
		if seen[file] || len(seen) >= maxIfupdownFiles {
			return
		}
		seen[file] = true
		b, st := readConf(p.path(file), asRoot)
		if st != fileOK {
			return
		}
		var cur *stanza
		lines := strings.Split(string(b), "\n")
		for i := 0; i < len(lines); i++ {
			n := i + 1
			line := strings.TrimLeft(lines[i], " \t\r\v\f")
			if strings.HasPrefix(line, "#") {
				continue
			}
			for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
				i++
				line = line[:len(line)-1] + lines[i]
			}
			line = strings.TrimRight(line, " \t\r\v\f")
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			switch {
			case f[0] == "iface":
				if len(f) < 2 {
					cur = nil
					continue
				}
				s := stanza{name: f[1], file: file, line: n, options: map[string]string{}}
				if len(f) > 2 {
					s.family = f[2]
				}
				if len(f) > 3 {
					s.method = f[3]
				}
				c.stanzas = append(c.stanzas, s)
				cur = &c.stanzas[len(c.stanzas)-1]
			case f[0] == "mapping":
				cur = nil
			case f[0] == "source" || strings.HasPrefix(f[0], "source-dir"):
				cur = nil
				rest := strings.TrimSpace(strings.TrimPrefix(line, f[0]))
				pattern := rest
				if !strings.HasPrefix(pattern, "/") {
					pattern = filepath.Join(filepath.Dir(file), pattern)
				}
				matches, _ := filepath.Glob(p.path(pattern))
				for _, m := range matches {
					rel := m
					if p.Root != "" {
						rel = "/" + strings.TrimLeft(strings.TrimPrefix(m, filepath.Clean(p.Root)), "/")
					}
					if f[0] == "source" {
						read(rel)
						continue
					}
					ents, err := os.ReadDir(m)
					if err != nil {
						continue
					}
					for _, e := range ents {
						if ifupdownFileName(e.Name()) {
							read(filepath.Join(rel, e.Name()))
						}
					}
				}
			case f[0] == "auto" || (strings.HasPrefix(f[0], "allow-") && len(f[0]) > 6):
				class := strings.TrimPrefix(f[0], "allow-")
				if c.allow[class] == nil {
					c.allow[class] = map[string]string{}
				}
				names := f[1:]
				if len(names) == 0 && cur != nil {
					names = []string{cur.name}
				}
				for _, name := range names {
					if _, ok := c.allow[class][name]; !ok {
						c.allow[class][name] = fmt.Sprintf("%s:%d", file, n)
					}
				}
				if cur != nil && len(f) > 1 {
					cur = nil
				}
			case f[0] == "no-auto-down" || f[0] == "no-scripts" || f[0] == "rename":
				cur = nil
			default:
				if cur != nil {
					cur.options[f[0]] = strings.TrimSpace(strings.TrimPrefix(line, f[0]))
				}
			}
		}
	}
	read("/etc/network/interfaces")
	return c
}

func ifupdownFileName(n string) bool {
	if n == "" {
		return false
	}
	for _, r := range n {
		if !(r == '_' || r == '-' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')) {
			return false
		}
	}
	return true
}

// deletes reports whether ifdown of s deletes its link, and why: a name
// with a dot is a VLAN ifupdown made (link.defn: ip link del); a
// vlan-raw-device, bridge or bond stanza is a link the vlan,
// bridge-utils or ifenslave hooks made and delete.
func (s stanza) deletes() (bool, string) {
	if strings.Contains(s.name, ".") && !strings.Contains(s.name, ":") {
		return true, "ifdown deletes it (ip link del)"
	}
	for _, o := range []string{"vlan-raw-device", "vlan_raw_device"} {
		if _, ok := s.options[o]; ok {
			return true, "ifdown deletes it (its vlan-raw-device makes it a VLAN of ifupdown's)"
		}
	}
	for _, o := range []string{"bridge_ports", "bridge-ports", "bond-slaves", "bond_slaves", "bond-mode", "bond_mode"} {
		if _, ok := s.options[o]; ok {
			return true, "ifdown deletes it (a bridge or bond of ifupdown's)"
		}
	}
	return false, ""
}

// Ifupdown reports the hazards ifupdown's configuration holds for links:
// a stanza for a link of nodeagent's (ifup creates or configures it as
// ifupdown's; ifdown and `systemctl restart networking` delete it or take
// its addresses; a description sets its alias, nodeagent's mark), and a
// stanza for a link's parent whose ifdown deletes the parent, and with it
// the link.
func Ifupdown(p Paths, s System, links []Link) []Hazard {
	if !s.Ifupdown {
		return nil
	}
	c := p.readIfupdown()
	if len(c.stanzas) == 0 {
		return nil
	}
	var out []Hazard
	ours := map[string]bool{}
	children := map[string][]string{}
	for _, l := range links {
		ours[l.Name] = true
		if l.Parent != "" {
			children[l.Parent] = append(children[l.Parent], l.Name)
		}
	}
	for _, l := range links {
		if s, ok := c.stanza(l.Name); ok {
			var what []string
			if del, why := s.deletes(); del {
				w := "ifup creates it (nodeagent then finds a link it did not make), " + why + " at ifdown and at systemctl stop or restart networking"
				if kids := children[l.Name]; len(kids) > 0 {
					w += ", and the kernel deletes " + strings.Join(kids, " and ") + " with it"
				}
				what = append(what, w)
			} else {
				what = append(what, "ifup configures it as ifupdown's, ifdown (and systemctl stop or restart networking) sets it down and removes its addresses")
			}
			if d := s.options["description"]; d != "" {
				what = append(what, fmt.Sprintf("its description sets the link's alias to %q, overwriting nodeagent's ownership mark", d))
			}
			out = append(out, Hazard{Source: fmt.Sprintf("%s:%d", p.display(s.file), s.line), Manager: "ifupdown", Link: l.Name,
				What:  fmt.Sprintf("a stanza for nodeagent's link %s%s: %s", l.Name, c.when(l.Name), strings.Join(what, "; ")),
				Fix:   fmt.Sprintf("remove the stanza iface %s (%s:%d)%s: nodeagent makes and configures the link", l.Name, p.display(s.file), s.line, c.allowLines(p, l.Name)),
				Kinds: []string{"link", "address", "route"}})
			continue
		}
		// A parent of ours with a stanza is named above, with its
		// children: one cause, one hazard.
		if l.Parent == "" || ours[l.Parent] {
			continue
		}
		s, ok := c.stanza(l.Parent)
		if !ok {
			continue
		}
		if del, why := s.deletes(); del {
			out = append(out, Hazard{Source: fmt.Sprintf("%s:%d", p.display(s.file), s.line), Manager: "ifupdown", Link: l.Name,
				What:  fmt.Sprintf("a stanza for %s, the parent of nodeagent's link %s%s: %s, and the kernel deletes %s with it", l.Parent, l.Name, c.when(l.Parent), why, l.Name),
				Fix:   fmt.Sprintf("leave %s to one manager: remove its stanza (%s:%d) and let nodeagent make it, or do not run ifdown on it", l.Parent, p.display(s.file), s.line),
				Kinds: []string{"link", "address", "route"}})
		}
	}
	return out
}

func (c *ifupdownConfig) stanza(name string) (stanza, bool) {
	for _, s := range c.stanzas {
		if s.name == name {
			return s, true
		}
	}
	return stanza{}, false
}

// when says when ifupdown acts on its own: at boot and at every restart
// of networking.service for an auto or allow-hotplug interface.
func (c *ifupdownConfig) when(name string) string {
	var classes []string
	for class, names := range c.allow {
		if _, ok := names[name]; ok {
			classes = append(classes, class)
		}
	}
	slices.Sort(classes)
	switch {
	case slices.Contains(classes, "auto"):
		return " (auto: at boot and at every systemctl restart networking)"
	case slices.Contains(classes, "hotplug"):
		return " (allow-hotplug: when it appears, and at systemctl restart networking)"
	}
	return " (by hand: ifup and ifdown)"
}

func (c *ifupdownConfig) allowLines(p Paths, name string) string {
	var at []string
	for _, class := range slices.Sorted(maps.Keys(c.allow)) {
		if where, ok := c.allow[class][name]; ok {
			file, line, _ := strings.Cut(where, ":")
			label := "allow-" + class
			if class == "auto" {
				label = "auto"
			}
			at = append(at, fmt.Sprintf(" and %s from its %s line (%s:%s)", name, label, p.display(file), line))
		}
	}
	return strings.Join(at, "")
}

// display is a path as the node names it (without a test's root).
func (p Paths) display(f string) string {
	if p.Root != "" {
		return strings.TrimPrefix(f, p.Root)
	}
	return f
}
