package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsSelfContained: what a user reads (README.md, docs/, the man page
// sources) points at nothing outside the repository: no design notes or
// seed documents beside it, and every relative link of a Markdown page
// names a file that is in the repository.
func TestDocsSelfContained(t *testing.T) {
	root := filepath.Join("..", "..")
	files := []string{filepath.Join(root, "README.md")}
	for _, dir := range []string{"docs", filepath.Join("packaging", "man")} {
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if !e.IsDir() {
				files = append(files, filepath.Join(root, dir, e.Name()))
			}
		}
	}
	link := regexp.MustCompile(`\]\(([^)#\s]+)(?:#[^)]*)?\)`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, bad := range []string{"../shared", "DESIGN.md", "seeds/"} {
			if i := strings.Index(text, bad); i >= 0 {
				t.Errorf("%s:%d names %q, which is not in the repository", f, 1+strings.Count(text[:i], "\n"), bad)
			}
		}
		if !strings.HasSuffix(f, ".md") {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			p := filepath.Join(filepath.Dir(f), target)
			if rel, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links %s, outside the repository", f, target)
			} else if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links %s, which does not exist", f, target)
			}
		}
	}
	readme, _ := os.ReadFile(filepath.Join(root, "README.md"))
	if !strings.Contains(string(readme), "(docs/architecture.md)") {
		t.Error("README.md does not link docs/architecture.md")
	}
}
