package packaging

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/lint"
	"gopkg.in/yaml.v3"
)

// The docs against the product (issue 45, acceptance 6): every nodeagent
// config in the README, the man pages, the examples and the packaged
// config (commented sketches uncommented, one at a time) parses strictly
// against the real schema and validates; every config key named in prose
// exists in the schema; every path under nodeagent's directories that the
// docs name is shipped by the package, created by it, written by a
// documented command, or in the commented allow-list below; every peersDir
// is one the unit lets the daemon write; the walkthrough's config names
// only files the walkthrough makes; and the README's marked blocks are
// what the walkthrough and uninstall tests can run as written.

// docSources are the files checked, relative to the repository root.
func docSources(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, g := range []string{"README.md", "docs/*.md", "docs/*.[158]", "examples/*",
		"packaging/etc/nodeagent.yaml", "packaging/etc/default/nodeagent",
		"packaging/examples/*/*", "packaging/monitoring/*.yml", "packaging/monitoring/*.yaml",
		"systemd/*.service", "systemd/*/*"} {
		m, err := filepath.Glob(filepath.Join("..", g))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			out = append(out, strings.TrimPrefix(f, "../"))
		}
	}
	sort.Strings(out)
	return out
}

// docSet is the checked files' text by name; roff is already plain text.
type docSet map[string]string

func loadDocs(t *testing.T) docSet {
	t.Helper()
	d := docSet{}
	for _, f := range docSources(t) {
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		d[f] = string(b)
	}
	if _, ok := d["README.md"]; !ok {
		t.Fatal("no README.md")
	}
	return d
}

func (d docSet) clone() docSet {
	c := docSet{}
	for k, v := range d {
		c[k] = v
	}
	return c
}

func isRoff(name string) bool { return regexp.MustCompile(`^docs/.*\.[158]$`).MatchString(name) }

// pkg is what the package ships and how the unit confines the daemon.
type pkg struct {
	files    map[string]bool        // dst of every file and symlink
	dirs     map[string]os.FileMode // dirs it creates (mode), and every parent of a file
	rwPaths  []string               // the unit's ReadWritePaths, "-" dropped
	unitText string
}

func loadPkg(t *testing.T) pkg {
	t.Helper()
	var nf struct {
		Contents []struct {
			Src, Dst, Type string
			FileInfo       struct {
				Mode int
			} `yaml:"file_info"`
		}
	}
	if err := yaml.Unmarshal(mustRead(t, "nfpm.yaml"), &nf); err != nil {
		t.Fatalf("nfpm.yaml: %v", err)
	}
	p := pkg{files: map[string]bool{}, dirs: map[string]os.FileMode{}}
	for _, c := range nf.Contents {
		if c.Type == "dir" {
			p.dirs[c.Dst] = os.FileMode(c.FileInfo.Mode)
			continue
		}
		if c.Src != "" && !strings.HasPrefix(c.Src, "dist/") {
			if _, err := os.Stat(filepath.Join("..", c.Src)); err != nil {
				t.Errorf("nfpm.yaml ships %s from %s, which does not exist", c.Dst, c.Src)
			}
		}
		p.files[c.Dst] = true
		for dir := path.Dir(c.Dst); dir != "/"; dir = path.Dir(dir) {
			if _, ok := p.dirs[dir]; !ok {
				p.dirs[dir] = 0
			}
		}
	}
	p.unitText = string(mustRead(t, "../systemd/nodeagent.service"))
	for _, l := range strings.Split(p.unitText, "\n") {
		if v, ok := strings.CutPrefix(l, "ReadWritePaths="); ok {
			for _, f := range strings.Fields(v) {
				p.rwPaths = append(p.rwPaths, strings.TrimPrefix(f, "-"))
			}
		}
	}
	if len(p.rwPaths) == 0 {
		t.Fatal("nodeagent.service has no ReadWritePaths")
	}
	return p
}

