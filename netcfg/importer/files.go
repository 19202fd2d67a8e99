package importer

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/nodeagent/nodeagent/netcfg/owners"
)

// maxFile bounds every file read from /etc: a wg-quick file of thousands
// of peers is a few hundred KiB.
const maxFile = 4 << 20

// fileRules are how a file under /etc is read: not through a link, a
// regular file, at most maxFile bytes.
var fileRules = fsafe.Rules{MaxSize: maxFile}

// maxDirEntries bounds the entries looked at in one directory.
const maxDirEntries = 10000

// ReadFiles fills the file part of s (TableNames, WGQuick, WGQuickUnits,
// Units) from the directory etc, which stands for /etc. What cannot be
// read is added to s.Problems; a missing file or directory is no problem.
func ReadFiles(etc string, s *Snapshot) {
	names, from := map[int]string{}, map[int]string{}
	readTables(etc, filepath.Join(etc, "iproute2", "rt_tables"), names, from, s)
	for _, f := range listDir(filepath.Join(etc, "iproute2", "rt_tables.d"), ".conf", s, true) {
		readTables(etc, f, names, from, s)
	}
	if len(names) > 0 {
		s.TableNames, s.TableNameFiles = names, from
	}
	for _, f := range listDir(filepath.Join(etc, "wireguard"), ".conf", s, true) {
		data, err := fsafe.ReadFile(f, fileRules)
		if err != nil {
			s.Problems = append(s.Problems, problem(err))
			continue
		}
		w := ParseWGQuick(strings.TrimSuffix(filepath.Base(f), ".conf"), data)
		for _, p := range w.Problems {
			s.Problems = append(s.Problems, f+": "+p)
		}
		w.Problems = nil
		s.WGQuick = append(s.WGQuick, w)
	}
	wants := filepath.Join(etc, "systemd", "system", "multi-user.target.wants")
	for _, e := range readDirNames(wants, s) {
		if name, ok := strings.CutPrefix(e, "wg-quick@"); ok {
			if name, ok = strings.CutSuffix(name, ".service"); ok && name != "" {
				s.WGQuickUnits = append(s.WGQuickUnits, name)
			}
		}
	}
	// The network configuration files that make the links nodeagent may
	// import (their owners, retired by the switch-over's steps).
	var links []string
	for _, l := range s.Links {
		if l.Kind == "vlan" || l.Kind == "macvlan" || l.Kind == "wireguard" {
			links = append(links, l.Name)
		}
	}
	for _, w := range s.WGQuick {
		links = append(links, w.Name)
	}
	own, problems := owners.Read(etc, links)
	s.Owners = append(s.Owners, own...)
	s.Problems = append(s.Problems, problems...)
	for _, f := range listDir(filepath.Join(etc, "systemd", "system"), ".service", s, false) {
		data, err := fsafe.ReadFile(f, fileRules)
		if err != nil {
			s.Problems = append(s.Problems, problem(err))
			continue
		}
		if links := unitLinks(string(data)); len(links) > 0 {
			s.Units = append(s.Units, Unit{Name: filepath.Base(f), Links: links})
		}
		if p, ok := piaUnit(etc, filepath.Base(f), string(data), s); ok {
			if s.PIA == nil {
				s.PIA = &PIAScripts{}
			}
			s.PIA.merge(p)
		}
	}
}

// piaUnit reads a unit that runs PIA's manual-connections scripts: its
// name, and the region and account its Environment= lines or its
// EnvironmentFile= (read like any file under /etc) give them.
func piaUnit(etc, name, text string, s *Snapshot) (PIAScripts, bool) {
	var p PIAScripts
	env := map[string]string{}
	runs := false
	for line := range strings.SplitSeq(text, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		key = strings.TrimSpace(key)
		switch {
		case strings.HasPrefix(key, "Exec"):
			for _, sc := range piaScripts {
				runs = runs || strings.Contains(val, sc)
			}
		case key == "Environment":
			for _, kv := range strings.Fields(strings.NewReplacer("\"", " ").Replace(val)) {
				if k, v, ok := strings.Cut(kv, "="); ok && slices.Contains(piaEnv, k) {
					env[k] = v
				}
			}
		case key == "EnvironmentFile":
			path := strings.TrimPrefix(strings.TrimSpace(val), "-")
			if rel, ok := strings.CutPrefix(path, "/etc/"); ok {
				path = filepath.Join(etc, rel)
			}
			data, err := fsafe.ReadFile(path, fileRules)
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					s.Problems = append(s.Problems, problem(err))
				}
				continue
			}
			for l := range strings.SplitSeq(string(data), "\n") {
				k, v, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "export ")), "=")
				if ok && slices.Contains(piaEnv, k) {
					env[k] = strings.Trim(v, "\"'")
				}
			}
		}
	}
	if !runs {
		return p, false
	}
	p.Units = []string{name}
	p.setEnv(env)
	return p, true
}

