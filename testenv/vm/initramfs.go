package vm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Console markers printed by /init. They begin with "@@vmtest:" so they
// cannot be mistaken for go test output.
const (
	markerPrefix = "@@vmtest:"
	markerReady  = markerPrefix + "ready@@"
	initLogTag   = "vmtest-init: "
)

// busyboxPaths are where busybox-static installs the binary.
var busyboxPaths = []string{"/bin/busybox", "/usr/bin/busybox"}

// toolDirs are searched, in order, for DefaultTools. A tool keeps its host
// path in the VM.
var toolDirs = []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// etcFiles are copied from the host when present: names for ip, nft and
// tcpdump output.
var etcFiles = []string{"/etc/protocols", "/etc/services", "/etc/ethertypes", "/etc/iproute2"}

// buildInitramfs assembles stage/root (which already holds the test binaries
// under t/) and packs it into stage/initrd.gz.
func buildInitramfs(ctx context.Context, cfg *Config, k *kernel, stage string, pkgs []testPackage) (string, error) {
	root := filepath.Join(stage, "root")
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "run", "root", "mnt", "var"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}

	mods, err := installModules(ctx, cfg, k, root)
	if err != nil {
		return "", fmt.Errorf("modules: %w", err)
	}
	tools, err := installTools(cfg, root)
	if err != nil {
		return "", fmt.Errorf("host tools: %w", err)
	}
	if err := installBusybox(ctx, root, tools); err != nil {
		return "", fmt.Errorf("busybox: %w", err)
	}
	for _, f := range etcFiles {
		if _, err := os.Stat(f); err == nil {
			if err := copyTree(f, filepath.Join(root, f)); err != nil {
				return "", fmt.Errorf("copy %s: %w", f, err)
			}
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\ntcpdump:x:0:0:tcpdump:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
		"etc/hostname": "vmtest\n",
		"init":         initScript(cfg, mods, pkgs),
	}
	for name, content := range files {
		mode := os.FileMode(0o644)
		if name == "init" {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), mode); err != nil {
			return "", err
		}
	}

	out := filepath.Join(stage, "initrd.gz")
	if err := writeInitramfs(root, out); err != nil {
		return "", fmt.Errorf("pack: %w", err)
	}
	return out, nil
}

// installBusybox copies busybox-static to /bin/busybox and links its applets
// at their usual places, except where a host tool of the same name was
// installed: the real ip and ping are preferred.
func installBusybox(ctx context.Context, root string, tools map[string]bool) error {
	var bb string
	for _, p := range busyboxPaths {
		if isStatic(p) {
			bb = p
			break
		}
	}
	if bb == "" {
		return fmt.Errorf("no statically linked busybox at %v (install busybox-static)", busyboxPaths)
	}
	if err := copyFile(bb, filepath.Join(root, "bin", "busybox")); err != nil {
		return err
	}
	out, err := command(ctx, "", bb, "--list-full")
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		rel := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "/")
		if rel == "" || rel == "bin/busybox" || tools[path.Base(rel)] {
			continue
		}
		dst := filepath.Join(root, rel)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", dst); err != nil {
			return err
		}
	}
	return sc.Err()
}

// isStatic reports whether file is an ELF executable without an interpreter.
func isStatic(file string) bool {
	f, err := elf.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// installTools copies DefaultTools and their shared libraries (as ldd lists
// them, including the ELF interpreter) into root. It returns the names
// installed.
func installTools(cfg *Config, root string) (map[string]bool, error) {
	installed := map[string]bool{}
	libs := map[string]bool{}
	for _, name := range DefaultTools {
		src := ""
		if filepath.IsAbs(name) {
			if fi, err := os.Stat(name); err == nil && fi.Mode().IsRegular() {
				src = name
			}
		}
		for _, d := range toolDirs {
			if fi, err := os.Stat(filepath.Join(d, name)); err == nil && fi.Mode().IsRegular() {
				src = filepath.Join(d, name)
				break
			}
		}
		if src == "" {
			cfg.logf("vmtest: note: %s not found on the host; not available in the VM", name)
			continue
		}
		deps, err := sharedLibs(src)
		if err != nil {
			cfg.logf("vmtest: note: %s skipped: %v", src, err)
			continue
		}
		if err := copyFile(src, filepath.Join(root, src)); err != nil {
			return nil, err
		}
		for _, l := range deps {
			libs[l] = true
		}
		installed[path.Base(name)] = true
	}
	for l := range libs {
		if err := copyFile(l, filepath.Join(root, l)); err != nil {
			return nil, err
		}
	}
	return installed, nil
}

// sharedLibs returns the absolute paths of the libraries and interpreter
// that file needs.
func sharedLibs(file string) ([]string, error) {
	if isStatic(file) {
		return nil, nil
	}
	out, err := exec.Command("ldd", file).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd: %w", err)
	}
	libs, err := parseLdd(out)
	if err != nil {
		return nil, err
	}
	f, err := elf.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return nil, err
			}
			libs = append(libs, strings.TrimRight(string(b), "\x00"))
		}
	}
	return libs, nil
}

// parseLdd extracts absolute library paths from ldd output.
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("missing library: %s", line)
		}
		if _, after, ok := strings.Cut(line, "=>"); ok {
			line = strings.TrimSpace(after)
		}
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "/") {
			libs = append(libs, f[0])
		}
	}
	return libs, sc.Err()
}