// allowed are paths the docs may name that the package neither ships nor
// makes and no documented command writes, each with why it exists. A
// pattern's evidence is a file (relative to the repository root) that
// must hold the string, so an entry cannot outlive what it stands for.
var allowed = []struct{ pattern, why, file, evidence string }{
	// The daemon's runtime directory (the unit's RuntimeDirectory=) and
	// what it makes there.
	{"/run/nodeagent", "the unit's RuntimeDirectory", "systemd/nodeagent.service", "RuntimeDirectory=nodeagent"},
	{"/run/nodeagent/nodeagent.sock", "the API socket the daemon makes", "agent/api/api.go", `DefaultSocket = "/run/nodeagent/nodeagent.sock"`},
	{"/run/nodeagent/nodeagent.lock", "the lock run, apply --once and teardown hold", "agent/lock.go", `DefaultLock = "/run/nodeagent/nodeagent.lock"`},
	{"/run/nodeagent/pia", "where the daemon writes each PIA device's forwarded port", "agent/pia.go", `filepath.Join(filepath.Dir(d.o.Socket), "pia")`},
	{"/run/nodeagent/pia/*.port", "a PIA device's forwarded port, written by the daemon", "agent/portfwd/files.go", `FileExt = ".port"`},
	// The state directory (the unit's StateDirectory=) and its files.
	{"/var/lib/nodeagent", "the unit's StateDirectory", "systemd/nodeagent.service", "StateDirectory=nodeagent"},
	{"/var/lib/nodeagent/pia", "the PIA providers' state", "netcfg/wg/pia/state.go", `"pia"`},
	{"/var/lib/nodeagent/pia/*.json", "a PIA device's registration and token", "netcfg/wg/pia/state.go", `".json"`},
	{"/var/lib/nodeagent/pia/*.key", "a PIA device's generated key", "netcfg/wg/pia/state.go", `".key"`},
	{"/var/lib/nodeagent/pia/list-*.txt", "the cached signed server list", "netcfg/wg/pia/state.go", `"list-"`},
	{"/var/lib/nodeagent/wireguard", "peers kept from an adoption", "netcfg/wg/kept.go", `"wireguard/kept-peers.json"`},
	// Not nodeagent's: Debian's CNI plugins, which the pods' definition uses.
	{"/usr/lib/cni", "Debian's containernetworking-plugins", "testenv/cni.go", `"/usr/lib/cni"`},
	{"/usr/lib/cni/*", "Debian's containernetworking-plugins (macvlan, static)", "testenv/cni.go", `"/usr/lib/cni"`},
}

// ourPaths are the trees whose paths the docs must account for.
var ourPaths = regexp.MustCompile(`/(?:etc/nodeagent|usr/share/doc/nodeagent|usr/lib|lib/systemd|run/nodeagent|var/lib/nodeagent)(?:/[A-Za-z0-9_.<>*@-]+)*/?`)

// placeholder turns a doc's placeholders (DEV, NAME, <device>, list-HASH)
// into * for matching.
var placeholder = regexp.MustCompile(`<[a-z-]+>|\b[A-Z][A-Z_]+\b`)

func normPath(p string) string {
	p = strings.TrimRight(p, ".,:;")
	p = placeholder.ReplaceAllString(p, "*")
	if p != "/" {
		p = strings.TrimSuffix(p, "/")
	}
	return strings.TrimPrefix(p, "/usr") // /usr/lib and /lib are one on Debian 12 and Ubuntu 24.04
}

// text is a doc's text, a man page's converted to plain text.
func (d docSet) text(name string) string {
	if isRoff(name) {
		return roffText(d[name])
	}
	return d[name]
}

// roffText is a man page's text as a reader sees it: macros' arguments
// joined (.BR a b is "ab"), escapes resolved.
func roffText(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, `.\"`) || strings.HasPrefix(l, `'\"`) {
			continue
		}
		if strings.HasPrefix(l, ".") {
			macro, rest, _ := strings.Cut(l, " ")
			args := roffArgs(rest)
			switch macro {
			case ".BR", ".IR", ".RB", ".RI", ".BI", ".IB":
				l = strings.Join(args, "")
			default:
				l = strings.Join(args, " ")
			}
		}
		out = append(out, l)
	}
	return roffUnescape(strings.Join(out, "\n"))
}

func roffArgs(s string) []string {
	var args []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				args = append(args, s[1:])
				break
			}
			args = append(args, s[1:end+1])
			s = s[end+2:]
			continue
		}
		f, rest, _ := strings.Cut(s, " ")
		args = append(args, f)
		s = rest
	}
	return args
}

var roffUnescape = strings.NewReplacer(`\-`, "-", `\(aq`, "'", `\(dq`, `"`, `\(em`, "—", `\(en`, "–", `\e`, `\`,
	`\&`, "", `\fB`, "", `\fI`, "", `\fR`, "", `\fP`, "", `\|`, "", `\ `, " ", `\~`, " ").Replace

// block is a fenced or literal block of a doc.
type block struct {
	doc, lang, marker, text string
	line                    int // of its first line in the doc
}

var markerRE = regexp.MustCompile(`^<!-- ([a-z0-9-]+):([^ ]+) -->$`)

// blocks returns a doc's code blocks: fenced ones of Markdown (with the
// marker comment right above, if any) and .nf/.EX ones of a man page.
func (d docSet) blocks(name string) []block {
	var out []block
	lines := strings.Split(d[name], "\n")
	if isRoff(name) {
		for i := 0; i < len(lines); i++ {
			if lines[i] != ".nf" && lines[i] != ".EX" {
				continue
			}
			j := i + 1
			for j < len(lines) && lines[j] != ".fi" && lines[j] != ".EE" {
				j++
			}
			out = append(out, block{doc: name, text: roffUnescape(strings.Join(lines[i+1:j], "\n")) + "\n", line: i + 2})
			i = j
		}
		return out
	}
	if !strings.HasSuffix(name, ".md") {
		return nil
	}
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		j := i + 1
		for j < len(lines) && lines[j] != "```" {
			j++
		}
		b := block{doc: name, lang: lang, text: strings.Join(lines[i+1:j], "\n") + "\n", line: i + 2}
		for k := i - 1; k >= 0 && k >= i-2; k-- {
			if m := markerRE.FindStringSubmatch(lines[k]); m != nil {
				b.marker = m[1] + ":" + m[2]
				break
			}
			if lines[k] != "" {
				break
			}
		}
		out = append(out, b)
		i = j
	}
	return out
}

