package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// kernel is an unpacked linux-image package in the cache.
type kernel struct {
	pkg     string // e.g. linux-image-6.1.0-57-amd64
	version string // the module directory name, e.g. 6.1.0-57-amd64
	dir     string // the unpacked tree: boot/, lib/modules/<version>/
	image   string // what qemu boots: vmlinux if it could be made, else vmlinuz
}

func (k *kernel) vmlinuz() string { return filepath.Join(k.dir, "boot", "vmlinuz-"+k.version) }

func (k *kernel) vmlinux() string { return filepath.Join(k.dir, "boot", "vmlinux-"+k.version) }

func (k *kernel) modulesDir() string { return filepath.Join(k.dir, "lib", "modules", k.version) }

// fetchKernel resolves the kernel package and its candidate version, and
// unpacks it into the cache unless a previous run already did. Unpacking
// happens in a temporary directory that is renamed into place last, so an
// interrupted run leaves no half-filled entry behind. If apt cannot resolve
// or download the package, fetchKernel runs apt-get update and tries once
// more: the package lists may be missing or stale.
func fetchKernel(ctx context.Context, cfg *Config) (*kernel, error) {
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("create cache directory: %w", err)
	}
	removeStaleTemps(cfg.CacheDir)

	k, err := fetchKernelOnce(ctx, cfg)
	var aerr *aptError
	if errors.As(err, &aerr) {
		cfg.logf("vmtest: %v; running apt-get update", err)
		if _, uerr := command(ctx, "", "apt-get", "-q", "update"); uerr != nil {
			return nil, errors.Join(err, fmt.Errorf("apt-get update: %w", uerr))
		}
		k, err = fetchKernelOnce(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}

	k.image = k.vmlinuz()
	if err := ensureVmlinux(k); err != nil {
		cfg.logf("vmtest: note: booting the compressed kernel, which takes about 7s longer under TCG: %v", err)
	} else {
		k.image = k.vmlinux()
	}
	return k, nil
}

// aptError is a failure that apt-get update may cure.
type aptError struct{ err error }

func (e *aptError) Error() string { return e.err.Error() }

func (e *aptError) Unwrap() error { return e.err }

func fetchKernelOnce(ctx context.Context, cfg *Config) (*kernel, error) {
	pkg, version, err := resolveKernel(ctx, cfg.KernelPackage)
	if err != nil {
		return nil, &aptError{err}
	}
	dir := filepath.Join(cfg.CacheDir, sanitize(pkg+"_"+version))
	if k, err := openKernel(pkg, dir); err == nil {
		cfg.debugf("vmtest: using cached %s %s", pkg, version)
		return k, nil
	}
	cfg.logf("vmtest: fetching %s %s into %s", pkg, version, cfg.CacheDir)
	return unpackKernel(ctx, cfg, pkg, version, dir)
}

// unpackKernel downloads and unpacks pkg into dir.
func unpackKernel(ctx context.Context, cfg *Config, pkg, version, dir string) (*kernel, error) {
	tmp, err := os.MkdirTemp(cfg.CacheDir, ".tmp-")
	if err != nil {
		return nil, fmt.Errorf("create temporary directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	if err := aptDownload(ctx, tmp, pkg, version); err != nil {
		return nil, &aptError{err}
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("apt-get download %s left %d .deb files, want 1", pkg, len(debs))
	}
	root := filepath.Join(tmp, "root")
	if _, err := command(ctx, "", "dpkg-deb", "-x", debs[0], root); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", debs[0], err)
	}
	if err := os.Remove(debs[0]); err != nil {
		return nil, err
	}
	// A merged-/usr package ships usr/lib/modules; keep one layout.
	if _, err := os.Stat(filepath.Join(root, "lib", "modules")); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Join(root, "lib"), 0o755); err != nil {
			return nil, err
		}
		if err := os.Rename(filepath.Join(root, "usr", "lib", "modules"), filepath.Join(root, "lib", "modules")); err != nil {
			return nil, fmt.Errorf("%s has no lib/modules: %w", pkg, err)
		}
	}
	kver, err := moduleVersion(root)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pkg, err)
	}
	// The package leaves modules.dep to its postinst; generate it here,
	// once, so the module closure can be computed from it.
	if _, err := command(ctx, "", "depmod", "-b", root, kver); err != nil {
		return nil, fmt.Errorf("depmod for %s: %w", pkg, err)
	}
	if err := os.Rename(root, dir); err != nil {
		// Another run may have won the race; use its result.
		if k, kerr := openKernel(pkg, dir); kerr == nil {
			return k, nil
		}
		return nil, fmt.Errorf("move unpacked kernel into the cache: %w", err)
	}
	return openKernel(pkg, dir)
}