// problem is err as one line: fsafe's errors name the file and the reason
// and never what it holds.
func problem(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// dirEntries lists dir's entries, sorted; a missing dir is empty, and
// any other failure is a problem of s.
func dirEntries(dir string, s *Snapshot) []fs.DirEntry {
	d, err := fsafe.OpenDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.Problems = append(s.Problems, problem(err))
		}
		return nil
	}
	defer d.Close()
	entries, err := d.ReadDir()
	if err != nil {
		s.Problems = append(s.Problems, fmt.Sprintf("%s: cannot list: %v", dir, err))
		return nil
	}
	return entries
}

// readDirNames lists dir's entry names, sorted; a missing dir is empty.
func readDirNames(dir string, s *Snapshot) []string {
	entries := dirEntries(dir, s)
	var out []string
	for _, e := range entries {
		if len(out) == maxDirEntries {
			s.Problems = append(s.Problems, fmt.Sprintf("%s: more than %d entries; the rest are not read", dir, maxDirEntries))
			break
		}
		out = append(out, e.Name())
	}
	return out
}

// listDir returns the paths of dir's regular files (not links) ending in
// ext, sorted by name, dotfiles left out; with sayLinks, a link ending in
// ext is named in s.Problems.
func listDir(dir, ext string, s *Snapshot, sayLinks bool) []string {
	entries := dirEntries(dir, s)
	var out []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ext) {
			continue
		}
		if !e.Type().IsRegular() {
			if sayLinks && e.Type()&fs.ModeSymlink != 0 {
				s.Problems = append(s.Problems, filepath.Join(dir, n)+" is a symbolic link, which is not followed; import from a copy (--etc)")
			}
			continue
		}
		if len(out) == maxDirEntries {
			s.Problems = append(s.Problems, fmt.Sprintf("%s: more than %d files; the rest are not read", dir, maxDirEntries))
			break
		}
		out = append(out, filepath.Join(dir, n))
	}
	return out
}

// readTables adds the "ID NAME" lines of an rt_tables file to names; a
// later file's name for an id wins, as ip(8) reads them.
func readTables(etc, path string, names, from map[int]string, s *Snapshot) {
	rel, err := filepath.Rel(etc, path)
	if err != nil {
		rel = path
	}
	data, err := fsafe.ReadFile(path, fileRules)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.Problems = append(s.Problems, problem(err))
		}
		return
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		id, err := strconv.ParseUint(f[0], 0, 32)
		if err != nil {
			continue
		}
		names[int(id)] = f[1]
		from[int(id)] = "/etc/" + filepath.ToSlash(rel)
	}
}

