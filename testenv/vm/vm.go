// Package vm runs Go test binaries inside a qemu virtual machine that boots
// Debian's own kernel (the one apt resolves for linux-image-amd64), so that
// privileged tests can use kernel features the host may lack: 8021q VLANs,
// kernel WireGuard, dummy links and nf_tables NAT.
//
// A run has four steps, each reported by name when it fails:
//
//  1. kernel: the linux-image package is fetched with apt-get download and
//     unpacked once into a cache directory, then reused.
//  2. build: each package is compiled with CGO_ENABLED=0 go test -c.
//  3. initramfs: busybox-static, the needed kernel modules with their
//     dependency closure, a few host tools (ip, nft, wg, tcpdump, ping) with
//     their shared libraries, the test binaries with their testdata, and a
//     generated /init are packed into a gzip'ed newc cpio archive.
//  4. boot: qemu (TCG; KVM is not used) boots the kernel; /init runs each test
//     binary with -test.v and prints markers on the serial console. The host
//     passes the test output through unchanged and prints a go test style
//     "ok" or "FAIL" line per package.
//
// Inside the VM the environment variable NODEAGENT_IN_VM is set to 1, the
// working directory of a test binary holds a copy of its package's testdata
// directory (as with go test), /tmp and /run are tmpfs, and /run/netns exists.
//
// The working directory mirrors the package's place in its module:
// /src/netcfg/config for github.com/nodeagent/nodeagent/netcfg/config. Files
// that tests read outside testdata, such as ../../examples/homelab.yaml, can
// be copied to the same relative place with Config.Files.
package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// DefaultModules lists the kernel modules loaded in the VM before the tests
// run. Names that are built into the kernel, or that do not exist as modules
// at all (nft_counter lives inside nf_tables), are skipped. xfrm_user is
// there because vishvananda/netlink opens a NETLINK_XFRM socket for every
// handle, and fails without it.
var DefaultModules = []string{
	"8021q", "wireguard", "dummy", "macvlan", "ipvlan", "veth", "bridge", "tun", "xfrm_user",
	"nf_tables", "nft_nat", "nft_masq", "nft_ct", "nft_chain_nat", "nf_nat",
	"nf_conntrack", "nft_counter", "nft_fib_inet", "nft_fib_ipv4",
	"nft_fib_ipv6", "nft_reject_inet", "nft_limit", "nf_reject_ipv4",
	"nf_reject_ipv6", "nft_redir", "nft_objref", "af_packet", "ipv6",
}

// DefaultTools lists the host programs copied into the initramfs, with their
// shared libraries, so tests can observe state and run baselines. A name is
// looked up in toolDirs, an absolute path taken as it is (the CNI plugins
// that attach pods, which keep their path in the VM). A missing tool is
// skipped with a note.
var DefaultTools = []string{"ip", "nft", "wg", "tcpdump", "ping", "ss", "/usr/lib/cni/macvlan", "/usr/lib/cni/static"}

// Config describes one run.
type Config struct {
	// Packages are the go test package patterns, resolved with go list in
	// Dir.
	Packages []string
	// Dir is the directory the go commands run in; empty means the current
	// directory.
	Dir string
	// Tags is passed to go test -c as -tags.
	Tags string
	// Files are files or directories, relative to the main module's root,
	// copied into the VM under /src, where they keep their place relative
	// to the tests' working directories.
	Files []string

	// Run, Bench, BenchTime, Count and Timeout are passed to every test
	// binary as -test.run, -test.bench, -test.benchtime, -test.count and
	// -test.timeout when non-empty. As with go test, Bench without Run
	// runs no tests: -test.run=^$.
	Run, Bench, BenchTime, Count, Timeout string
	// Short and Benchmem add -test.short and -test.benchmem.
	Short, Benchmem bool
	// Args are appended to every test binary's arguments (go test -args).
	Args []string

	// CacheDir holds the unpacked kernel packages.
	CacheDir string
	// KernelPackage overrides the kernel package; empty means the package
	// that apt-cache depends linux-image-amd64 names.
	KernelPackage string
	// ExtraModules are loaded in addition to DefaultModules; unlike those,
	// each must exist as a module or be built in.
	ExtraModules []string

	// MemoryMiB and CPUs size the VM.
	MemoryMiB, CPUs int
	// Append is added to the kernel command line.
	Append string
	// VMTimeout bounds the whole boot and test run; qemu is killed after it.
	VMTimeout time.Duration
	// Keep leaves the staging directory in place and reports its path.
	Keep bool
	// Verbose streams the boot console and progress notes to Log.
	Verbose bool

	// Out receives the test output; Log receives notes and the boot
	// console. Nil means os.Stdout and os.Stderr.
	Out, Log io.Writer
}

