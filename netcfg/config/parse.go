package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"gopkg.in/yaml.v3"
)

// Options changes how a config is checked.
type Options struct {
	// SkipFileChecks skips looking at key and credential files on disk
	// (their permissions). Use it where the files are not meant to exist,
	// such as tests and fuzzing; the daemon leaves it false.
	SkipFileChecks bool
	// PIARegion, when set, judges a PIA device's region id against its
	// server list (the cached one): "" when it is known or no list is at
	// hand, else why not. The config package knows no server list.
	PIARegion func(p PIA) string
}

// Load reads the config at path and parses it with Parse.
func Load(path string) (*Config, error) {
	return LoadWith(path, Options{})
}

// LoadWith is Load with options.
func LoadWith(path string, opts Options) (*Config, error) {
	c, _, err := ReadWith(path, opts)
	return c, err
}

// MaxConfigSize bounds the main config file. The homelab's is 4 KiB; a
// config of thousands of VLANs and rules stays well under this.
const MaxConfigSize = 1 << 20

// configRules are how the main config is opened: a regular file (a link
// to one is followed, as config management and ConfigMap mounts make
// them) that others cannot write, read without blocking and with a cap.
var configRules = fsafe.Rules{MaxSize: MaxConfigSize, FollowLinks: true}

// ReadWith is LoadWith that also returns the bytes it parsed, read once,
// so that a hash of them describes exactly the config that was loaded.
// The error is an *fsafe.Error when the file could not be read or was
// refused, and an ErrorList when it did not parse or validate.
func ReadWith(path string, opts Options) (*Config, []byte, error) {
	data, err := fsafe.ReadFile(path, configRules)
	if err != nil {
		return nil, nil, err
	}
	c, err := ParseWith(path, data, opts)
	return c, data, err
}

// ReadRaw reads the config's bytes as ReadWith does, without parsing them.
func ReadRaw(path string) ([]byte, error) {
	return fsafe.ReadFile(path, configRules)
}

// Parse decodes, defaults and validates one YAML config. file names it in
// errors and is stored in Config.File; it is used as given, not shortened.
//
// On any problem Parse still returns the (partial) *Config, with an
// ErrorList holding every problem it found.
func Parse(file string, data []byte) (*Config, error) {
	return ParseWith(file, data, Options{})
}

// ParseWith is Parse with options.
func ParseWith(file string, data []byte, opts Options) (*Config, error) {
	c := &Config{File: file}
	d := &decoder{
		file:    file,
		pos:     positions{},
		bad:     map[string]bool{},
		budget:  decodeBudget,
		maxErrs: MaxConfigErrors,
	}
	root, errs := readDocument(file, data)
	if len(errs) > 0 {
		return c, errs.err()
	}
	if root != nil {
		d.decode(root, reflect.ValueOf(c).Elem(), "")
	}
	d.resolveTableNames(c)
	applyDefaults(c, d.pos)
	c.Lines = Lines(d.pos)
	v := d.validator(opts)
	v.validate(c)
	return c, v.result()
}

// MaxConfigErrors bounds the errors reported for one config file; the
// rest are counted. An operator fixes the first ones and runs validate
// again, and a hostile file (YAML aliases) cannot make a million lines.
const MaxConfigErrors = 100

// decodeBudget bounds the nodes one decode visits. Aliases can make a small
// document expand to a huge one ("billion laughs"); no honest config comes
// near this. A register file holds one peer: a few dozen nodes.
const (
	decodeBudget         = 1_000_000
	registerDecodeBudget = 10_000
)

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// readDocument parses data into its single YAML document's root node. It
// returns nil for an empty file (or one holding only comments or null),
// which is an empty config.
func readDocument(file string, data []byte) (root *yaml.Node, errs ErrorList) {
	docs, err := decodeDocuments(data)
	if err != nil {
		return nil, ErrorList{syntaxError(file, data, err)}
	}
	for _, n := range docs {
		if root != nil {
			return nil, ErrorList{{File: file, Line: n.Line,
				Msg: "a second YAML document; nodeagent reads exactly one, so put everything in one document"}}
		}
		root = n
	}
	return root, nil
}

