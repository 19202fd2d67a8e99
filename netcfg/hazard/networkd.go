// Package hazard finds what on this node will undo nodeagent's work: the
// network software beside it, configured the way it ships. Each hazard
// names its source and the fix.
//
//   - systemd-networkd (networkd.go): with its defaults it deletes every
//     routing rule and route it did not make whenever it configures a link
//     it manages, and a .network file whose [Match] catches one of
//     nodeagent's links makes that link networkd's.
//   - udev (udev.go): a .link file that catches one of nodeagent's links
//     renames it, or overwrites its alias (nodeagent's ownership mark) or
//     its address, when the link appears.
//   - ifupdown (ifupdown.go): a stanza for one of nodeagent's links, or
//     for a parent whose down deletes it, brings it up at boot as
//     ifupdown's and deletes it at ifdown and `systemctl restart
//     networking`.
//
// The reading is the programs' own, derived from their source at the
// versions Debian and Ubuntu ship (systemd 252, 255, 256 and later;
// ifupdown 0.8): the same search paths per version, precedence by file
// name, drop-ins, the [Match] semantics of shared/net-condition.c (a
// line's leading '!' negates its words, any negative hit rejects, one
// positive must match), conditions (Host=, Virtualization=, ...), empty
// [Match] sections ignored, systemd's boolean parsing and file syntax.
package hazard

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// Hazard is one thing found, with what to do about it.
type Hazard struct {
	// Source is the file (with its line, where one line says it) or the
	// service it comes from.
	Source string
	// Manager is the program that acts: systemd-networkd, udev, ifupdown,
	// NetworkManager.
	Manager string
	// Setting is the networkd.conf key for a setting's hazard, "" for a
	// file that matches a link.
	Setting string
	// Link is the link of nodeagent's it concerns, "" for a setting.
	Link string
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
// each networkd.conf setting that deletes foreign routing, and, for each
// link, the .network file networkd applies to it unless that file says
// Unmanaged=yes.
func Networkd(p Paths, s System, links []Link) []Hazard {
	if !s.Networkd {
		return nil
	}
	var out []Hazard
	settings, sources := p.networkdConf(s)
	for _, f := range foreignSettings {
		if !settings[f.key] {
			continue
		}
		src, set := sources[f.key]
		if !set {
			src = "systemd-networkd (default)"
		}
		out = append(out, Hazard{Source: src, Manager: "systemd-networkd", Setting: f.key,
			What:  fmt.Sprintf("%s=yes %s", f.key, f.what),
			Fix:   fmt.Sprintf("set %s=no under [Network] in /etc/systemd/networkd.conf.d/nodeagent.conf, then systemctl restart systemd-networkd", f.key),
			Kinds: f.kinds})
	}
	nets, unknown := p.loadNetworks(s)
	for _, f := range unknown {
		out = append(out, Hazard{Source: f, Manager: "systemd-networkd",
			What:  "networkd reads this file and nodeagent may not (another user's, and nodeagent runs without CAP_DAC_OVERRIDE), so whether its [Match] catches nodeagent's links is not known",
			Fix:   "make it readable by root (its owner root, or mode o+r), or leave nodeagent's links alone with a file of [Link] Unmanaged=yes that sorts before it",
			Kinds: []string{"link", "address", "route"}})
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Name)
	}
	for _, l := range links {
		n := networkFor(nets, l, s)
		if n == nil || n.unmanaged {
			continue
		}
		out = append(out, Hazard{Source: n.source(), Manager: "systemd-networkd", Link: l.Name,
			What:  fmt.Sprintf("its [Match] (%s) catches nodeagent's link %s, which networkd then configures as its own", n.match.describe(), l.Name),
			Fix:   unmanagedFix(n.file, l, names),
			Kinds: []string{"link", "address", "route"}})
	}
	return out
}

// NetworkdVerdict is what networkd does with l: the .network file it
// applies ("" for none) and whether that file leaves it unmanaged. It is
// what `networkctl list` shows for the link (unmanaged, or configured by
// the file), for the tests that ask networkd itself.
func NetworkdVerdict(p Paths, s System, l Link) (file string, unmanaged bool) {
	nets, _ := p.loadNetworks(s)
	n := networkFor(nets, l, s)
	if n == nil {
		return "", true
	}
	return n.file, n.unmanaged
}

// unmanagedFix is the fix for a .network file that catches l: first
// networkd's own answer for a link that another program controls, a file
// that sorts before the catching one and says Unmanaged=yes for all of
// nodeagent's links; else a narrower match, which must negate the link's
// alternative names too (Name= passes a link when its name or any
// alternative name passes).
func unmanagedFix(file string, l Link, all []string) string {
	name := "00-nodeagent.network"
	base := filepath.Base(file)
	for _, n := range []string{"00-nodeagent.network", "0-nodeagent.network", "-nodeagent.network"} {
		if n < base {
			name = n
			break
		}
	}
	names := strings.Join(append([]string{l.Name}, l.AltNames...), " ")
	return fmt.Sprintf("write /etc/systemd/network/%s with [Match] Name=%s and [Link] Unmanaged=yes (it must sort before %s; the first matching file wins), then networkctl reload; or narrow the match so that it leaves %s alone (a line Name=!%s in its [Match])",
		name, strings.Join(all, " "), base, l.Name, names)
}

