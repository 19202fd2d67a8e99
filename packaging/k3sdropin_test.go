package packaging

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
)

const k3sDropIn = "../systemd/k3s.service.d/10-nodeagent.conf"

// k3sUnit is k3s.service as k3s's install.sh writes it (its shape as of
// k3s 1.30-1.33), with ExecStart= pointed at /bin/true: systemd-analyze
// verify checks that every command exists, and no k3s is installed here.
const k3sUnit = `[Unit]
Description=Lightweight Kubernetes
Documentation=https://k3s.io
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=notify
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
EnvironmentFile=-/etc/systemd/system/k3s.service.env
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s
ExecStartPre=/bin/sh -xc '! /usr/bin/systemctl is-enabled --quiet nm-cloud-setup.service 2>/dev/null'
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/bin/true
`

// TestK3sDropIn: the shipped k3s drop-in's ExecStartPre=, as systemd
// itself parses it, run for real (a mount namespace per case, where an
// overlay on /usr/bin hides or supplies /usr/bin/nodeagentctl): with the
// binary missing (the package removed, the drop-in left behind) it exits
// 0 and k3s starts; with nodeagentctl present it is nodeagentctl's wait,
// with its arguments and its exit status, so a wait that fails (the node
// not converged) fails k3s's start; a nodeagentctl that is there but
// cannot run fails too. systemd-analyze verify accepts the drop-in on
// k3s's own unit.
func TestK3sDropIn(t *testing.T) {
	b, err := os.ReadFile(k3sDropIn)
	if err != nil {
		t.Fatal(err)
	}
	line, err := execStartPre(b)
	if err != nil {
		t.Fatalf("%s: %v", k3sDropIn, err)
	}
	argv, err := commandLine(line)
	if err != nil {
		t.Fatalf("%s: ExecStartPre=: %v", k3sDropIn, err)
	}
	t.Logf("ExecStartPre argv: %q", argv)
	wait := []string{"/usr/bin/nodeagentctl", "wait", "--for=ready", "--timeout=2m"}
	if len(argv) != 3 || !strings.Contains(argv[2], strings.Join(wait, " ")) {
		t.Fatalf("ExecStartPre= is not a shell line running %q: %q", strings.Join(wait, " "), argv)
	}

	t.Run("systemd's parse", func(t *testing.T) {
		got := systemdArgv(t, b)
		if !slices.Equal(got, argv) {
			t.Errorf("systemd runs %q, the test would run %q", got, argv)
		}
	})
	t.Run("systemd-analyze verify", func(t *testing.T) {
		if _, err := exec.LookPath("systemd-analyze"); err != nil {
			t.Skip("no systemd-analyze here")
		}
		// verify exits 0 on what it only warns about (a line it ignores),
		// naming the file and line: a line naming the drop-in fails the
		// test. It checks that the first command of each Exec*= list
		// exists, so the drop-in goes on k3s's unit (whose own
		// ExecStartPre= come first) and on a bare service too.
		bare := "[Service]\nExecStart=/bin/true\n"
		unbalanced := bytes.Replace(b, []byte("--timeout=2m'"), []byte("--timeout=2m"), 1)
		missing := bytes.Replace(b, []byte("ExecStartPre=/bin/sh"), []byte("ExecStartPre=/nonexistent/sh"), 1)
		for _, tc := range []struct {
			name, unit string
			dropIn     []byte
			ok         bool
		}{
			{"k3s", k3sUnit, b, true},
			{"bare", bare, b, true},
			// The controls: verify does read and judge the drop-in.
			{"k3s, a quote unbalanced", k3sUnit, unbalanced, false},
			{"bare, the shell missing", bare, missing, false},
		} {
			out, err := verifyDropIn(t.TempDir(), tc.unit, tc.dropIn)
			judged := err != nil || strings.Contains(out, "10-nodeagent.conf")
			if judged == tc.ok {
				t.Errorf("%s: systemd-analyze verify: %v, want %s\n%s", tc.name, err, map[bool]string{true: "nothing said about the drop-in", false: "the drop-in refused"}[tc.ok], out)
			}
		}
	})
	t.Run("run", func(t *testing.T) {
		if testenv.InVM() {
			t.Skip("the host tier runs this: it needs unshare and overlayfs, not a kernel of its own")
		}
		testenv.RequireRoot(t)
		if fs, _ := os.ReadFile("/proc/filesystems"); !bytes.Contains(fs, []byte("\toverlay\n")) {
			t.Skip("the kernel has no overlayfs, which the test hides and supplies /usr/bin/nodeagentctl with")
		}
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("no unshare (util-linux) here")
		}
		for _, tc := range []struct {
			name    string
			binary  string // "" missing, else the stand-in's script
			mode    os.FileMode
			wantRC  int // -1: any non-zero
			wantRan bool
		}{
			{name: "nodeagentctl missing", wantRC: 0},
			{name: "wait fails", binary: "exit 1", mode: 0o755, wantRC: 1, wantRan: true},
			{name: "wait holds", binary: "exit 0", mode: 0o755, wantRC: 0, wantRan: true},
			{name: "nodeagentctl not runnable", binary: "exit 0", mode: 0o644, wantRC: -1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rc, ran, out := runInMountNS(t, argv, tc.binary, tc.mode)
				if tc.wantRC >= 0 && rc != tc.wantRC || tc.wantRC < 0 && rc == 0 {
					t.Errorf("exit status %d, want %s\n%s", rc, map[bool]string{true: "non-zero", false: fmt.Sprint(tc.wantRC)}[tc.wantRC < 0], out)
				}
				switch {
				case tc.wantRan && !slices.Equal(ran, wait[1:]):
					t.Errorf("nodeagentctl ran with %q, want %q", ran, wait[1:])
				case !tc.wantRan && ran != nil:
					t.Errorf("nodeagentctl ran (%q), want not", ran)
				}
			})
		}
	})
}

