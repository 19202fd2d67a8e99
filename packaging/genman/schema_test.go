package main

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// pageField is one field of nodeagent.yaml(5)'s SCHEMA as rendered: its
// path (wireguard[].pia.region), its type and its text, roff undone.
type pageField struct{ path, typ, text string }

// pageFields parses the rendered schema: ".SS section" heads, then
// ".TP", "\fBkey\fR (type)" and the text of each field.
func pageFields(t *testing.T, schema string) []pageField {
	t.Helper()
	head := regexp.MustCompile(`^\\fB(.+)\\fR \((.+)\)$`)
	var out []pageField
	section := ""
	lines := strings.Split(unroff(schema), "\n")
	for i := 0; i < len(lines); i++ {
		switch l := lines[i]; {
		case strings.HasPrefix(l, ".SS "):
			section = strings.TrimPrefix(l, ".SS ")
		case l == ".TP" && i+1 < len(lines):
			m := head.FindStringSubmatch(lines[i+1])
			if m == nil {
				t.Fatalf("schema line %d: %q is not a field head", i+2, lines[i+1])
			}
			f := pageField{path: m[1], typ: m[2]}
			if section != "" {
				f.path = section + "." + m[1]
			}
			if i+2 < len(lines) && !strings.HasPrefix(lines[i+2], ".") {
				f.text = lines[i+2]
			}
			out = append(out, f)
			i++
		}
	}
	return out
}