// network is one .network file networkd loaded.
type network struct {
	file, dropIn string
	match        *netMatch
	unmanaged    bool
}

// source names the file, and the drop-in that set Unmanaged= or the match
// when one did.
func (n *network) source() string {
	if n.dropIn != "" {
		return n.file + " (with " + n.dropIn + ")"
	}
	return n.file
}

// networkFor is link_get_network(): the first loaded file, in file-name
// order, whose [Match] matches l.
func networkFor(nets []network, l Link, s System) *network {
	for i := range nets {
		if nets[i].match.test(l, s.Udev, true) {
			return &nets[i]
		}
	}
	return nil
}

// loadNetworks is network_load(): every .network file of the search path
// in file-name order, each with its drop-ins (NAME.network.d/*.conf),
// read as networkd's user; a file is left out where network_load_one()
// leaves it out: empty or /dev/null, unreadable, refused by the parser,
// with an empty [Match] and no condition ("No valid settings found in the
// [Match] section, ignoring file"), or with a condition that does not
// hold on this node. unknown are the files networkd reads and nodeagent
// cannot.
func (p Paths) loadNetworks(s System) (nets []network, unknown []string) {
	dirs := networkDirs(s.Version)
	r := s.networkdReader()
	for _, f := range p.listConf(dirs, "", ".network") {
		stem := strings.TrimSuffix(filepath.Base(f), ".network")
		dropIns := p.dropIns(dirs, "", stem+".network.d")
		as, st := parseMany(append([]string{f}, dropIns...), r)
		if st == fileUnknown {
			unknown = append(unknown, f)
		}
		if st != fileOK {
			continue
		}
		m := parseMatch(as, "Name", false)
		if m.empty() && len(m.conditions) == 0 {
			continue
		}
		if !conditionsHold(m.conditions, s, p, "run/credentials/systemd-networkd.service") {
			continue
		}
		n := network{file: f, match: m}
		for _, a := range as {
			if a.section == "Link" && a.key == "Unmanaged" {
				if b, ok := parseBoolean(a.value); ok {
					n.unmanaged = b
					if a.file != f {
						n.dropIn = a.file
					}
				}
			}
		}
		if n.dropIn == "" {
			for _, a := range as {
				if a.section == "Match" && a.file != f {
					n.dropIn = a.file
				}
			}
		}
		nets = append(nets, n)
	}
	return nets, unknown
}

// networkDirs are the directories of .network and .link files
// (NETWORK_DIRS: CONF_PATHS("systemd/network")).
func networkDirs(v int) []string {
	var out []string
	for _, d := range confDirs(v) {
		out = append(out, filepath.Join(d, "systemd/network"))
	}
	return out
}

func conditionsHold(cs []condition, s System, p Paths, credDir string) bool {
	for _, c := range cs {
		if !s.holds(c, p, credDir) {
			return false
		}
	}
	return true
}

// networkdConf is the [Network] section of networkd.conf as networkd
// reads it (manager_parse_config_file()): the main file, then the drop-ins
// of every networkd.conf.d in file-name order. Before 256 the main file is
// /etc/systemd/networkd.conf only; from 256 it is the first of the four
// directories' (config_parse_standard_file_with_dropins()). A value that
// is not a boolean leaves the setting as it was (config_parse_bool()).
// sources says which file set each key last.
func (p Paths) networkdConf(s System) (settings map[string]bool, sources map[string]string) {
	settings, sources = map[string]bool{}, map[string]string{}
	for _, f := range foreignSettings {
		settings[f.key] = true
	}
	r := s.networkdReader()
	var mains []string
	if s.Version != 0 && s.Version < 256 {
		mains = []string{"/etc/systemd/networkd.conf"}
	} else {
		for _, d := range confDirs(s.Version) {
			mains = append(mains, filepath.Join(d, "systemd/networkd.conf"))
		}
	}
	var files []string
	for _, m := range mains {
		_, st := readConf(p.path(m), r)
		if st != fileMissing {
			files = append(files, p.path(m))
			break
		}
	}
	var dirs []string
	for _, d := range confDirs(s.Version) {
		dirs = append(dirs, filepath.Join(d, "systemd"))
	}
	files = append(files, p.listConf(dirs, "networkd.conf.d", ".conf")...)
	for _, f := range files {
		b, st := readConf(f, r)
		if st != fileOK {
			continue
		}
		as, err := parseINI(b)
		if err != nil {
			continue
		}
		for _, a := range as {
			if a.section != "Network" {
				continue
			}
			if _, known := settings[a.key]; !known {
				continue
			}
			if b, ok := parseBoolean(a.value); ok {
				settings[a.key], sources[a.key] = b, f
			}
		}
	}
	return settings, sources
}

// WatchDirs are the directories whose changes can change what the
// hazards are: networkd's and udev's search path (networkd.conf and its
// drop-ins, .network and .link files and their drop-in directories),
// and ifupdown's /etc/network. A watcher watches those that exist and
// finds the others at its next periodic look.
func (p Paths) WatchDirs() []string {
	var out []string
	for _, d := range confDirs(0) {
		out = append(out, p.path(d, "systemd"), p.path(d, "systemd/network"), p.path(d, "systemd/networkd.conf.d"))
	}
	out = append(out, p.path("/lib/systemd"), p.path("/lib/systemd/network"))
	out = append(out, p.path("etc/network"), p.path("etc/network/interfaces.d"))
	return slices.Compact(out)
}
