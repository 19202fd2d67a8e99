package main

import (
	"os"
	"path/filepath"
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
	for _, name := range []string{"nodeagent.8", "nodeagentctl.8", "nodeagent.yaml.5"} {
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