// decodeDocuments parses every YAML document in data and returns the root
// nodes of those that are not empty, or the first syntax error.
func decodeDocuments(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var doc yaml.Node
		if err := safeDecode(dec, &doc); err != nil {
			if errors.Is(err, io.EOF) {
				return docs, nil
			}
			return nil, err
		}
		if n := documentContent(&doc); n != nil {
			docs = append(docs, n)
		}
		// An empty document, such as a trailing "---", is skipped.
	}
}

// safeDecode runs the YAML parser, turning a panic inside it into an error:
// a malformed file must be reported, not crash the daemon.
func safeDecode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: parser failed: %v", r)
		}
	}()
	return dec.Decode(n)
}

// documentContent returns the root node of doc, or nil if it holds nothing.
func documentContent(doc *yaml.Node) *yaml.Node {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	n := doc.Content[0]
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	return n
}

// syntaxError reports the YAML parser's err at the line of the token that
// caused it, which is where the operator has to look.
func syntaxError(file string, data []byte, err error) *FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	reported := 0
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		reported, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	line := offendingLine(data, err.Error(), reported)
	if line == 0 {
		line = reported
	}
	if line > 0 && !strings.Contains(msg, "tab") && tabIndented(data, line) {
		msg += " (a tab indents this line; YAML indents with spaces only)"
	}
	return &FieldError{File: file, Line: line, Msg: "invalid YAML: " + msg}
}

