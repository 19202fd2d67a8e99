package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestGeneratedManPages keeps docs/ in step with the code: regenerating the
// man pages from the binaries' --help and the config schema yields the
// committed files. After changing a usage text, a template in
// packaging/man/ or netcfg/config/types.go, run `go run ./packaging/genman`
// and commit docs/.
func TestGeneratedManPages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries")
	}
	root := "../.."
	out := t.TempDir()
	if err := run(root, "", "", out); err != nil {
		t.Fatal(err)
	}
	for _, name := range Pages {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(root, "docs", name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("docs/%s is not what packaging/genman generates from the code; run `go run ./packaging/genman` and commit docs/", name)
		}
	}
}

// TestUsageBlocks checks the usage parser on the shapes the two usage texts
// use: wrapped descriptions, a flag whose description starts on the next
// line, and one separated from its argument by a single space.
func TestUsageBlocks(t *testing.T) {
	help := `tool does things.

Usage:
  tool run [-c FILE]     run it, for a long
                         time
  tool wait [--for=COND]
                         wait

Flags (anywhere):
  -c, --config FILE   the config
      --rt-tables FILE
                      the tables
      --level LVL one space
  -h, --help          help

Exit status: 0.
`
	b := usageBlocks(help)
	if got := len(b["Usage"]); got != 2 {
		t.Fatalf("Usage: %d entries, want 2: %q", got, b["Usage"])
	}
	if e := b["Usage"][0]; e.term != "tool run [-c FILE]" || e.desc != "run it, for a long time" {
		t.Errorf("Usage[0] = %q", e)
	}
	if got := len(b["Flags"]); got != 4 {
		t.Fatalf("Flags: %d entries, want 4: %q", got, b["Flags"])
	}
	for i, want := range [][3]string{{"-c, --config", "FILE", "the config"}, {"--rt-tables", "FILE", "the tables"}, {"--level", "LVL", "one space"}, {"-h, --help", "", "help"}} {
		e := b["Flags"][i]
		m := flagRe.FindStringSubmatch(e.term)
		if m == nil {
			t.Errorf("Flags[%d] %q: not a flag", i, e.term)
			continue
		}
		if got := [3]string{m[1], m[2], trim(m[3] + " " + e.desc)}; got != want {
			t.Errorf("Flags[%d] = %q, want %q", i, got, want)
		}
	}
	if got, want := synopsisLine("tool wait [--for=COND]"), `\fBtool\fR \fBwait\fR [\fB\-\-for\fR=\fICOND\fR]`; got != want {
		t.Errorf("synopsisLine = %s, want %s", got, want)
	}
}

func trim(s string) string {
	for len(s) > 0 && s[0] == ' ' {
		s = s[1:]
	}
	for len(s) > 0 && s[len(s)-1] == ' ' {
		s = s[:len(s)-1]
	}
	return s
}

// TestConditionsDocumented: every condition type the daemon reports (the
// Cond constants of agent/api) has its entry under CONDITIONS in
// nodeagentctl(1), so an operator can look up what status names.
func TestConditionsDocumented(t *testing.T) {
	root := "../.."
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(root, "agent", "api", "api.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conds []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if strings.HasPrefix(n.Name, "Cond") && i < len(vs.Values) {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						conds = append(conds, v)
					}
				}
			}
		}
	}
	if len(conds) < 9 {
		t.Fatalf("found %d condition types in agent/api/api.go: %q", len(conds), conds)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "nodeagentctl.1"))
	if err != nil {
		t.Fatal(err)
	}
	_, sect, ok := strings.Cut(string(page), "\n.SH CONDITIONS\n")
	if !ok {
		t.Fatal("docs/nodeagentctl.1 has no CONDITIONS section")
	}
	sect, _, _ = strings.Cut(sect, "\n.SH ")
	for _, c := range conds {
		if !strings.Contains(sect, "\n.TP\n.B "+c+"\n") {
			t.Errorf("docs/nodeagentctl.1: condition %s has no entry under CONDITIONS (packaging/man/nodeagentctl.1.in)", c)
		}
	}
}