// moduleOptions are passed to modprobe in the VM. Without them dummy and
// bonding create dummy0 and bond0 at load time, which would collide with
// links the tests create.
var moduleOptions = map[string]string{
	"dummy":   "numdummies=0",
	"bonding": "max_bonds=0",
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// testArgs returns the flags passed to every test binary, like go test -v
// would pass them.
func testArgs(cfg *Config) []string {
	args := []string{"-test.v=true", "-test.paniconexit0"}
	run := cfg.Run
	if cfg.Bench != "" && run == "" {
		run = "^$"
	}
	add := func(flag, v string) {
		if v != "" {
			args = append(args, "-test."+flag+"="+v)
		}
	}
	add("run", run)
	add("bench", cfg.Bench)
	add("benchtime", cfg.BenchTime)
	add("count", cfg.Count)
	add("timeout", cfg.Timeout)
	if cfg.Short {
		args = append(args, "-test.short=true")
	}
	if cfg.Benchmem {
		args = append(args, "-test.benchmem=true")
	}
	return append(args, cfg.Args...)
}

// initScript returns /init: set up the VM, load mods, run each test binary
// between start and exit markers, power off.
func initScript(cfg *Config, mods []string, pkgs []testPackage) string {
	var b strings.Builder
	b.WriteString(`#!/bin/sh
# Generated by github.com/nodeagent/nodeagent/testenv/vm.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TMPDIR=/tmp NODEAGENT_IN_VM=1
log() { echo "` + initLogTag + `$*"; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/netns /var/run
echo 1 > /proc/sys/kernel/printk
hostname vmtest
ip link set lo up || log "cannot bring lo up"
`)
	for _, m := range mods {
		opt := ""
		if o := moduleOptions[m]; o != "" {
			opt = " " + o
		}
		fmt.Fprintf(&b, "modprobe %s%s || log 'modprobe %s failed'\n", m, opt, m)
	}
	b.WriteString("echo " + shellQuote(markerReady) + "\n")
	var args []string
	for _, a := range testArgs(cfg) {
		args = append(args, shellQuote(a))
	}
	for i, p := range pkgs {
		fmt.Fprintf(&b, "cd %s\necho '%sstart %d@@'\n/t/%s.test %s\necho \"%sexit %d $?@@\"\n",
			shellQuote(p.cwd), markerPrefix, i, p.name, strings.Join(args, " "), markerPrefix, i)
	}
	b.WriteString("cd /\nsync\npoweroff -f\n")
	return b.String()
}

// writeInitramfs packs the tree at root into a gzip'ed newc cpio archive at
// out. Every entry is owned by root; /dev/console is added as a device node
// because the kernel opens it before running /init.
func writeInitramfs(root, out string) error {
	return writeCpioGz(out, func(cw *cpioWriter) error {
		return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil || rel == "." {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case fi.Mode().IsDir():
				if err := cw.add(rel, cpioDir|0o755, nil, 0, 0); err != nil {
					return err
				}
				if rel == "dev" {
					return cw.add("dev/console", cpioChar|0o600, nil, 5, 1)
				}
				return nil
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				return cw.add(rel, cpioSymlink|0o777, []byte(target), 0, 0)
			case fi.Mode().IsRegular():
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				return cw.add(rel, cpioRegular|uint32(fi.Mode().Perm()), data, 0, 0)
			default:
				return fmt.Errorf("%s: unsupported file type %v", p, fi.Mode())
			}
		})

	})
}

// writeCpioGz creates out as a gzip'ed newc cpio archive whose entries fill
// writes, and finishes it (trailer, gzip footer, flush) only if fill
// succeeded.
func writeCpioGz(out string, fill func(*cpioWriter) error) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	zw, err := gzip.NewWriterLevel(bw, gzip.BestSpeed)
	if err != nil {
		return err
	}
	cw := &cpioWriter{w: zw}
	if err := fill(cw); err != nil {
		return err
	}
	if err := cw.close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// File type bits of a cpio mode.
const (
	cpioDir     = 0o040000
	cpioChar    = 0o020000
	cpioRegular = 0o100000
	cpioSymlink = 0o120000
)

// cpioWriter writes the "newc" (070701) format that the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	n   int64 // bytes written, for padding
	err error
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	var n int
	n, c.err = c.w.Write(b)
	c.n += int64(n)
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// add writes one entry owned by root. dev is (major, minor) of a device
// node.
func (c *cpioWriter) add(name string, mode uint32, data []byte, major, minor uint32) error {
	return c.addOwned(name, mode, data, major, minor, 0, 0)
}

// addOwned writes one entry owned by uid and gid.
func (c *cpioWriter) addOwned(name string, mode uint32, data []byte, major, minor, uid, gid uint32) error {
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, uid, gid, nlink, 0, len(data), 0, 0, major, minor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
	c.write(data)
	c.pad()
	return c.err
}

func (c *cpioWriter) close() error {
	c.ino = 0
	return c.add("TRAILER!!!", 0, nil, 0, 0)
}

// copyFile copies the contents of src (following symlinks) to dst, keeping
// the permission bits and creating parent directories.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

// copyTree copies a file or directory tree, following symlinks. Special
// files are skipped.
func copyTree(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return nil
		}
		return copyFile(src, dst)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	var errs []error
	for _, e := range ents {
		errs = append(errs, copyTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())))
	}
	return errors.Join(errs...)
}