// offendingLine returns the line of the token that makes data fail to
// parse with the error text full, or 0 when it cannot tell. yaml.v3 reports
// the line where the enclosing block or scalar began, or the line before it
// (often a comment above the mistake), not the token's own as PyYAML
// does; and the parser reads a file front to back, so the token's line is
// the first N for which the file's first N lines fail with the very same
// error (all of them do: that is the file). The token is never above the
// reported line and seldom far below it, so the search gallops down from
// there and then halves: a few parses, each bounded by MaxConfigSize, on a
// path taken only for a broken file.
func offendingLine(data []byte, full string, reported int) int {
	ends := lineEnds(data)
	failsAt := func(n int) bool {
		_, err := decodeDocuments(data[:ends[n-1]])
		return err != nil && err.Error() == full
	}
	lo, hi := max(reported, 1), len(ends)
	if lo > hi {
		return 0
	}
	// Invariant: the answer is in [lo, hi], and hi fails.
	for step := 1; lo < hi; step *= 2 {
		probe := min(lo+step-1, hi-1)
		if failsAt(probe) {
			hi = probe
			break
		}
		lo = probe + 1
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if failsAt(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// lineEnds returns, for each line of data, the offset just past it (its
// newline included).
func lineEnds(data []byte) []int {
	var ends []int
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	return ends
}

// tabIndented reports whether the indentation of line (1-based) of data
// holds a tab.
func tabIndented(data []byte, line int) bool {
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return false
		}
		data = data[i+1:]
	}
	for _, b := range data {
		switch b {
		case ' ':
		case '\t':
			return true
		default:
			return false
		}
	}
	return false
}

// positions maps a field path to the line it was written on.
type positions map[string]int

// decoder turns a YAML node tree into Go values by reflection, keeping the
// line of every field and reporting unknown keys and type mismatches.
// yaml.v3's own decoder would stop at the first error and lose lines.
type decoder struct {
	file string
	pos  positions
	// bad holds the paths whose value could not be decoded, and unknown
	// keys; validation stays quiet about them so one typo is reported
	// once, and checks across sections hold back while there are any.
	bad    map[string]bool
	errs   ErrorList
	budget int
	// maxErrs is how many errors are kept; dropped counts the rest.
	maxErrs, dropped int
	// redact: the document is a register file, which may be written by
	// others than root; scalars are described quoted, so that redactErrors
	// can tell which of them may be shown.
	redact bool
	// tableNames are the rules' tables written as names, resolved to ids
	// once the whole document (and so every table's name) is decoded.
	tableNames []tableName
}

// tableName is a rule's table given by name: where it was written, and the
// field that gets the table's id.
type tableName struct {
	node *yaml.Node
	path string
	v    reflect.Value
}

// isRuleTable reports whether path is a rule's table
// (routing.rules[N].table), which takes a table's name as well as its id.
func isRuleTable(path string) bool {
	rest, ok := strings.CutPrefix(path, "routing.rules[")
	return ok && strings.HasSuffix(rest, "].table") && !strings.ContainsAny(strings.TrimSuffix(rest, "].table"), ".[]")
}

// reservedTableIDs are the tables a rule may name without declaring them.
var reservedTableIDs = map[string]int{"main": 254, "default": 253, "local": 255}

// resolveTableNames sets each rule table written as a name to the id of
// the table of that name: one in routing.tables, or main, default or local.
func (d *decoder) resolveTableNames(c *Config) {
	for _, tn := range d.tableNames {
		name := tn.node.Value
		id, ok := reservedTableIDs[name]
		var names []string
		for _, t := range c.Routing.Tables {
			if t.Name == "" {
				continue
			}
			if t.Name == name && !ok {
				id, ok = t.ID, true
			}
			names = append(names, t.Name)
		}
		if ok {
			tn.v.SetInt(int64(id))
			continue
		}
		msg := fmt.Sprintf("no table is named %q; use the id or name of a table in routing.tables, or main, default or local", name)
		if s := suggest(name, append(names, "main", "default", "local")); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		d.fail(tn.node, tn.path, "%s", msg)
	}
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	if len(d.errs) >= d.maxErrs {
		d.dropped++
		return
	}
	d.errs = append(d.errs, &FieldError{File: d.file, Line: n.Line, Field: path, Msg: fmt.Sprintf(format, args...)})
}

// validator continues d's error list with the config checks.
func (d *decoder) validator(opts Options) *validator {
	return &validator{file: d.file, pos: d.pos, bad: d.bad, opts: opts, errs: d.errs, maxErrs: d.maxErrs, dropped: d.dropped}
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.bad[path] = true
	d.errorf(n, path, format, args...)
}

var durationType = reflect.TypeFor[time.Duration]()

// decode stores n into v. path names v in errors.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	d.budget--
	if d.budget == 0 {
		// Past any cap: it is the one error that explains the rest.
		d.errs = append(d.errs, &FieldError{File: d.file, Line: n.Line, Msg: "document expands to too many nodes (aliases nested too deep?)"})
	}
	if d.budget <= 0 {
		return
	}
	if isNull(n) {
		v.SetZero() // a key with no value means "unset"
		return
	}
	if v.Type() == durationType {
		d.decodeDuration(n, v, path)
		return
	}
	if sh, ok := v.Interface().(interface{ shorthand() string }); ok && v.Kind() == reflect.Struct && n.Kind == yaml.ScalarNode {
		// A scalar where a struct is allowed to be written short
		// (portForward: true): it sets the one field named.
		f, _ := yamlFields(v.Type())[sh.shorthand()]
		d.decode(n, v.Field(f), fieldPath(path, sh.shorthand()))
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		d.decode(n, p.Elem(), path)
		v.Set(p)
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		d.decodeSlice(n, v, path)
	case reflect.Map:
		d.decodeMap(n, v, path)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a string, got %s", d.describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.decodeInt(n, v, path)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			d.fail(n, path, "expected true or false, got %s", d.describe(n))
			return
		}
		b, err := strconv.ParseBool(strings.ToLower(n.Value))
		if err != nil {
			d.fail(n, path, "expected true or false, got %s", d.describe(n))
			return
		}
		v.SetBool(b)
	default:
		// Only reachable if types.go gains a field of a kind this decoder
		// does not know; fail loudly rather than ignore the field.
		d.fail(n, path, "field of unsupported type %s", v.Type())
	}
}