// PackageResult is the outcome of one test binary.
type PackageResult struct {
	ImportPath string
	// NoTests reports whether the package has no test files, so nothing
	// ran.
	NoTests bool
	// BuildFailed reports whether go test -c failed.
	BuildFailed bool
	// Finished reports whether the binary's exit marker was seen.
	Finished bool
	// ExitCode is the test binary's exit status inside the VM.
	ExitCode int
	// Elapsed is the host-measured time between the start and exit
	// markers.
	Elapsed time.Duration
}

// Passed reports whether the package passed or had no tests.
func (p PackageResult) Passed() bool {
	return !p.BuildFailed && (p.NoTests || (p.Finished && p.ExitCode == 0))
}

// Result is the outcome of Run.
type Result struct {
	KernelVersion string
	InitrdBytes   int64
	// Boot is the time from starting qemu to /init finishing its setup.
	Boot time.Duration
	// Total is the time Run took.
	Total    time.Duration
	Packages []PackageResult
	// StageDir is set when Config.Keep is true.
	StageDir string
}

// Passed reports whether every package passed.
func (r *Result) Passed() bool {
	for _, p := range r.Packages {
		if !p.Passed() {
			return false
		}
	}
	return true
}

// Run builds the test binaries and the initramfs, boots the VM and runs the
// tests. It returns an error when a step fails, a package does not build, or
// the VM stops before every binary has finished; failing tests are reported
// through Result.Passed.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	cfg.setDefaults()
	res := &Result{}

	k, err := fetchKernel(ctx, &cfg)
	if err != nil {
		return res, fmt.Errorf("kernel: %w", err)
	}
	res.KernelVersion = k.version
	cfg.debugf("vmtest: kernel %s (%s)", k.version, k.dir)

	stage, err := os.MkdirTemp("", "vmtest-")
	if err != nil {
		return res, fmt.Errorf("staging directory: %w", err)
	}
	if cfg.Keep {
		res.StageDir = stage
	} else {
		defer os.RemoveAll(stage)
	}

	pkgs, err := buildTests(ctx, &cfg, stage)
	if err != nil {
		return res, fmt.Errorf("build: %w", err)
	}
	var runnable []testPackage
	var broken []string
	for _, p := range pkgs {
		res.Packages = append(res.Packages, PackageResult{
			ImportPath:  p.importPath,
			NoTests:     p.binary == "" && p.buildErr == nil,
			BuildFailed: p.buildErr != nil,
		})
		if p.binary != "" {
			runnable = append(runnable, p)
		}
		if p.buildErr != nil {
			broken = append(broken, p.importPath)
		}
	}
	// Errors from go test -c were printed as they happened; the run
	// still fails with them after the other packages ran.
	var buildErr error
	if len(broken) > 0 {
		buildErr = fmt.Errorf("build: go test -c failed for %s", strings.Join(broken, ", "))
	}
	if len(runnable) == 0 {
		res.Total = time.Since(start)
		return res, buildErr
	}

	initrd, err := buildInitramfs(ctx, &cfg, k, stage, runnable)
	if err != nil {
		return res, errors.Join(buildErr, fmt.Errorf("initramfs: %w", err))
	}
	if fi, err := os.Stat(initrd); err == nil {
		res.InitrdBytes = fi.Size()
	}
	cfg.debugf("vmtest: initrd %.1f MiB, built in %.1fs", float64(res.InitrdBytes)/(1<<20), time.Since(start).Seconds())

	err = boot(ctx, &cfg, k, initrd, runnable, res)
	res.Total = time.Since(start)
	if err != nil {
		return res, errors.Join(buildErr, fmt.Errorf("boot: %w", err))
	}
	return res, buildErr
}

func (c *Config) setDefaults() {
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Log == nil {
		c.Log = os.Stderr
	}
	if c.CacheDir == "" {
		c.CacheDir = DefaultCacheDir()
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 2048
	}
	if c.CPUs == 0 {
		c.CPUs = 2
	}
	if c.VMTimeout == 0 {
		c.VMTimeout = 30 * time.Minute
	}
}

// DefaultCacheDir returns $NODEAGENT_VM_CACHE, or /var/cache/nodeagent-vm.
func DefaultCacheDir() string {
	if d := os.Getenv("NODEAGENT_VM_CACHE"); d != "" {
		return d
	}
	return "/var/cache/nodeagent-vm"
}

// logf writes a note to the log.
func (c *Config) logf(format string, args ...any) {
	fmt.Fprintf(c.Log, format+"\n", args...)
}

// debugf writes a note to the log in verbose mode only.
func (c *Config) debugf(format string, args ...any) {
	if c.Verbose {
		c.logf(format, args...)
	}
}