// execStartPre is the one ExecStartPre= of a unit file's [Service]
// section (an empty assignment resets the list, as in systemd).
func execStartPre(unit []byte) (string, error) {
	var lines []string
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(unit))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		for strings.HasSuffix(l, `\`) && sc.Scan() { // continuation
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(sc.Text())
		}
		switch {
		case l == "" || l[0] == '#' || l[0] == ';':
		case l[0] == '[':
			section = l
		case section == "[Service]":
			k, v, _ := strings.Cut(l, "=")
			if strings.TrimSpace(k) != "ExecStartPre" {
				continue
			}
			if v = strings.TrimSpace(v); v == "" {
				lines = nil
			} else {
				lines = append(lines, v)
			}
		}
	}
	if len(lines) != 1 {
		return "", fmt.Errorf("%d ExecStartPre= lines in [Service], want 1", len(lines))
	}
	return lines[0], nil
}

// commandLine splits an Exec*= value as systemd.service(5) does, for the
// part of its syntax that a drop-in meant to be read needs: no prefix
// ("-", "@", "+", ...: this one must fail k3s when the wait fails), no
// "$" or "%" (systemd would expand them before the shell sees them) and
// no backslash escapes; words split on whitespace, a word in single or
// double quotes taken whole. systemd's own parse is compared with it.
func commandLine(v string) ([]string, error) {
	if strings.ContainsAny(v[:1], "-@:+!") {
		return nil, fmt.Errorf("starts with the prefix %q; the wait's failure must fail the unit", v[:1])
	}
	if strings.ContainsAny(v, `$%\`) {
		return nil, errors.New(`holds "$", "%" or "\", which systemd rewrites before running it`)
	}
	return splitWords(v)
}

// splitWords splits on whitespace outside quotes; inside double quotes
// and outside quotes a backslash escapes the next character (the quoting
// systemd prints command lines with).
func splitWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			in = true
		case quote == '"':
			if c == '"' {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				words, in = append(words, w.String()), false
				w.Reset()
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, errors.New("unterminated quote")
	}
	if in {
		words = append(words, w.String())
	}
	return words, nil
}