func (d *decoder) decodeInt(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && isRuleTable(path) {
		if id, err := strconv.ParseInt(n.Value, 10, 64); err == nil && !v.OverflowInt(id) {
			v.SetInt(id) // "150": an id, quoted
			return
		}
		d.tableNames = append(d.tableNames, tableName{n, path, v})
		return
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.fail(n, path, "expected an integer, got %s", d.describe(n))
		return
	}
	i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil || v.OverflowInt(i) {
		d.fail(n, path, "%s is out of range", n.Value)
		return
	}
	v.SetInt(i)
}

func (d *decoder) decodeDuration(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "expected a duration like 1s or 500ms, got %s", d.describe(n))
		return
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		d.fail(n, path, "expected a duration like 1s or 500ms, got %q", n.Value)
		return
	}
	v.SetInt(int64(dur))
}

func (d *decoder) decodeSlice(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		d.fail(n, path, "expected a list, got %s", d.describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		p := indexPath(path, i)
		d.pos[p] = item.Line
		d.decode(item, s.Index(i), p)
	}
	v.Set(s)
}

func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping, got %s", d.describe(n))
		return
	}
	if v.Type().Key().Kind() != reflect.String {
		d.fail(n, path, "field of unsupported type %s", v.Type())
		return
	}
	m := reflect.MakeMap(v.Type())
	for _, kv := range d.pairs(n, path) {
		p := mapKeyPath(path, kv.key.Value)
		d.pos[p] = kv.key.Line
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(kv.value, elem, p)
		m.SetMapIndex(reflect.ValueOf(kv.key.Value).Convert(v.Type().Key()), elem)
	}
	v.Set(m)
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping, got %s", d.describe(n))
		return
	}
	fields := yamlFields(v.Type())
	for _, kv := range d.pairs(n, path) {
		key := kv.key.Value
		if nk, old := oldKeys[v.Type()][key]; old {
			// The old spelling reads as the new one, unless both are set.
			if k := keyNode(n, nk); k != nil {
				d.errorf(kv.key, fieldPath(path, nk), "duplicate key: %s is the old spelling of %s, which is set on line %d", key, nk, k.Line)
				continue
			}
			key = nk
		}
		p := fieldPath(path, key)
		idx, ok := fields[key]
		if !ok {
			msg := "unknown field"
			if s := suggest(kv.key.Value, fieldNames(v.Type())); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			// Not marked bad: a file of a million unknown keys must not
			// make a map of a million paths (the error list is capped).
			d.errorf(kv.key, p, "%s", msg)
			continue
		}
		if !isNull(kv.value) {
			// "key:" with no value is the same as leaving the key out,
			// so it does not count as written (see applyDefaults).
			d.pos[p] = kv.key.Line
		}
		d.decode(kv.value, v.Field(idx), p)
	}
}

// oldKeys are keys that earlier versions spelt differently, by the struct
// they belong to: the old spelling is still read, as the new one, and only
// the new one is documented.
var oldKeys = map[reflect.Type]map[string]string{
	reflect.TypeFor[Rule](): {"fwmark": "fwMark"},
}

// keyNode returns the key node of mapping n written as key, or nil.
func keyNode(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.Value == key {
			return k
		}
	}
	return nil
}

type pair struct{ key, value *yaml.Node }

// pairs returns the key/value pairs of mapping n, reporting non-scalar and
// duplicate keys. YAML merge keys ("<<: *base") are expanded; keys written
// in n itself win over merged ones, as the merge-key spec says.
func (d *decoder) pairs(n *yaml.Node, path string) []pair {
	var out []pair
	seen := map[string]*yaml.Node{}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		for k.Kind == yaml.AliasNode && k.Alias != nil {
			k = k.Alias
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, val)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, path, "mapping keys must be plain strings, got %s", d.describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.errorf(k, fieldPath(path, k.Value), "duplicate key (first set on line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		out = append(out, pair{k, val})
	}
	visiting := map[*yaml.Node]bool{n: true}
	for _, m := range merges {
		out = d.merge(m, path, seen, visiting, out)
	}
	return out
}