// unroff undoes the escapes prose and escape add.
func unroff(s string) string {
	return strings.NewReplacer(`\-`, "-", `\e`, `\`, `\&`, "").Replace(s)
}

func renderedSchema(t *testing.T) string {
	t.Helper()
	s, err := renderSchema(filepath.Join("..", "..", "netcfg", "config", "types.go"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSchemaEveryFieldDocumented: nodeagent.yaml(5) says something about
// every key of the config, not just its type.
func TestSchemaEveryFieldDocumented(t *testing.T) {
	fields := pageFields(t, renderedSchema(t))
	if len(fields) < 90 {
		t.Fatalf("the schema renders %d fields; the config has more", len(fields))
	}
	for _, f := range fields {
		if strings.TrimSpace(f.text) == "" {
			t.Errorf("%s (%s) has no description: write a doc comment for it in netcfg/config/types.go", f.path, f.typ)
		}
	}
}

// probe parses a config that sets only path to value, and returns the
// messages of the errors reported at that path.
func probe(t *testing.T, path string, value any) []string {
	t.Helper()
	segs := strings.Split(path, ".")
	// Lists hold one item: the value under a key ending in [] is wrapped
	// in a list.
	var build func(i int) any
	build = func(i int) any {
		if i == len(segs) {
			return value
		}
		key, list := strings.CutSuffix(segs[i], "[]")
		var v any = build(i + 1)
		if list {
			v = []any{v}
		}
		return map[string]any{key: v}
	}
	doc, err := json.Marshal(build(0)) // JSON is YAML
	if err != nil {
		t.Fatal(err)
	}
	want := strings.ReplaceAll(path, "[]", "[0]")
	_, err = config.ParseWith("probe.yaml", doc, config.Options{SkipFileChecks: true})
	var list config.ErrorList
	if err != nil && !errors.As(err, &list) {
		t.Fatalf("%s: %v", path, err)
	}
	var msgs []string
	for _, e := range list {
		if e.Field == want {
			msgs = append(msgs, e.Msg)
		}
	}
	return msgs
}

var wordRE = regexp.MustCompile(`[A-Za-z][A-Za-z0-9_-]*`)

// TestSchemaEnumsAsAccepted: for every string field the validator takes
// from a fixed set ("... is not one of a, b, c"), the page lists each
// value, spelled as the validator accepts it, and never in another case
// ("Bridge" for bridge).
func TestSchemaEnumsAsAccepted(t *testing.T) {
	enums := 0
	for _, f := range pageFields(t, renderedSchema(t)) {
		if f.typ != "string" {
			continue
		}
		for _, msg := range probe(t, f.path, "zz-not-a-value") {
			_, vals, ok := strings.Cut(msg, " is not one of ")
			if !ok {
				continue
			}
			enums++
			accepted := strings.Split(vals, ", ")
			words := wordRE.FindAllString(f.text, -1)
			for _, v := range accepted {
				found := false
				for _, w := range words {
					switch {
					case w == v:
						found = true
					case strings.EqualFold(w, v):
						t.Errorf("%s: the page spells %q, but the validator accepts only %q", f.path, w, v)
					}
				}
				if !found {
					t.Errorf("%s: the page does not name the value %q the validator accepts (%s)", f.path, v, vals)
				}
			}
		}
	}
	if enums < 5 {
		t.Errorf("found %d enum fields by probing the validator; macvlans mode, wireguard implementation, route scope and type and rule action are", enums)
	}
}

// TestSchemaRangesAsValidated: for every number or duration the validator
// bounds ("-1 is outside 1-4094"), the page gives the same bounds.
func TestSchemaRangesAsValidated(t *testing.T) {
	ranges := 0
	for _, f := range pageFields(t, renderedSchema(t)) {
		var bad any
		switch {
		case f.typ == "integer":
			bad = -1
		case strings.HasPrefix(f.typ, "duration"):
			bad = "-1s"
		default:
			continue
		}
		for _, msg := range probe(t, f.path, bad) {
			_, r, ok := strings.Cut(msg, " is outside ")
			if !ok {
				continue
			}
			ranges++
			if !strings.Contains(f.text, r) {
				t.Errorf("%s: the validator takes %s, which the page does not say: %q", f.path, r, f.text)
			}
		}
	}
	if ranges < 15 {
		t.Errorf("found %d bounded fields by probing the validator, want at least 15", ranges)
	}
}

// TestSchemaNoGoIdentifiers: the page speaks the config's language. A Go
// name of the config structs that is not its YAML key (KillSwitch for
// killSwitch, From for from) or a Go type name (ForwardAccept) never
// appears in the schema's text, nor a Go package path.
func TestSchemaNoGoIdentifiers(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "..", "netcfg", "config", "types.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Words that are also the English (or Kubernetes) names of what they
	// stand for.
	prose := map[string]bool{"WireGuard": true, "VLANs": true, "Node": true, "Kubernetes": true}
	names := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.TypeSpec:
			if _, ok := x.Type.(*ast.StructType); ok {
				names[x.Name.Name] = true
			}
		case *ast.Field:
			key := yamlKey(x)
			for _, n := range x.Names {
				if key != "" && n.Name != key {
					names[n.Name] = true
				}
			}
		}
		return true
	})
	schema := unroff(renderedSchema(t))
	if strings.Contains(schema, "netcfg/") {
		t.Error("the schema names a Go package (netcfg/...)")
	}
	for name := range names {
		if prose[name] || !hasLower(name) {
			continue // acronyms (DAD, MTU, SNAT) are how prose says them too
		}
		re := regexp.MustCompile(`\b` + name + `\b`)
		if camel(name) {
			if loc := re.FindStringIndex(schema); loc != nil {
				t.Errorf("the schema says the Go name %s: %q", name, around(schema, loc))
			}
			continue
		}
		// A one-word name (From, Out) is a leak mid-sentence only.
		mid := regexp.MustCompile(`[a-z,] ` + name + `\b`)
		if loc := mid.FindStringIndex(schema); loc != nil {
			t.Errorf("the schema says the Go name %s: %q", name, around(schema, loc))
		}
	}
}

func hasLower(s string) bool { return strings.IndexFunc(s, unicode.IsLower) >= 0 }

// camel reports whether s has an upper-case letter after its first.
func camel(s string) bool { return strings.IndexFunc(s[1:], unicode.IsUpper) >= 0 }

func around(s string, loc []int) string {
	return s[max(0, loc[0]-40):min(len(s), loc[1]+40)]
}