// prose is a doc's text outside its code blocks.
func (d docSet) prose(name string) string {
	if !strings.HasSuffix(name, ".md") {
		return d.text(name)
	}
	var out []string
	in := false
	for _, l := range strings.Split(d[name], "\n") {
		if strings.HasPrefix(l, "```") {
			in = !in
			continue
		}
		if !in {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// configSchema is the config's yaml field names: top-level ones, and for
// each name the struct types a field of that name leads to (nil for a
// leaf), for resolving dotted keys in prose.
type configSchema struct {
	top    map[string]bool
	fields map[reflect.Type]map[string]reflect.Type
	named  map[string][]reflect.Type // field name -> the struct types holding it
}

func schema() configSchema {
	s := configSchema{top: map[string]bool{}, fields: map[reflect.Type]map[string]reflect.Type{}, named: map[string][]reflect.Type{}}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		if _, done := s.fields[t]; done {
			return
		}
		s.fields[t] = map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			ft := f.Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			s.named[name] = append(s.named[name], t)
			if ft.Kind() == reflect.Struct {
				s.fields[t][name] = ft
				walk(ft)
			} else {
				s.fields[t][name] = nil
			}
		}
	}
	root := reflect.TypeOf(config.Config{})
	walk(root)
	for n := range s.fields[root] {
		s.top[n] = true
	}
	return s
}

// resolves says whether the dotted key a.b.c is a path of fields in the
// schema, starting at any struct that has a field a.
func (s configSchema) resolves(key string) bool {
	parts := strings.Split(strings.ReplaceAll(key, "[]", ""), ".")
	for _, start := range s.named[parts[0]] {
		t, ok := start, true
		for _, p := range parts {
			if t == nil {
				ok = false
				break
			}
			next, has := s.fields[t][p]
			if !has {
				ok = false
				break
			}
			t = next
		}
		if ok {
			return true
		}
	}
	return false
}

// configLinks are the links c makes: its VLANs, macvlans and WireGuard
// devices, in that order.
func configLinks(c *config.Config) []string {
	var links []string
	for _, v := range c.VLANs {
		links = append(links, v.Name)
	}
	for _, m := range c.Macvlans {
		links = append(links, m.Name)
	}
	for _, w := range c.WireGuard {
		links = append(links, w.Name)
	}
	return links
}

// physicalLinks are the links a config may name without making them: the
// seeds' trunk NIC.
var physicalLinks = map[string]bool{"enp1s0": true}

// crossRefs names every link c refers to that it neither makes nor is the
// node's NIC: a route, rule, firewall entry, parent, gateway link or
// per-interface sysctl waiting for it would wait for ever.
func crossRefs(c *config.Config) []string {
	made := map[string]bool{}
	for _, l := range configLinks(c) {
		made[l] = true
	}
	var bad []string
	ref := func(what, link string) {
		if link != "" && !made[link] && !physicalLinks[link] {
			bad = append(bad, fmt.Sprintf("%s %s, which the config does not make", what, link))
		}
	}
	for _, v := range c.VLANs {
		ref("vlan "+v.Name+" parent", v.Parent)
	}
	for _, m := range c.Macvlans {
		ref("macvlan "+m.Name+" parent", m.Parent)
	}
	for _, t := range c.Routing.Tables {
		for _, r := range t.Routes {
			ref(fmt.Sprintf("a route of table %d via dev", t.ID), r.Dev)
		}
	}
	for _, r := range c.Routing.Rules {
		ref(fmt.Sprintf("rule %d iif", r.Priority), r.IIF)
		ref(fmt.Sprintf("rule %d oif", r.Priority), r.OIF)
	}
	for _, m := range c.Firewall.Masquerade {
		ref("masquerade out", m.Out)
	}
	for _, m := range c.Firewall.SNAT {
		ref("snat out", m.Out)
	}
	for _, f := range c.Firewall.Forward {
		ref("forward in", f.In)
		ref("forward out", f.Out)
	}
	for _, k := range c.Firewall.KillSwitch {
		for _, o := range k.AllowOut {
			ref("killSwitch allowOut", o)
		}
	}
	for _, m := range c.Firewall.MSSClamp {
		ref("mssClamp", m)
	}
	if g := c.Gateway; g != nil {
		ref("gateway link", g.Link)
	}
	for k := range c.Sysctls {
		parts := strings.Split(k, ".")
		if len(parts) > 3 && parts[2] == "conf" && parts[3] != "all" && parts[3] != "default" && parts[3] != "*" {
			ref("sysctl "+k+" of", strings.ReplaceAll(parts[3], "/", "."))
		}
	}
	sort.Strings(bad)
	return bad
}

// sketchRE starts a commented sketch: a comment whose text is a YAML key
// or list item.
var sketchRE = regexp.MustCompile(`^(- )?[a-z][A-Za-z0-9]*:(\s|$)`)

// commented returns a line's comment column and its text without "# ".
func commented(l string) (col int, text string, ok bool) {
	trim := strings.TrimLeft(l, " ")
	if !strings.HasPrefix(trim, "#") {
		return 0, "", false
	}
	col = len(l) - len(trim)
	text = strings.TrimPrefix(strings.TrimPrefix(trim, "#"), " ")
	return col, text, true
}

// sketches returns src with each of its commented sketches uncommented in
// place, one at a time: a run of comment lines at one column whose text is
// YAML (a key, a list item, or indented under one).
func sketches(src string) []string {
	lines := strings.Split(src, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		col, text, ok := commented(lines[i])
		if !ok || !sketchRE.MatchString(text) {
			continue
		}
		j := i + 1
		for ; j < len(lines); j++ {
			c2, t2, ok2 := commented(lines[j])
			if !ok2 || c2 != col || !(strings.HasPrefix(t2, " ") || sketchRE.MatchString(t2)) {
				break
			}
		}
		v := append([]string(nil), lines...)
		for k := i; k < j; k++ {
			_, t, _ := commented(lines[k])
			v[k] = strings.Repeat(" ", col) + t
		}
		out = append(out, strings.Join(v, "\n"))
		i = j - 1
	}
	return out
}

// configText is one nodeagent config found in the docs.
type configText struct {
	where string // doc:line, and which sketch
	text  string
	copy  bool // meant to be copied (README, examples, the packaged file): cross-references checked too
}

// configs returns every nodeagent config of the docs: whole files, YAML
// blocks whose top-level keys are the config's, and each of their
// commented sketches uncommented.
func (d docSet) configs(s configSchema, problems *[]string) []configText {
	var out []configText
	add := func(where, text string, cp bool) {
		out = append(out, configText{where, text, cp})
		for i, v := range sketches(text) {
			out = append(out, configText{fmt.Sprintf("%s (commented sketch %d uncommented)", where, i+1), v, cp})
		}
	}
	names := make([]string, 0, len(d))
	for n := range d {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "packaging/etc/nodeagent.yaml" || strings.HasPrefix(name, "examples/") && strings.HasSuffix(name, ".yaml") {
			add(name, d[name], true)
			continue
		}
		for _, b := range d.blocks(name) {
			if b.lang != "yaml" && b.lang != "" {
				continue
			}
			var top map[string]any
			if yaml.Unmarshal([]byte(b.text), &top) != nil || len(top) == 0 {
				if b.lang == "yaml" {
					*problems = append(*problems, fmt.Sprintf("%s:%d: a yaml block that does not parse as a mapping", name, b.line))
				}
				continue
			}
			ours, other := 0, []string{}
			for k := range top {
				if s.top[k] {
					ours++
				} else {
					other = append(other, k)
				}
			}
			switch {
			case ours == 0:
				continue
			case len(other) > 0:
				sort.Strings(other)
				*problems = append(*problems, fmt.Sprintf("%s:%d: a config block with keys the config does not have: %v", name, b.line, other))
			}
			add(fmt.Sprintf("%s:%d", name, b.line), b.text, !isRoff(name))
		}
	}
	return out
}

// writeRE finds what a documented command writes: a redirection or tee
// target, or the last path of install, cp, ln or mv.
var (
	redirectRE = regexp.MustCompile(`(?:>>?|\btee(?:\s+-a)?)\s*(/[^\s'";|&)]+)`)
	copyRE     = regexp.MustCompile(`^(?:sudo\s+)?(?:install|cp|ln|mv)\s`)
)

func writeTargets(text string) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		for _, m := range redirectRE.FindAllStringSubmatch(l, -1) {
			out[normPath(m[1])] = true
		}
		for _, cmd := range regexp.MustCompile(`&&|;|\|`).Split(l, -1) {
			cmd = strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(cmd), "'#"))
			cmd, _, _ = strings.Cut(cmd, " #")
			if !copyRE.MatchString(cmd) {
				continue
			}
			f := strings.Fields(cmd)
			last := strings.Trim(f[len(f)-1], `'"`)
			if strings.HasPrefix(last, "/") {
				out[normPath(last)] = true
			}
		}
	}
	return out
}

