// Command genman writes the man pages from the code, so they cannot drift
// from it:
//
//   - nodeagent(8) and nodeagentctl(1): the prose is in
//     packaging/man/nodeagent.8.in and nodeagentctl.1.in; the SYNOPSIS and OPTIONS sections are rendered
//     from the binaries' own --help, which is the usage text the flag
//     parsers print (and which their tests keep in step with the flag sets).
//   - nodeagent.yaml(5): rendered from netcfg/config/types.go, by walking
//     the Config struct's fields, their yaml tags, Go types and doc
//     comments with go/ast.
//
// Usage, from the repository root:
//
//	go run ./packaging/genman [-nodeagent BIN] [-nodeagentctl BIN] [-o DIR]
//
// Without -nodeagent/-nodeagentctl it builds the binaries itself. -o
// defaults to docs/, whose committed pages TestGeneratedManPages compares
// with a fresh run: after changing a usage text or the config schema, run
// this and commit docs/.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

func main() {
	nodeagent := flag.String("nodeagent", "", "the nodeagent binary whose --help is rendered (default: build it)")
	ctl := flag.String("nodeagentctl", "", "the nodeagentctl binary (default: build it)")
	out := flag.String("o", "docs", "output directory")
	root := flag.String("root", ".", "the repository root")
	flag.Parse()
	if err := run(*root, *nodeagent, *ctl, *out); err != nil {
		fmt.Fprintln(os.Stderr, "genman:", err)
		os.Exit(1)
	}
}

func run(root, nodeagent, ctl, out string) error {
	if nodeagent == "" || ctl == "" {
		tmp, err := os.MkdirTemp("", "genman-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if nodeagent == "" {
			nodeagent = filepath.Join(tmp, "nodeagent")
			if err := build(root, "./cmd/nodeagent", nodeagent); err != nil {
				return err
			}
		}
		if ctl == "" {
			ctl = filepath.Join(tmp, "nodeagentctl")
			if err := build(root, "./cmd/nodeagentctl", ctl); err != nil {
				return err
			}
		}
	}
	pages, err := Generate(root, map[string]string{"nodeagent": nodeagent, "nodeagentctl": ctl})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for name, text := range pages {
		if err := os.WriteFile(filepath.Join(out, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func build(root, pkg, out string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
