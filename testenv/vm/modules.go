package vm

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// moduleIndex is what depmod wrote for the unpacked kernel.
type moduleIndex struct {
	path    map[string]string   // module name -> path relative to the modules dir
	deps    map[string][]string // module name -> names of all its hard dependencies
	builtin map[string]bool
	softPre map[string][]string // module name -> softdep "pre:" names or aliases
	softPst map[string][]string // module name -> softdep "post:" names or aliases
	aliases [][2]string         // (pattern, module name)
}

// modName turns a module path or name into the kernel's canonical name:
// base name without .ko and compression suffixes, '-' as '_'.
func modName(p string) string {
	b := path.Base(p)
	if i := strings.Index(b, ".ko"); i >= 0 {
		b = b[:i]
	}
	return strings.ReplaceAll(b, "-", "_")
}

// loadModuleIndex reads modules.dep, modules.builtin, modules.softdep and
// modules.alias from dir.
func loadModuleIndex(dir string) (*moduleIndex, error) {
	idx := &moduleIndex{
		path:    map[string]string{},
		deps:    map[string][]string{},
		builtin: map[string]bool{},
		softPre: map[string][]string{},
		softPst: map[string][]string{},
	}
	err := readLines(filepath.Join(dir, "modules.dep"), true, func(line string) error {
		mod, deps, ok := strings.Cut(line, ":")
		if !ok {
			return fmt.Errorf("modules.dep: bad line %q", line)
		}
		n := modName(mod)
		idx.path[n] = mod
		for _, d := range strings.Fields(deps) {
			idx.deps[n] = append(idx.deps[n], modName(d))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = readLines(filepath.Join(dir, "modules.builtin"), false, func(line string) error {
		idx.builtin[modName(line)] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = readLines(filepath.Join(dir, "modules.softdep"), false, func(line string) error {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "softdep" {
			return nil
		}
		n := modName(f[1])
		list := &idx.softPre // "softdep a b" without a section means pre
		for _, w := range f[2:] {
			switch w {
			case "pre:":
				list = &idx.softPre
			case "post:":
				list = &idx.softPst
			default:
				(*list)[n] = append((*list)[n], w)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = readLines(filepath.Join(dir, "modules.alias"), false, func(line string) error {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "alias" {
			idx.aliases = append(idx.aliases, [2]string{f[1], modName(f[2])})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return idx, nil
}

// readLines calls fn for each non-empty, non-comment line of file. A missing
// file is an error only if required is set.
func readLines(file string, required bool, fn func(string) error) error {
	f, err := os.Open(file)
	if err != nil {
		if !required && os.IsNotExist(err) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if err := fn(line); err != nil {
			return err
		}
	}
	return sc.Err()
}

// resolve maps a module name or alias (as used in softdep lines) to module
// names that exist as files. Built-in or unknown names yield nothing.
func (idx *moduleIndex) resolve(name string) []string {
	n := modName(name)
	if _, ok := idx.path[n]; ok {
		return []string{n}
	}
	var out []string
	for _, a := range idx.aliases {
		if ok, _ := path.Match(a[0], name); ok {
			if _, exists := idx.path[a[1]]; exists {
				out = append(out, a[1])
			}
		}
	}
	return out
}

// closure returns the modules needed to load want, in load order: soft
// "pre" dependencies and hard dependencies before each module, soft "post"
// dependencies after it. Built-in names are dropped; other unknown names are
// returned in missing.
func (idx *moduleIndex) closure(want []string) (order, missing []string) {
	seen := map[string]bool{}
	var visit func(n string)
	visit = func(n string) {
		if seen[n] {
			return
		}
		seen[n] = true
		for _, s := range idx.softPre[n] {
			for _, r := range idx.resolve(s) {
				visit(r)
			}
		}
		// modules.dep lists the transitive dependencies, nearest first;
		// visiting them recursively orders them for loading.
		for i := len(idx.deps[n]) - 1; i >= 0; i-- {
			visit(idx.deps[n][i])
		}
		order = append(order, n)
		for _, s := range idx.softPst[n] {
			for _, r := range idx.resolve(s) {
				visit(r)
			}
		}
	}
	for _, w := range want {
		n := modName(w)
		switch {
		case idx.path[n] != "":
			visit(n)
		case idx.builtin[n]:
		default:
			missing = append(missing, w)
		}
	}
	return order, missing
}

// installModules copies the closure of mods from the kernel's module tree
// into root, decompressing them (busybox modprobe loads modules with
// init_module from memory, and not every build can decompress), then runs
// depmod on root. It returns the modules in load order.
func installModules(ctx context.Context, cfg *Config, k *kernel, root string) ([]string, error) {
	idx, err := loadModuleIndex(k.modulesDir())
	if err != nil {
		return nil, fmt.Errorf("read module index: %w", err)
	}
	order, missing := idx.closure(DefaultModules)
	for _, m := range missing {
		cfg.debugf("vmtest: module %s is neither a module nor built in; skipped", m)
	}
	extra, missing := idx.closure(nonEmpty(cfg.ExtraModules))
	if len(missing) > 0 {
		return nil, fmt.Errorf("modules %q are neither modules nor built into %s", missing, k.version)
	}
	seen := map[string]bool{}
	for _, m := range order {
		seen[m] = true
	}
	for _, m := range extra {
		if !seen[m] {
			order = append(order, m)
		}
	}

	dst := filepath.Join(root, "lib", "modules", k.version)
	for _, m := range order {
		rel := idx.path[m]
		if err := installModule(filepath.Join(k.modulesDir(), rel), filepath.Join(dst, rel)); err != nil {
			return nil, fmt.Errorf("install module %s: %w", m, err)
		}
	}
	for _, f := range []string{"modules.builtin", "modules.order"} {
		if err := copyFile(filepath.Join(k.modulesDir(), f), filepath.Join(dst, f)); err != nil {
			return nil, err
		}
	}
	if _, err := command(ctx, "", "depmod", "-b", root, k.version); err != nil {
		return nil, fmt.Errorf("depmod: %w", err)
	}
	cfg.debugf("vmtest: %d modules: %s", len(order), strings.Join(order, " "))
	return order, nil
}

// nonEmpty returns mods with empty names removed.
func nonEmpty(mods []string) []string {
	var out []string
	for _, m := range mods {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// installModule copies one module file, decompressing .ko.gz, .ko.xz and
// .ko.zst to .ko. The destination name drops the suffix; depmod on the new
// root records that name.
func installModule(src, dst string) error {
	var decompress []string
	switch {
	case strings.HasSuffix(src, ".ko"):
		return copyFile(src, dst)
	case strings.HasSuffix(src, ".ko.gz"):
	case strings.HasSuffix(src, ".ko.xz"):
		decompress = []string{"xz", "-dc"}
	case strings.HasSuffix(src, ".ko.zst"):
		decompress = []string{"zstd", "-dcq"}
	default:
		return fmt.Errorf("unknown module file type %s", src)
	}
	dst = dst[:strings.LastIndex(dst, ".ko")+3]
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	if decompress == nil {
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		zr, err := gzip.NewReader(in)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		if _, err := io.Copy(out, zr); err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		return out.Close()
	}
	cmd := exec.Command(decompress[0], append(decompress[1:], src)...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s (needed to decompress modules): %w: %s", decompress[0], src, err, stderr.String())
	}
	return out.Close()
}
