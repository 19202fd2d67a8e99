package register

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"golang.org/x/sys/unix"
)

// marker is in the content of every hostile entry's target: none of it may
// come back in any error.
const marker = "MARKER-d41d8cd9-do-not-print"

// secretLooking is what a file reached through a link might hold: an
// /etc/shadow line, which YAML reads as one long key.
const secretLooking = "root:$y$j9T$" + marker + "$hash:19000:0:99999:7:::\n" +
	marker + ": value\n"

// TestHostileRegisterEntries: each entry a hostile or careless user can
// put in peersDir is refused with a one-line reason that quotes none of
// what it leads to, and a link to a good peer file inside the register
// still works.
func TestHostileRegisterEntries(t *testing.T) {
	root := os.Geteuid() == 0
	outside := t.TempDir()
	secret := writeFile(t, outside, "shadow", secretLooking, 0o600)
	writeFile(t, outside, "good.yaml", "publicKey: "+keyB+"\n", 0o600)

	// Control: read the way the register read files before (open(2), no
	// checks), the secret is what a YAML parse of the link sees, and the
	// errors quoted it.
	if b, err := os.ReadFile(secret); err != nil || !strings.Contains(string(b), marker) {
		t.Fatalf("control: %v", err)
	}
	if _, errs := parseYAMLPeer("x.yaml", []byte(secretLooking), config.Options{}); !strings.Contains(fmt.Sprint(errs), "unknown field") {
		t.Fatalf("control: parsing the secret directly gives %v", errs)
	}

	tests := []struct {
		name  string
		root  bool // needs root (mknod, mount)
		setup func(t *testing.T, dir string)
		want  string // the error, after "FILE: "
	}{
		{"symlink to a secret", false, func(t *testing.T, dir string) {
			os.Symlink(secret, filepath.Join(dir, "x.yaml"))
		}, "is a symbolic link that leads out of DIR; only links to files inside it are followed"},
		{"symlink out by ..", false, func(t *testing.T, dir string) {
			rel, _ := filepath.Rel(dir, secret)
			os.Symlink(rel, filepath.Join(dir, "x.yaml"))
		}, "is a symbolic link that leads out of DIR; only links to files inside it are followed"},
		{"symlink to a good peer elsewhere", false, func(t *testing.T, dir string) {
			os.Symlink(filepath.Join(outside, "good.yaml"), filepath.Join(dir, "x.yaml"))
		}, "is a symbolic link that leads out of DIR; only links to files inside it are followed"},
		{"FIFO", false, func(t *testing.T, dir string) {
			if err := syscall.Mkfifo(filepath.Join(dir, "x.yaml"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "is not a regular file (a FIFO)"},
		{"/dev/zero", true, func(t *testing.T, dir string) {
			if err := unix.Mknod(filepath.Join(dir, "x.yaml"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 5))); err != nil {
				t.Fatal(err)
			}
		}, "is not a regular file (a device)"},
		{"link to /dev/zero", false, func(t *testing.T, dir string) {
			os.Symlink("/dev/zero", filepath.Join(dir, "x.yaml"))
		}, "is a symbolic link that leads out of DIR; only links to files inside it are followed"},
		{"a file on procfs", true, func(t *testing.T, dir string) {
			// procfs mounted inside the register, and a link to one of its
			// files that stays inside: the filesystem check refuses it.
			mnt := filepath.Join(dir, "proc")
			os.Mkdir(mnt, 0o755)
			if err := unix.Mount("proc", mnt, "proc", 0, ""); err != nil {
				t.Skipf("mount procfs: %v", err)
			}
			t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
			os.Symlink("proc/self/environ", filepath.Join(dir, "x.yaml"))
		}, "is on procfs, which holds no configuration files"},
		{"10 MiB", false, func(t *testing.T, dir string) {
			big := "publicKey: " + keyA + "\n# " + marker + "\n"
			big += strings.Repeat("#", 10<<20-len(big)-1) + "\n"
			writeFile(t, dir, "x.yaml", big, 0o600)
		}, "is too big (10485760 bytes; at most 64 KiB)"},
		{"world-writable", false, func(t *testing.T, dir string) {
			writeFile(t, dir, "x.yaml", "publicKey: "+keyA+"\n# "+marker+"\n", 0o666)
		}, "is writable by others (mode 0666); chmod o-w it"},
		{"a shadow line in place", false, func(t *testing.T, dir string) {
			// Written into the register itself (copied, not linked): the
			// key it makes is not shaped like a field name, so it is cut.
			writeFile(t, dir, "x.yaml", strings.Split(secretLooking, "\n")[0]+"\n", 0o600)
		}, "(a key that is not a field name, not shown): unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root && !root {
				t.Skip("needs root (mknod, mount); CI runs as root")
			}
			dir := t.TempDir()
			tt.setup(t, dir)
			done := make(chan Contents, 1)
			go func() { done <- Load(dir, config.Options{}) }()
			var reg Contents
			select {
			case reg = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Load blocked")
			}
			if len(reg.Peers) != 0 {
				t.Errorf("peers %+v; want none", reg.Peers)
			}
			got := registerErrors(t, dir, reg.Errors)
			for i := range got {
				got[i] = strings.ReplaceAll(got[i], dir, "DIR")
			}
			if len(got) == 0 || (got[0] != "x.yaml: "+tt.want && got[0] != "x.yaml:1: "+tt.want) {
				t.Errorf("errors %q; want first %q", got, "x.yaml: "+tt.want)
			}
			if s := strings.Join(got, "\n"); strings.Contains(s, marker) || strings.Contains(s, "root:") {
				t.Errorf("the errors quote the target's content:\n%s", s)
			}
			for _, l := range got {
				if strings.Contains(l, "\n") {
					t.Errorf("error is more than one line: %q", l)
				}
			}
		})
	}

	// A link that stays inside the register is followed.
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "keep"), 0o755)
	writeFile(t, filepath.Join(dir, "keep"), "alice.yaml", "publicKey: "+keyA+"\n", 0o600)
	os.Symlink("keep/alice.yaml", filepath.Join(dir, "alice.yaml"))
	reg := Load(dir, config.Options{})
	if len(reg.Errors) != 0 || len(reg.Peers) != 1 || reg.Peers[0].Peer.PublicKey != keyA {
		t.Errorf("link inside the register: %+v", reg)
	}
}