// modeRE finds `install -d -m MODE DIR` and `chmod MODE DIR`.
var modeRE = regexp.MustCompile(`(?:install\s+-d\s+-m\s*|install\s+-m\s*(\d+)\s+-d\s+|chmod\s+)(\d{3,4})?\s*(/[^\s'";|&)]+)`)

// checked counts what check looked at, so that an extraction that finds
// nothing cannot pass for docs without problems.
type checked struct{ configs, sketches, peersDirs, paths, keys, markers int }

// check returns every problem of the docs d against the package p.
func (d docSet) check(p pkg) []string {
	problems, _ := d.checkCounting(p)
	return problems
}

func (d docSet) checkCounting(p pkg) ([]string, checked) {
	var n checked
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	s := schema()
	names := make([]string, 0, len(d))
	for n := range d {
		names = append(names, n)
	}
	sort.Strings(names)

	// Configs: strict schema and validation; lint and cross-references
	// for those meant to be copied.
	peersDirs := map[string]string{}
	for _, c := range d.configs(s, &problems) {
		n.configs++
		if strings.Contains(c.where, "commented sketch") {
			n.sketches++
		}
		cfg, err := config.ParseWith("config.yaml", []byte(c.text), config.Options{SkipFileChecks: true})
		if err != nil {
			bad("%s: not a valid config: %v", c.where, err)
			continue
		}
		for _, w := range cfg.WireGuard {
			if w.PeersDir != "" {
				peersDirs[w.PeersDir] = c.where
			}
		}
		if !c.copy {
			continue
		}
		for _, w := range lint.Check(cfg) {
			bad("%s: warns: %v", c.where, w)
		}
		for _, r := range crossRefs(cfg) {
			bad("%s: %s: it would wait for that link for ever", c.where, r)
		}
	}

	// Every peersDir, in a config or named in prose, is one the unit
	// lets the daemon write (nodeagentctl peer add writes through it).
	peersDirRE := regexp.MustCompile("peersDir[`\"']?(?::\\s*|\\s+)[`\"']?(/[^\\s`\"',)]+)")
	for _, name := range names {
		for _, m := range peersDirRE.FindAllStringSubmatch(d.text(name), -1) {
			peersDirs[strings.TrimRight(m[1], ".")] = name
		}
	}
	n.peersDirs = len(peersDirs)
	for dir, where := range peersDirs {
		ok := false
		for _, rw := range p.rwPaths {
			ok = ok || dir == rw || strings.HasPrefix(dir, rw+"/")
		}
		if !ok {
			bad("%s: peersDir %s is outside the unit's ReadWritePaths %v: the daemon cannot write it, and nodeagentctl peer add fails there", where, dir, p.rwPaths)
		}
	}

	// Paths. What documented commands write, anywhere in the docs.
	written := map[string]bool{}
	for _, name := range names {
		for w := range writeTargets(d.text(name)) {
			written[w] = true
		}
	}
	shipped := func(q string) bool {
		for f := range p.files {
			if normPath(f) == q {
				return true
			}
		}
		for dir := range p.dirs {
			if normPath(dir) == q {
				return true
			}
		}
		return false
	}
	for _, a := range allowed {
		if b, err := os.ReadFile("../" + a.file); err != nil || !bytes.Contains(b, []byte(a.evidence)) {
			bad("the allow-list's %s (%s) stands on %q in %s, which is not there", a.pattern, a.why, a.evidence, a.file)
		}
	}
	seen := map[string]bool{}
	for _, name := range names {
		for _, raw := range ourPaths.FindAllString(d.text(name), -1) {
			q := normPath(raw)
			if seen[name+" "+q] || q == "/lib" {
				continue
			}
			seen[name+" "+q] = true
			n.paths++
			if shipped(q) || written[q] {
				continue
			}
			ok := false
			for _, a := range allowed {
				if m, _ := path.Match(normPath(a.pattern), q); m {
					ok = true
				}
			}
			// A file in a register a config watches.
			for dir := range peersDirs {
				ok = ok || strings.HasPrefix(q, dir+"/") && !strings.Contains(strings.TrimPrefix(q, dir+"/"), "/")
			}
			if !ok {
				bad("%s: %s is not shipped by the package (nfpm.yaml), made by it or written by a documented command, and not in the allow-list", name, raw)
			}
		}
		// Modes given to the package's directories are the package's.
		for _, m := range modeRE.FindAllStringSubmatch(d.text(name), -1) {
			mode := m[2]
			if mode == "" {
				mode = m[1]
			}
			dir := strings.TrimRight(m[3], "/")
			want, isDir := p.dirs[dir]
			if mode == "" || !isDir || want == 0 {
				continue
			}
			if got, err := strconv.ParseUint(mode, 8, 32); err != nil || os.FileMode(got) != want {
				bad("%s: mode %s for %s, which the package makes %04o", name, mode, dir, want)
			}
		}
	}

	// Config keys named in prose are the schema's.
	keyRE := regexp.MustCompile(`[a-z][A-Za-z0-9]*(?:\[\])?(?:\.[a-z][A-Za-z0-9]*(?:\[\])?)+`)
	fileExt := regexp.MustCompile(`\.(yaml|yml|conf|key|cred|json|txt|port|sock|lock|kubeconfig|network|netdev|link|service|psk|md|sh|go|d|io|org|com|dev|example|local|target)$`)
	for _, name := range names {
		var spans []string
		if strings.HasSuffix(name, ".md") {
			for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(d.prose(name), -1) {
				spans = append(spans, m[1])
			}
		} else {
			spans = []string{d.text(name)}
		}
		for _, sp := range spans {
			for _, loc := range keyRE.FindAllStringIndex(sp, -1) {
				k := sp[loc[0]:loc[1]]
				if loc[0] > 0 && strings.ContainsAny(sp[loc[0]-1:loc[0]], "/.-_@$:") || loc[1] < len(sp) && strings.ContainsAny(sp[loc[1]:loc[1]+1], "/-_@(") {
					continue // part of a path, a name or a function
				}
				first, _, _ := strings.Cut(strings.ReplaceAll(k, "[]", ""), ".")
				if len(s.named[first]) == 0 || fileExt.MatchString(k) {
					continue
				}
				n.keys++
				if !s.resolves(k) {
					bad("%s: %q is not a key of the config schema (netcfg/config/types.go)", name, k)
				}
			}
		}
	}

	// In-page links name a heading of the page (GitHub's anchors).
	for _, name := range names {
		if !strings.HasSuffix(name, ".md") {
			continue
		}
		anchors := map[string]bool{}
		for _, l := range strings.Split(d.prose(name), "\n") {
			if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") {
				a := regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(strings.ToLower(h), "")
				anchors[strings.ReplaceAll(a, " ", "-")] = true
			}
		}
		for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(d[name], -1) {
			if !anchors[m[1]] {
				bad("%s: a link to #%s, which no heading makes", name, m[1])
			}
		}
	}

	wp, markers := d.checkWalkthrough(p)
	problems = append(problems, wp...)
	n.markers = markers
	sort.Strings(problems)
	return problems, n
}

