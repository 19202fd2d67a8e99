// Package debroot builds, once, and caches Debian roots of suites other
// than the host's (trixie, sid) holding the download clients users run
// today, so the tests can run those versions' real binaries under chroot
// inside a test's network namespace (see Command).
//
// A root is made by mmdebstrap from the archive apt already uses here,
// into a temporary directory beside the cache entry, and renamed into
// place when complete: a build cut short leaves no entry, and a reader
// never sees half a root. Builds are serialised by a lock file, so
// packages tested in parallel build each root once.
package debroot

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Clients are the packages every root holds: one root per suite for both
// download clients the port hooks are tested against (one build, one
// cache entry, instead of one per client).
var Clients = []string{"qbittorrent-nox", "transmission-daemon", "ca-certificates"}

// Suites are the suites the tests use beyond the host's bookworm.
var Suites = []string{"trixie", "sid"}

// format changes whenever the way a root is made changes, so a stale cache
// entry is not reused.
const format = "1"

// DefaultCacheDir is $NODEAGENT_ROOT_CACHE, or /var/cache/nodeagent-roots.
func DefaultCacheDir() string {
	if d := os.Getenv("NODEAGENT_ROOT_CACHE"); d != "" {
		return d
	}
	return "/var/cache/nodeagent-roots"
}

// Options say which root to build and where.
type Options struct {
	Suite    string
	Packages []string // default Clients
	CacheDir string   // default DefaultCacheDir()
	// Mirror is the archive (default: the one apt uses here, else
	// deb.debian.org).
	Mirror string
	// Log receives progress notes (default os.Stderr).
	Log io.Writer
}

// Path is where the root of o is cached (built or not).
func Path(o Options) string {
	o = o.withDefaults()
	pkgs := slices.Clone(o.Packages)
	slices.Sort(pkgs)
	sum := sha256.Sum256([]byte(format + "\n" + o.Suite + "\n" + strings.Join(pkgs, ",")))
	return filepath.Join(o.CacheDir, o.Suite+"-"+hex.EncodeToString(sum[:6]))
}

func (o Options) withDefaults() Options {
	if len(o.Packages) == 0 {
		o.Packages = Clients
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir()
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	return o
}

// Build returns the cached root of o, building it first when it is not
// there. Concurrent callers (other test binaries) wait for one build.
func Build(ctx context.Context, o Options) (string, error) {
	o = o.withDefaults()
	dst := Path(o)
	if complete(dst) {
		return dst, nil
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return "", err
	}
	// One lock per suite: builds of different suites may run at once
	// (mostly downloads), two of one suite never.
	lock, err := os.OpenFile(filepath.Join(o.CacheDir, ".lock-"+o.Suite), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if complete(dst) { // built while this waited for the lock
		return dst, nil
	}
	// What a killed build of this suite left (the lock is ours: none runs).
	if old, _ := filepath.Glob(filepath.Join(o.CacheDir, ".build-"+o.Suite+"-*")); len(old) > 0 {
		for _, d := range old {
			os.RemoveAll(d)
		}
	}
	tmp, err := os.MkdirTemp(o.CacheDir, ".build-"+o.Suite+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "root")
	mirror := o.Mirror
	if mirror == "" {
		mirror = aptMirror()
	}
	start := time.Now()
	fmt.Fprintf(o.Log, "debroot: building the %s root (%s) with mmdebstrap from %s into %s\n", o.Suite, strings.Join(o.Packages, ","), mirror, dst)
	// sid's Release is past its Valid-Until on a snapshot-like archive;
	// the packages are still checked against the archive's keys.
	args := []string{"--quiet", "--variant=apt", `--aptopt=Acquire::Check-Valid-Until "false"`,
		"--include=" + strings.Join(o.Packages, ","), o.Suite, root, mirror}
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("mmdebstrap %s (install mmdebstrap; make test does): %v\n%s", o.Suite, err, tail(out.String(), 2000))
	}
	// Where a test binds its own directories (Command): a mount point
	// made here, so a test never writes the cached root.
	if err := os.MkdirAll(filepath.Join(root, MountDir), 0o755); err != nil {
		return "", err
	}
	// The mark that the root is whole, written last: complete() reads it.
	if err := os.WriteFile(filepath.Join(root, ".debroot"), []byte(strings.Join(o.Packages, ",")+"\n"), 0o644); err != nil {
		return "", err
	}
	os.RemoveAll(dst) // an incomplete entry of an older, killed build
	if err := os.Rename(root, dst); err != nil {
		return "", err
	}
	fmt.Fprintf(o.Log, "debroot: %s root built in %s\n", o.Suite, time.Since(start).Round(time.Second))
	return dst, nil
}

func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, ".debroot"))
	return err == nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// aptMirror is the first URIs: of apt's deb822 sources whose suites