// systemdArgv is the argv systemd itself gives the drop-in's
// ExecStartPre=: systemd --test (as nobody when root: it refuses root) loads
// k3s.service with the drop-in from a unit directory of the test's and
// dumps it; the drop-in's line is the last ExecStartPre of the unit.
func systemdArgv(t *testing.T, dropIn []byte) []string {
	const systemd = "/lib/systemd/systemd"
	if _, err := os.Stat(systemd); err != nil {
		t.Skip("no systemd here")
	}
	args := []string{systemd, "--test", "--system", "--unit=k3s.service", "--no-pager"}
	if os.Geteuid() == 0 {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("no setpriv (util-linux) to run systemd --test as nobody")
		}
		args = append([]string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"}, args...)
	}
	dir, err := os.MkdirTemp("", "k3sdropin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755) // nobody reads it
	if err := writeUnits(dir, k3sUnit, dropIn); err != nil {
		t.Fatal(err)
	}
	// systemd --test needs the targets a start transaction names.
	for _, u := range []string{"sysinit.target", "basic.target", "shutdown.target", "multi-user.target", "network-online.target"} {
		os.WriteFile(filepath.Join(dir, u), []byte("[Unit]\nDescription="+u+"\n"), 0o644)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = []string{"SYSTEMD_UNIT_PATH=" + dir, "HOME=/", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd --test: %v\n%.3000s", err, out)
	}
	var lines []string
	inK3s, next := false, false
	for _, l := range strings.Split(string(out), "\n") {
		s := strings.TrimSpace(l)
		if strings.HasPrefix(s, "-> Unit ") {
			inK3s = s == "-> Unit k3s.service:"
			continue
		}
		if !inK3s {
			continue
		}
		// "-> ExecStartPre:", then a "Command Line: " for each command.
		if strings.HasPrefix(s, "-> ") {
			next = s == "-> ExecStartPre:"
			continue
		}
		if next && strings.HasPrefix(s, "Command Line: ") {
			lines = append(lines, strings.TrimPrefix(s, "Command Line: "))
		}
	}
	// k3s's own three, then the drop-in's.
	if len(lines) != 4 {
		t.Fatalf("systemd --test dumped %d ExecStartPre= of k3s.service, want 4 (k3s's 3 and the drop-in's): %q", len(lines), lines)
	}
	argv, err := splitWords(lines[3])
	if err != nil {
		t.Fatalf("systemd's command line %q: %v", lines[3], err)
	}
	return argv
}

// writeUnits writes k3s.service (unit) and the drop-in into dir as
// systemd finds them.
func writeUnits(dir, unit string, dropIn []byte) error {
	if err := os.WriteFile(filepath.Join(dir, "k3s.service"), []byte(unit), 0o644); err != nil {
		return err
	}
	d := filepath.Join(dir, "k3s.service.d")
	if err := os.Mkdir(d, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d, "10-nodeagent.conf"), dropIn, 0o644)
}

// verifyDropIn runs systemd-analyze verify on k3s.service (unit) with
// dropIn, both written into dir.
func verifyDropIn(dir, unit string, dropIn []byte) (string, error) {
	if err := writeUnits(dir, unit, dropIn); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "systemd-analyze", "verify", "--man=no", filepath.Join(dir, "k3s.service"))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// runInMountNS runs argv in a mount namespace of its own whose /usr/bin
// is an overlay of the real one: with binary "" /usr/bin/nodeagentctl is
// hidden (a whiteout; absent on a machine where nodeagent is installed
// too), else it is a stand-in script with mode that runs binary after
// writing its arguments down. It returns argv's exit status, the
// arguments nodeagentctl ran with (nil: it did not run) and the output.
func runInMountNS(t *testing.T, argv []string, binary string, mode os.FileMode) (int, []string, string) {
	dir := t.TempDir()
	mnt, record := filepath.Join(dir, "mnt"), filepath.Join(dir, "args")
	os.Mkdir(mnt, 0o755)
	standin := filepath.Join(dir, "nodeagentctl")
	if binary != "" {
		script := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s\n%s\n", record, binary)
		if err := os.WriteFile(standin, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The harness: a tmpfs for the overlay's upper layer, the whiteout or
	// the stand-in in it, the overlay on /usr/bin, then argv itself.
	setup := `set -e
mount -t tmpfs tmpfs "$MNT"
mkdir "$MNT/upper" "$MNT/work"
if [ -n "$STANDIN" ]; then
	cp "$STANDIN" "$MNT/upper/nodeagentctl"
	chmod "$MODE" "$MNT/upper/nodeagentctl"
else
	mknod "$MNT/upper/nodeagentctl" c 0 0
fi
mount -t overlay overlay -o "lowerdir=/usr/bin,upperdir=$MNT/upper,workdir=$MNT/work" /usr/bin
echo "@@harness ready@@"
exec "$@"`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", setup, "harness"}, argv...)
	cmd := exec.CommandContext(ctx, "unshare", args...)
	env := []string{"MNT=" + mnt, fmt.Sprintf("MODE=%o", mode), "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if binary != "" {
		env = append(env, "STANDIN="+standin)
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	rc := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		rc = ee.ExitCode()
	case err != nil:
		t.Fatalf("unshare: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("@@harness ready@@\n")) {
		t.Fatalf("the namespace's overlay on /usr/bin failed (exit status %d):\n%s", rc, out)
	}
	var ran []string
	if b, err := os.ReadFile(record); err == nil {
		ran = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	}
	return rc, ran, string(out)
}

// TestK3sDropInQuoted: nodeagentctl(1) quotes the shipped drop-in's
// ExecStartPre= as it is, not an older form.
func TestK3sDropInQuoted(t *testing.T) {
	b, err := os.ReadFile(k3sDropIn)
	if err != nil {
		t.Fatal(err)
	}
	line, err := execStartPre(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"../docs/nodeagentctl.1", "man/nodeagentctl.1.in"} {
		m, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.ReplaceAll(string(m), `\-`, "-"), "\nExecStartPre="+line+"\n") {
			t.Errorf("%s does not quote the drop-in's ExecStartPre=%s", page, line)
		}
	}
}