// The marker kinds of the README's runnable blocks: commands on the node
// (as written, or where k3s runs), against the cluster, the adoption, the
// uninstall order and the way back, netplan's part, and files and outputs.
var markerLang = map[string]string{
	"walkthrough": "sh", "walkthrough-k3s": "sh", "walkthrough-kubectl": "sh",
	"adopt": "sh", "uninstall": "sh", "uninstall-kubectl": "sh", "release": "sh", "netplan": "sh",
	"output": "text", "file": "ini",
}

// knownVars are the variables a walkthrough block may use without setting.
var knownVars = map[string]bool{"USER": true, "HOME": true, "EDITOR": true, "p": true}

// checkWalkthrough checks the README's marked blocks: each marker is a
// known kind right above a block of its language, names are unique, every
// output belongs to a step, the shell parses, the walkthrough uses only
// variables it reads and no placeholder, a file shown is the file the
// commands write, and the config the walkthrough installs names only
// files the walkthrough makes.
func (d docSet) checkWalkthrough(p pkg) (problems []string, markers int) {
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	readme := d["README.md"]
	for i, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "<!-- ") && !markerRE.MatchString(l) {
			bad("README.md:%d: a comment that is not a block marker (<!-- kind:name -->): %q", i+1, l)
		}
	}
	steps := map[string]block{}
	vars := map[string]bool{}
	walkWrites := map[string]bool{}
	for _, b := range d.blocks("README.md") {
		if b.marker == "" {
			continue
		}
		kind, _, _ := strings.Cut(b.marker, ":")
		lang, ok := markerLang[kind]
		switch {
		case !ok:
			bad("README.md:%d: unknown marker kind %q", b.line, kind)
			continue
		case b.lang != lang:
			bad("README.md:%d: %s marks a ```%s block, want ```%s", b.line, b.marker, b.lang, lang)
		}
		if _, dup := steps[b.marker]; dup {
			bad("README.md:%d: %s is marked twice", b.line, b.marker)
		}
		steps[b.marker] = b
		if lang != "sh" {
			continue
		}
		if out, err := exec.Command("sh", "-n", "-c", b.text).CombinedOutput(); err != nil {
			bad("README.md:%d: %s does not parse as sh: %v %s", b.line, b.marker, err, bytes.TrimSpace(out))
		}
		if strings.Contains(b.text, "…") || regexp.MustCompile(`<[a-zA-Z][a-zA-Z_-]*>`).MatchString(b.text) {
			bad("README.md:%d: %s holds a placeholder; the walkthrough runs as written", b.line, b.marker)
		}
		if strings.HasPrefix(kind, "walkthrough") {
			for _, m := range regexp.MustCompile(`read -r ([A-Z_]+)`).FindAllStringSubmatch(b.text, -1) {
				vars[m[1]] = true
			}
			for _, m := range regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`).FindAllStringSubmatch(b.text, -1) {
				if !vars[m[1]] && !knownVars[m[1]] {
					bad("README.md:%d: %s uses $%s, which no earlier walkthrough step reads", b.line, b.marker, m[1])
				}
			}
			for w := range writeTargets(b.text) {
				walkWrites[w] = true
			}
		}
	}
	for _, want := range []string{"walkthrough:secrets", "walkthrough:install", "walkthrough:keys", "walkthrough:config",
		"walkthrough:start", "walkthrough:healthy", "walkthrough:phone", "walkthrough-kubectl:nad",
		"walkthrough-kubectl:labels", "walkthrough:metrics", "walkthrough-kubectl:monitoring",
		"uninstall:stop", "uninstall-kubectl:pods", "uninstall:teardown", "release:release",
		"file:/etc/systemd/network/00-nodeagent.network", "netplan:unmanaged"} {
		if _, ok := steps[want]; !ok {
			bad("README.md: no block marked %s", want)
		}
	}
	for m, b := range steps {
		if name, ok := strings.CutPrefix(m, "output:"); ok {
			found := false
			for n := range steps {
				k, nn, _ := strings.Cut(n, ":")
				found = found || nn == name && markerLang[k] == "sh"
			}
			if !found {
				bad("README.md:%d: %s is the output of no step", b.line, m)
			}
		}
	}
	// A file shown for extraction is what the commands write to it.
	for m, f := range steps {
		target, ok := strings.CutPrefix(m, "file:")
		if !ok {
			continue
		}
		re := regexp.MustCompile(`tee ` + regexp.QuoteMeta(target) + ` >/dev/null <<'EOF'\n((?s:.*?))EOF\n`)
		matched := false
		for _, b := range steps {
			if mm := re.FindStringSubmatch(b.text); mm != nil {
				matched = true
				if mm[1] != f.text {
					bad("README.md:%d: the commands write %s other than the block shown", b.line, target)
				}
			}
		}
		if !matched {
			bad("README.md:%d: no step writes %s", f.line, target)
		}
	}
	// The config the walkthrough installs names only files that the
	// walkthrough makes or the package ships.
	install := regexp.MustCompile(`install -m 0644 (/usr/share/doc/nodeagent/examples/[^ ]+) /etc/nodeagent/nodeagent.yaml`).FindStringSubmatch(steps["walkthrough:config"].text)
	if install == nil {
		bad("README.md: walkthrough:config does not install a shipped example as /etc/nodeagent/nodeagent.yaml")
		return problems, len(steps)
	}
	const src = "examples/homelab.yaml"
	if install[1] != "/usr/share/doc/nodeagent/examples/homelab.yaml" || !p.files[install[1]] {
		bad("README.md: the walkthrough installs %s, which is not the shipped examples/homelab.yaml", install[1])
		return problems, len(steps)
	}
	cfg, err := config.ParseWith(src, []byte(d[src]), config.Options{SkipFileChecks: true})
	if err != nil {
		bad("%s: %v", src, err)
		return problems, len(steps)
	}
	made := func(what, f string) {
		if f != "" && !walkWrites[normPath(f)] && !p.files[f] {
			bad("%s: %s %s is made by no step of the walkthrough", src, what, f)
		}
	}
	for _, w := range cfg.WireGuard {
		made("wireguard "+w.Name+" privateKeyFile", w.PrivateKeyFile)
		for _, pr := range w.Peers {
			made("wireguard "+w.Name+" presharedKeyFile", pr.PresharedKeyFile)
		}
		if w.PeersDir != "" {
			if _, ok := p.dirs[w.PeersDir]; !ok {
				bad("%s: wireguard %s peersDir %s is not a directory the package makes", src, w.Name, w.PeersDir)
			}
		}
		if pia := w.PIA; pia != nil {
			made("wireguard "+w.Name+" credentialsFile", pia.CredentialsFile)
			for i, a := range pia.PortForward.OnChange {
				if strings.HasPrefix(a, "/") {
					made(fmt.Sprintf("wireguard %s onChange[%d]", w.Name, i), a)
				}
			}
		}
	}
	// Each output line that names the installed config's file and line
	// names a line of the example holding that field.
	exLines := strings.Split(d[src], "\n")
	for m, b := range steps {
		if !strings.HasPrefix(m, "output:") {
			continue
		}
		for _, mm := range regexp.MustCompile(`/etc/nodeagent/nodeagent\.yaml:(\d+): ([a-zA-Z0-9.\[\]]+):`).FindAllStringSubmatch(b.text, -1) {
			n, _ := strconv.Atoi(mm[1])
			field := mm[2][strings.LastIndex(mm[2], ".")+1:]
			if n < 1 || n > len(exLines) || !strings.Contains(exLines[n-1], field+":") {
				bad("README.md:%d: %s says nodeagent.yaml:%d is %s; line %d of %s is not", b.line, m, n, mm[2], n, src)
			}
		}
	}
	return problems, len(steps)
}

// TestDocsAgainstProduct: the docs as they are have no problem.
func TestDocsAgainstProduct(t *testing.T) {
	p := loadPkg(t)
	problems, n := loadDocs(t).checkCounting(p)
	for _, pr := range problems {
		t.Error(pr)
	}
	t.Logf("checked %d configs (%d of them commented sketches uncommented), %d peersDirs, %d paths, %d config keys in prose, %d marked README blocks",
		n.configs, n.sketches, n.peersDirs, n.paths, n.keys, n.markers)
	if n.configs < 15 || n.sketches < 8 || n.peersDirs < 1 || n.paths < 40 || n.keys < 30 || n.markers < 20 {
		t.Errorf("the extraction found too little to mean anything: %+v", n)
	}
}

// TestDocsCheckFails: the check finds each defect issue 45 found, put
// back into a scratch copy of the docs.
func TestDocsCheckFails(t *testing.T) {
	p := loadPkg(t)
	docs := loadDocs(t)
	if got := docs.check(p); len(got) != 0 {
		t.Fatalf("the docs have problems already (TestDocsAgainstProduct): %v", got)
	}
	for _, tc := range []struct {
		name, doc, old, new, want string
	}{
		{"the importer's register that nothing watches", "README.md",
			"    peersDir: /etc/nodeagent/peers.d\n    clients:\n      endpoint: vpn.example.org:51820          # what clients dial",
			"    peersDir: /etc/nodeagent/peers/wg0\n    clients:\n      endpoint: vpn.example.org:51820          # what clients dial",
			"peersDir /etc/nodeagent/peers/wg0 is outside the unit's ReadWritePaths"},
		{"a key file the README never makes", "examples/homelab.yaml",
			"  - name: wg-pia\n", "  - name: wg-pia\n    privateKeyFile: /etc/nodeagent/keys/wg-pia.key\n",
			"wireguard wg-pia privateKeyFile /etc/nodeagent/keys/wg-pia.key is made by no step of the walkthrough"},
		{"a hook that is not the shipped one", "examples/homelab.yaml",
			"onChange: [/usr/local/sbin/qbittorrent-port,", "onChange: [/usr/local/bin/qbt-set-port,",
			"onChange[0] /usr/local/bin/qbt-set-port is made by no step"},
		{"a shipped file that is not shipped", "README.md",
			"/usr/share/doc/nodeagent/examples/hooks/qbittorrent-port /usr/local/sbin/qbittorrent-port",
			"/usr/share/doc/nodeagent/examples/hooks/qbt-set-port /usr/local/sbin/qbittorrent-port",
			"/usr/share/doc/nodeagent/examples/hooks/qbt-set-port is not shipped"},
		{"the packaged sketch routing through a link it does not declare", "packaging/etc/nodeagent.yaml",
			"#   - name: wg-pia                      # VLAN 50's way out; nodeagent generates its key\n#     pia: {region: nl_amsterdam, credentialsFile: /etc/nodeagent/pia.cred, dns: {for: [10.10.50.0/24]}}\n", "",
			"a route of table 150 via dev wg-pia, which the config does not make"},
		{"the import step resetting /etc/nodeagent's mode", "README.md",
			"install -d -m 0750 /etc/nodeagent", "install -d -m 0755 /etc/nodeagent",
			"mode 0755 for /etc/nodeagent, which the package makes 0750"},
		{"a misspelt key in a config block", "README.md",
			"      name: vlan50-egress\n      killSwitch: true\n      routes:\n        - {to: default, dev: wg-pia}\n        - {to: 192.168.2.0/24",
			"      name: vlan50-egress\n      killswitch: true\n      routes:\n        - {to: default, dev: wg-pia}\n        - {to: 192.168.2.0/24",
			`killswitch: unknown field`},
		{"a commented sketch that no longer validates", "examples/homelab.yaml",
			"  #   id: 49\n", "  #   id: 4095\n", "(commented sketch"},
		{"a key in prose that the schema lacks", "README.md",
			"(`pia.dns.for`)", "(`pia.dns.fro`)", `"pia.dns.fro" is not a key of the config schema`},
		{"a placeholder in the walkthrough", "README.md",
			"sudo nodeagentctl peer add phone --description", "sudo nodeagentctl peer add <name> --description",
			"walkthrough:phone holds a placeholder"},
		{"the netplan file shown and written apart", "README.md",
			"Name=enp1s0.50 vlan50-shim wg-pia wg0\n\n[Link]\nUnmanaged=yes\nEOF", "Name=enp1s0.50 vlan50-shim wg0\n\n[Link]\nUnmanaged=yes\nEOF",
			"the commands write /etc/systemd/network/00-nodeagent.network other than the block shown"},
		{"a link to a heading that is not there", "README.md",
			"(#the-way-out)", "(#the-way-outt)", "a link to #the-way-outt, which no heading makes"},
		{"an output naming a line the example does not have", "README.md",
			"nodeagent.yaml:109: wireguard[0].pia.region:", "nodeagent.yaml:110: wireguard[0].pia.region:",
			"says nodeagent.yaml:110 is wireguard[0].pia.region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scratch := docs.clone()
			if strings.Count(scratch[tc.doc], tc.old) < 1 {
				t.Fatalf("%s does not hold %q", tc.doc, tc.old)
			}
			scratch[tc.doc] = strings.Replace(scratch[tc.doc], tc.old, tc.new, 1)
			got := scratch.check(p)
			for _, g := range got {
				if strings.Contains(g, tc.want) {
					return
				}
			}
			t.Errorf("no problem says %q; got %q", tc.want, got)
		})
	}
}
