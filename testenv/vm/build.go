package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// testPackage is one package named on the command line.
type testPackage struct {
	importPath string
	dir        string // source directory
	moduleDir  string // root of the package's module; empty if none
	name       string // sanitized import path; the binary is /t/<name>.test
	cwd        string // working directory in the VM
	binary     string // host path of the test binary; empty if no tests
	buildErr   error  // why go test -c failed
}

// buildTests expands cfg.Packages with go list and compiles each package that
// has test files (recording, not returning, compile errors) into stage/root/t/<name>.test, with its testdata copied into
// the package's working directory under stage/root. It also copies
// cfg.Files.
func buildTests(ctx context.Context, cfg *Config, stage string) ([]testPackage, error) {
	if len(cfg.Packages) == 0 {
		return nil, errors.New("no packages given")
	}
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{len .TestGoFiles}}\t{{len .XTestGoFiles}}\t{{with .Module}}{{.Dir}}{{end}}"}, cfg.Packages...)
	out, err := command(ctx, cfg.Dir, "go", args...)
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	pkgs, err := parseGoList(out)
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	root := filepath.Join(stage, "root")
	tdir := filepath.Join(root, "t")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return nil, err
	}
	if err := copyFiles(ctx, cfg, root); err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for i := range pkgs {
		p := &pkgs[i]
		if p.binary == "" {
			fmt.Fprintf(cfg.Out, "?   \t%s\t[no test files]\n", p.importPath)
			continue
		}
		p.name = sanitize(p.importPath)
		for n := 2; used[p.name]; n++ {
			p.name = fmt.Sprintf("%s_%d", sanitize(p.importPath), n)
		}
		used[p.name] = true
		p.binary = filepath.Join(tdir, p.name+".test")

		cfg.debugf("vmtest: go test -c %s", p.importPath)
		args := []string{"test", "-c", "-o", p.binary}
		if cfg.Tags != "" {
			args = append(args, "-tags", cfg.Tags)
		}
		args = append(args, p.importPath)
		// CGO_ENABLED=0 makes static binaries that need no libc in the VM.
		// Like go test, a package that does not build fails, and the
		// others still run.
		if _, err := commandEnv(ctx, cfg.Dir, []string{"CGO_ENABLED=0"}, "go", args...); err != nil {
			p.buildErr = fmt.Errorf("go test -c %s: %w", p.importPath, err)
			p.binary = ""
			cfg.logf("vmtest: %v", p.buildErr)
			fmt.Fprintf(cfg.Out, "FAIL\t%s [build failed]\n", p.importPath)
			continue
		}
		if _, err := os.Stat(p.binary); err != nil {
			// go test -c writes nothing for a package without tests.
			fmt.Fprintf(cfg.Out, "?   \t%s\t[no test files]\n", p.importPath)
			p.binary = ""
			continue
		}
		// Mirror the package's place in its module, so that paths
		// like ../../examples work when copied there with cfg.Files.
		p.cwd = "/t/" + p.name
		if p.moduleDir != "" {
			if rel, err := filepath.Rel(p.moduleDir, p.dir); err == nil && filepath.IsLocal(rel) {
				p.cwd = path.Join("/src", filepath.ToSlash(rel))
			}
		}
		cwd := filepath.Join(root, p.cwd)
		if err := os.MkdirAll(cwd, 0o755); err != nil {
			return nil, err
		}
		td := filepath.Join(p.dir, "testdata")
		if fi, err := os.Stat(td); err == nil && fi.IsDir() {
			if err := copyTree(td, filepath.Join(cwd, "testdata")); err != nil {
				return nil, fmt.Errorf("copy testdata of %s: %w", p.importPath, err)
			}
		}
	}
	return pkgs, nil
}

// parseGoList parses the go list template output used by buildTests. A
// package's binary field is set to "+" when it has test files.
func parseGoList(out []byte) ([]testPackage, error) {
	var pkgs []testPackage
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			return nil, fmt.Errorf("unexpected line %q", sc.Text())
		}
		p := testPackage{importPath: f[0], dir: f[1], moduleDir: f[4]}
		if f[2] != "0" || f[3] != "0" {
			p.binary = "+"
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, sc.Err()
}

// copyFiles copies cfg.Files from the main module's root to root/src.
func copyFiles(ctx context.Context, cfg *Config, root string) error {
	files := nonEmpty(cfg.Files)
	if len(files) == 0 {
		return nil
	}
	out, err := command(ctx, cfg.Dir, "go", "list", "-m", "-f", "{{.Dir}}")
	if err != nil {
		return fmt.Errorf("find the main module: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	for _, f := range files {
		f = filepath.Clean(f)
		if !filepath.IsLocal(f) {
			return fmt.Errorf("file %s is not inside the main module", f)
		}
		if err := copyTree(filepath.Join(mod, f), filepath.Join(root, "src", f)); err != nil {
			return fmt.Errorf("copy %s: %w", f, err)
		}
	}
	return nil
}