// merge appends the pairs of the merge source m that are not in seen.
// visiting breaks alias cycles, which YAML allows but which would
// otherwise recurse forever.
func (d *decoder) merge(m *yaml.Node, path string, seen map[string]*yaml.Node, visiting map[*yaml.Node]bool, out []pair) []pair {
	for m.Kind == yaml.AliasNode && m.Alias != nil {
		m = m.Alias
	}
	d.budget--
	if d.budget <= 0 || visiting[m] {
		return out
	}
	switch m.Kind {
	case yaml.MappingNode:
		visiting[m] = true
		defer delete(visiting, m)
		for i := 0; i+1 < len(m.Content); i += 2 {
			k := m.Content[i]
			for k.Kind == yaml.AliasNode && k.Alias != nil {
				k = k.Alias
			}
			if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
				out = d.merge(m.Content[i+1], path, seen, visiting, out)
				continue
			}
			if k.Kind != yaml.ScalarNode {
				continue // reported where the mapping itself is decoded, if it is
			}
			if _, ok := seen[k.Value]; ok {
				continue
			}
			seen[k.Value] = k
			out = append(out, pair{k, m.Content[i+1]})
		}
	case yaml.SequenceNode:
		if visiting[m] {
			return out
		}
		visiting[m] = true
		defer delete(visiting, m)
		for _, item := range m.Content {
			out = d.merge(item, path, seen, visiting, out)
		}
	default:
		d.errorf(m, fieldPath(path, "<<"), "a merge key needs a mapping or a list of mappings, got %s", d.describe(m))
	}
	return out
}

// isNull reports whether n, after following aliases, is a YAML null.
func isNull(n *yaml.Node) bool {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names the kind of n for type errors.
func (d *decoder) describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!str" || d.redact {
			return strconv.Quote(n.Value)
		}
		return n.Value
	}
	return "something else"
}

// yamlFields maps the yaml names of t's fields to their indexes.
func yamlFields(t reflect.Type) map[string]int {
	m := map[string]int{}
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			m[name] = i
		}
	}
	return m
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			names = append(names, name)
		}
	}
	return names
}

func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name
}

// fieldPath, indexPath and mapKeyPath build the field paths used in errors
// and in positions. Validation uses them too, so both agree.
func fieldPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func indexPath(parent string, i int) string {
	if parent == "allowedIPs" && i >= 0 && i < len(allowedIPsPaths) {
		return allowedIPsPaths[i] // every register file's, without an allocation
	}
	return parent + "[" + strconv.Itoa(i) + "]"
}

var allowedIPsPaths = [...]string{"allowedIPs[0]", "allowedIPs[1]", "allowedIPs[2]", "allowedIPs[3]"}

// mapKeyPath writes sysctl keys the way sysctl(8) does (sysctls.net.ipv4.ip_forward)
// and every other map key quoted (kubernetes.labels["foo/bar"]), because
// label keys contain dots and slashes.
func mapKeyPath(parent, key string) string {
	if parent == "sysctls" {
		return parent + "." + key
	}
	return parent + "[" + strconv.Quote(key) + "]"
}

// parentPath strips the last element from a field path.
func parentPath(p string) string {
	if strings.HasSuffix(p, `"]`) {
		// A quoted map key may itself contain '[' or '"'; find the
		// opening bracket whose quoted string ends exactly at the end.
		for i := strings.LastIndex(p, `["`); i >= 0; i = strings.LastIndex(p[:i], `["`) {
			if q, err := strconv.QuotedPrefix(p[i+1:]); err == nil && len(q) == len(p)-i-2 {
				return p[:i]
			}
		}
	}
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}