// TestErrorsAreCapped: a register file of aliases, and a register of
// thirty of them, are each reported in at most the cap, and the count of
// the rest.
func TestErrorsAreCapped(t *testing.T) {
	// 64 KiB of aliases to one unknown key: thousands of errors uncapped.
	var b strings.Builder
	b.WriteString("publicKey: " + keyA + "\nx: &a 1\n")
	for i := 0; b.Len() < maxPeerFileSize-40; i++ {
		fmt.Fprintf(&b, "k%d: *a\n", i)
	}
	dir := t.TempDir()
	writeFile(t, dir, "alias.yaml", b.String(), 0o600)
	reg := Load(dir, config.Options{})
	lines := registerErrors(t, dir, reg.Errors)
	if len(lines) != MaxFileErrors+1 || !strings.HasPrefix(lines[MaxFileErrors], "alias.yaml: and ") {
		t.Errorf("%d lines (want %d), last %q", len(lines), MaxFileErrors+1, lines[len(lines)-1])
	}
	t.Logf("alias file: %d bytes, %d error lines, last %q", b.Len(), len(lines), lines[len(lines)-1])

	// Many such files: the register as a whole is capped too.
	for i := range 30 {
		writeFile(t, dir, fmt.Sprintf("alias%02d.yaml", i), b.String(), 0o600)
	}
	lines = registerErrors(t, dir, Load(dir, config.Options{}).Errors)
	if len(lines) > MaxRegisterErrors+1 || !strings.Contains(lines[len(lines)-1], "more skipped file(s)") {
		t.Errorf("30 alias files: %d lines (cap %d), last %q", len(lines), MaxRegisterErrors, lines[len(lines)-1])
	}

}