// include bookworm, else the first deb line's URI, else deb.debian.org.
func aptMirror() string {
	for _, f := range []string{"/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			if u, ok := strings.CutPrefix(l, "URIs:"); ok {
				if fs := strings.Fields(u); len(fs) > 0 && !strings.Contains(fs[0], "security") {
					return fs[0]
				}
			}
			if fs := strings.Fields(l); len(fs) >= 3 && fs[0] == "deb" {
				i := 1
				if strings.HasPrefix(fs[1], "[") {
					for i < len(fs) && !strings.HasSuffix(fs[i], "]") {
						i++
					}
					i++
				}
				if i < len(fs) && !strings.Contains(fs[i], "security") {
					return fs[i]
				}
			}
		}
	}
	return "http://deb.debian.org/debian"
}

// Version is the installed version of pkg in root, from its dpkg status.
func Version(root, pkg string) (string, error) {
	out, err := exec.Command("dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f=${Version}", pkg).Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-query %s in %s: %w", pkg, root, err)
	}
	return string(out), nil
}

// MountDir is the directory of every root (made empty by Build) where
// Command binds a test's own directory.
const MountDir = "/srv/nodeagent-test"

// Command runs argv (a path inside root) chrooted into root, in network
// namespace ns when it is not "", with /proc, /dev and a tmpfs /tmp in the
// root and the host directory dir (when not "") bound at MountDir. ip
// netns exec gives the command a mount namespace of its own, so none of
// those mounts is seen outside it; without a namespace, unshare makes
// one. What the program writes goes to dir or the tmpfs: the cached root
// is not written.
func Command(ns, root, dir string, env []string, argv ...string) *exec.Cmd {
	var sb strings.Builder
	sb.WriteString("set -e; ")
	fmt.Fprintf(&sb, "mount -t proc proc %s; mount --rbind /dev %s; mount -t tmpfs -o mode=1777 tmpfs %s; ", q(root+"/proc"), q(root+"/dev"), q(root+"/tmp"))
	if dir != "" {
		fmt.Fprintf(&sb, "mount --bind %s %s; ", q(dir), q(root+MountDir))
	}
	sb.WriteString("exec chroot " + q(root))
	for _, a := range argv {
		sb.WriteString(" " + q(a))
	}
	var args []string
	if ns != "" {
		args = []string{"ip", "netns", "exec", ns, "sh", "-c", sb.String()}
	} else {
		args = []string{"unshare", "--mount", "--propagation", "slave", "sh", "-c", sb.String()}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	return cmd
}

// q quotes s for sh.
func q(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Require returns the cached root of suite with the download clients,
// building it when missing (about two minutes, once per machine: make
// test builds the roots before the tests, so this is for a test run on
// its own).
func Require(t testing.TB, suite string) string {
	t.Helper()
	if _, err := exec.LookPath("mmdebstrap"); err != nil && !complete(Path(Options{Suite: suite})) {
		t.Fatalf("the %s root is not cached and mmdebstrap is missing (make test installs it and builds the roots)", suite)
	}
	var log strings.Builder
	dir, err := Build(context.Background(), Options{Suite: suite, Log: &log})
	if s := strings.TrimSpace(log.String()); s != "" {
		t.Log(s)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