// ParseWGQuick parses a wg-quick file as wg-quick(8) reads it: keys are
// case-insensitive, '#' starts a comment, Address, DNS and AllowedIPs are
// comma lists and may repeat. A comment line just above a [Peer] header is
// that peer's NameHint. Problems name lines by number, never their text.
func ParseWGQuick(name string, data []byte) WGQuickFile {
	w := WGQuickFile{Name: name}
	section := ""
	lastComment := ""
	var peer *WGPeer
	list := func(v string) []string {
		var out []string
		for part := range strings.SplitSeq(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
		return out
	}
	for i, raw := range strings.Split(strings.TrimPrefix(string(data), "\uFEFF"), "\n") {
		ln := i + 1
		// A control character or a Unicode line break inside a value
		// would end a comment line of the output: none reaches it.
		raw = strings.Map(func(r rune) rune {
			if r != '\t' && (unicode.IsControl(r) || r == '\u2028' || r == '\u2029') {
				return ' '
			}
			return r
		}, raw)
		trimmed := strings.TrimSpace(raw)
		if c, ok := strings.CutPrefix(trimmed, "#"); ok {
			lastComment = strings.TrimSpace(strings.TrimLeft(c, "#"))
			continue
		}
		s := trimmed
		if section != "interface" || !isHookLine(s) {
			// Hook commands keep their '#' (a shell comment there is the
			// shell's business); elsewhere it starts a comment.
			s, _, _ = strings.Cut(s, "#")
			s = strings.TrimSpace(s)
		}
		if s == "" {
			lastComment = ""
			continue
		}
		if strings.HasPrefix(s, "[") {
			switch strings.ToLower(strings.TrimSpace(strings.Trim(s, "[]"))) {
			case "interface":
				section = "interface"
			case "peer":
				section = "peer"
				w.Peers = append(w.Peers, WGPeer{NameHint: lastComment})
				peer = &w.Peers[len(w.Peers)-1]
			default:
				section = "?"
				w.Problems = append(w.Problems, fmt.Sprintf("line %d: unknown section", ln))
			}
			lastComment = ""
			continue
		}
		lastComment = ""
		key, val, ok := strings.Cut(s, "=")
		if !ok {
			w.Problems = append(w.Problems, fmt.Sprintf("line %d: not Key = Value (the line is not shown)", ln))
			continue
		}
		key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
		switch section {
		case "interface":
			switch key {
			case "privatekey":
				w.PrivateKey = val
			case "address":
				w.Addresses = append(w.Addresses, list(val)...)
			case "dns":
				w.DNS = append(w.DNS, list(val)...)
			case "table":
				w.Table = val
			case "mtu":
				w.MTU, _ = strconv.Atoi(val)
			case "listenport":
				w.ListenPort, _ = strconv.Atoi(val)
			case "fwmark":
				w.FwMark = val
			case "saveconfig":
				w.SaveConfig = strings.EqualFold(val, "true")
			case "preup", "postup", "predown", "postdown":
				w.Hooks = append(w.Hooks, Hook{When: hookName[key], Command: val})
			default:
				w.Problems = append(w.Problems, fmt.Sprintf("line %d: unknown key in [Interface]", ln))
			}
		case "peer":
			switch key {
			case "publickey":
				peer.PublicKey = val
			case "presharedkey":
				peer.PresharedKey = val
			case "endpoint":
				peer.Endpoint = val
			case "allowedips":
				peer.AllowedIPs = append(peer.AllowedIPs, list(val)...)
			case "persistentkeepalive":
				if !strings.EqualFold(val, "off") {
					peer.PersistentKeepalive, _ = strconv.Atoi(val)
				}
			default:
				w.Problems = append(w.Problems, fmt.Sprintf("line %d: unknown key in [Peer]", ln))
			}
		case "":
			w.Problems = append(w.Problems, fmt.Sprintf("line %d: outside a section", ln))
		}
	}
	return w
}

var hookName = map[string]string{"preup": "PreUp", "postup": "PostUp", "predown": "PreDown", "postdown": "PostDown"}

func isHookLine(s string) bool {
	key, _, ok := strings.Cut(s, "=")
	_, hook := hookName[strings.ToLower(strings.TrimSpace(key))]
	return ok && hook
}

// unitLinks returns the links a unit's Exec lines make with ip link add,
// sorted and each once.
func unitLinks(text string) []string {
	var out []string
	for line := range strings.SplitSeq(text, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || !strings.HasPrefix(strings.TrimSpace(key), "Exec") {
			continue
		}
		out = append(out, ipLinkAdds(val)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ipLinkAdds finds each "ip [OPTIONS] link add ..." in a command line
// (also inside sh -c '...' and after ; or &&) and returns the names of the
// links they make.
func ipLinkAdds(cmd string) []string {
	cmd = strings.NewReplacer("'", " ", "\"", " ", ";", " ; ", "&&", " ; ", "||", " ; ").Replace(cmd)
	f := strings.Fields(cmd)
	var out []string
	for i := 0; i < len(f); i++ {
		if filepath.Base(strings.TrimLeft(f[i], "-+!@:")) != "ip" {
			continue
		}
		j := i + 1
		for j < len(f) && strings.HasPrefix(f[j], "-") {
			j++
		}
		if j+1 >= len(f) || (f[j] != "link" && f[j] != "l") || (f[j+1] != "add" && f[j+1] != "a") {
			continue
		}
		name := ""
	args:
		for k := j + 2; k < len(f); k++ {
			switch f[k] {
			case ";", "type":
				break args
			case "link":
				k++
			case "name", "dev":
				if k+1 < len(f) {
					name = f[k+1]
				}
				k++
			default:
				if name == "" {
					name = f[k]
				}
			}
		}
		if name != "" {
			out = append(out, name)
		}
	}
	return out
}