// openKernel checks that dir holds a complete unpacked kernel.
func openKernel(pkg, dir string) (*kernel, error) {
	kver, err := moduleVersion(dir)
	if err != nil {
		return nil, err
	}
	k := &kernel{pkg: pkg, version: kver, dir: dir}
	for _, f := range []string{k.vmlinuz(), filepath.Join(k.modulesDir(), "modules.dep")} {
		if _, err := os.Stat(f); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// moduleVersion returns the single directory name under root/lib/modules.
func moduleVersion(root string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(root, "lib", "modules"))
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	if len(names) != 1 {
		return "", fmt.Errorf("want one directory in lib/modules, found %q", names)
	}
	return names[0], nil
}

// resolveKernel returns the kernel package (pkg, or the linux-image package
// that linux-image-amd64 depends on, as apt-cache depends shows it) and its
// candidate version. apt-cache takes over a second per call where the
// package cache is not kept (as in Docker images), so the metapackage's
// exact version dependency is used when it has one.
func resolveKernel(ctx context.Context, pkg string) (name, version string, err error) {
	if pkg == "" {
		out, err := command(ctx, "", "apt-cache", "show", "--no-all-versions", "linux-image-amd64")
		if err != nil {
			return "", "", fmt.Errorf("resolve linux-image-amd64: %w", err)
		}
		f := parseControl(out)
		if pkg, version, err = parseKernelDepends(f["Depends"]); err != nil {
			return "", "", fmt.Errorf("resolve linux-image-amd64: %w", err)
		}
		if version != "" {
			return pkg, version, nil
		}
	}
	out, err := command(ctx, "", "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return "", "", fmt.Errorf("version of %s: %w", pkg, err)
	}
	if version = parseControl(out)["Version"]; version == "" {
		return "", "", fmt.Errorf("version of %s: no Version field in apt-cache show output", pkg)
	}
	return pkg, version, nil
}

// parseControl returns the single-line fields of the first stanza of
// apt-cache show output.
func parseControl(out []byte) map[string]string {
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, " ") {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// parseKernelDepends finds the linux-image package in a Depends field, and
// its version if the dependency is exact ("(= 6.1.192-3)").
func parseKernelDepends(depends string) (pkg, version string, err error) {
	for _, d := range strings.Split(depends, ",") {
		alt, _, _ := strings.Cut(d, "|")
		name, constraint, _ := strings.Cut(strings.TrimSpace(alt), " ")
		if !strings.HasPrefix(name, "linux-image-") {
			continue
		}
		constraint = strings.TrimSpace(constraint)
		if v, ok := strings.CutPrefix(constraint, "(="); ok {
			version = strings.TrimSpace(strings.TrimSuffix(v, ")"))
		}
		return name, version, nil
	}
	return "", "", fmt.Errorf("no linux-image package in Depends %q", depends)
}

func aptDownload(ctx context.Context, dir, pkg, version string) error {
	if _, err := command(ctx, dir, "apt-get", "-q", "download", pkg+"="+version); err != nil {
		return fmt.Errorf("apt-get download %s=%s: %w", pkg, version, err)
	}
	return nil
}

// removeStaleTemps removes temporary directories that interrupted runs left
// in the cache. Recent ones may belong to a concurrent run and are kept.
func removeStaleTemps(cache string) {
	tmps, _ := filepath.Glob(filepath.Join(cache, ".tmp-*"))
	for _, t := range tmps {
		if fi, err := os.Stat(t); err == nil && time.Since(fi.ModTime()) > time.Hour {
			os.RemoveAll(t)
		}
	}
}

// command runs name with args non-interactively in dir and returns its
// standard output. The error includes the command's standard error.
func command(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	return commandEnv(ctx, dir, nil, name, args...)
}

// commandEnv is command with extra environment variables.
func commandEnv(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg != "" {
			return out, fmt.Errorf("%s: %w: %s", name, err, msg)
		}
		return out, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

// sanitize makes s usable as a file name.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_', r == '+':
			return r
		}
		return '_'
	}, s)
}
