package fsafe

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func write(t *testing.T, path, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	good := write(t, filepath.Join(dir, "good"), "hello\n", 0o600)
	open := write(t, filepath.Join(dir, "open"), "hello\n", 0o644)
	writable := write(t, filepath.Join(dir, "writable"), "hello\n", 0o646)
	big := write(t, filepath.Join(dir, "big"), strings.Repeat("x", 2000), 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(good, link)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		r    Rules
		want string // "" for success, else the error's reason
	}{
		{good, Rules{MaxSize: 100, Private: true, RootOwned: true}, ""},
		{open, Rules{MaxSize: 100}, ""},
		{open, Rules{MaxSize: 100, Private: true}, "is readable by group or others (mode 0644); chmod 600 it"},
		{writable, Rules{MaxSize: 100}, "is writable by others (mode 0646); chmod o-w it"},
		{big, Rules{MaxSize: 1000}, "is too big (2000 bytes; at most 1000 bytes)"},
		{big, Rules{MaxSize: 2000}, ""},
		{link, Rules{MaxSize: 100}, "is a symbolic link, which is not followed here; name the file itself"},
		{link, Rules{MaxSize: 100, FollowLinks: true}, ""},
		{fifo, Rules{MaxSize: 100}, "is not a regular file (a FIFO)"},
		{dir, Rules{MaxSize: 100}, "is not a regular file (a directory)"},
		{"/dev/null", Rules{MaxSize: 100, FollowLinks: true}, "is not a regular file (a device)"},
		{"/proc/self/status", Rules{MaxSize: 1 << 20, FollowLinks: true}, "is on procfs, which holds no configuration files"},
		{"/sys/kernel/mm/transparent_hugepage/enabled", Rules{MaxSize: 1 << 20, FollowLinks: true}, "is on sysfs, which holds no configuration files"},
		{filepath.Join(dir, "missing"), Rules{MaxSize: 100}, "does not exist"},
	}
	for _, tt := range tests {
		done := make(chan error, 1)
		var b []byte
		go func() {
			var err error
			b, err = ReadFile(tt.path, tt.r)
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: ReadFile blocked", tt.path)
		}
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s %+v: %v", tt.path, tt.r, err)
		case tt.want == "" && len(b) == 0:
			t.Errorf("%s: read nothing", tt.path)
		case tt.want != "" && (err == nil || err.Error() != tt.path+" "+tt.want):
			t.Errorf("%s %+v: error %v; want %q", tt.path, tt.r, err, tt.path+" "+tt.want)
		}
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), Rules{MaxSize: 1}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v is not fs.ErrNotExist", err)
	}
}

func TestDirReadFile(t *testing.T) {
	root := t.TempDir()
	reg := filepath.Join(root, "peers.d")
	os.MkdirAll(filepath.Join(reg, "sub"), 0o755)
	write(t, filepath.Join(reg, "sub", "a"), "a\n", 0o600)
	write(t, filepath.Join(root, "outside"), "secret\n", 0o600)
	os.Symlink("sub/a", filepath.Join(reg, "in"))
	os.Symlink("../outside", filepath.Join(reg, "up"))
	os.Symlink(filepath.Join(root, "outside"), filepath.Join(reg, "abs"))
	os.Symlink(filepath.Join(reg, "sub", "a"), filepath.Join(reg, "absin")) // absolute, even to inside
	d, err := OpenDir(reg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for name, want := range map[string]string{
		"in":    "",
		"up":    "is a symbolic link that leads out of " + reg + "; only links to files inside it are followed",
		"abs":   "is a symbolic link that leads out of " + reg + "; only links to files inside it are followed",
		"absin": "is a symbolic link that leads out of " + reg + "; only links to files inside it are followed",
		"sub":   "is not a regular file (a directory)",
	} {
		b, _, err := d.ReadFile(name, Rules{MaxSize: 100})
		switch {
		case want == "" && (err != nil || string(b) != "a\n"):
			t.Errorf("%s: %q, %v", name, b, err)
		case want != "" && (err == nil || err.Error() != filepath.Join(reg, name)+" "+want):
			t.Errorf("%s: %v; want %q", name, err, want)
		}
	}
	entries, err := d.ReadDir()
	if err != nil || len(entries) != 5 || entries[0].Name() != "abs" || entries[4].Name() != "up" {
		t.Errorf("ReadDir: %v, %v", entries, err)
	}
}

func TestWriteFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	write(t, p, "old", 0o644)
	if err := WriteFile(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	b, _ := os.ReadFile(p)
	if string(b) != "new" || fi.Mode().Perm() != 0o600 {
		t.Errorf("content %q mode %v", b, fi.Mode())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".nodeagent-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// JoinName must give what filepath.Join gives, for every clean directory
// and any name: it is only a shortcut for plain names.
func TestJoinName(t *testing.T) {
	dirs := []string{"/", ".", "..", "/etc", "/etc/nodeagent/peers.d", "a", "a/b", "../a", "", "/etc/", "a//b", "./a"}
	names := []string{"alice.yaml", ".alice.yaml.swp", "alice.yaml~", ".", "..", "", "a/b", "../x", "x/..", "a//b", "..x", "x..", "/abs"}
	for _, d := range dirs {
		clean := filepath.Clean(d)
		for _, n := range names {
			if got, want := JoinName(clean, n), filepath.Join(clean, n); got != want {
				t.Errorf("JoinName(%q, %q) = %q, filepath.Join gives %q", clean, n, got, want)
			}
			// What the register relies on: a directory as the config
			// names it, cleaned once, joins as it would uncleaned.
			if d != "" && JoinName(clean, n) != filepath.Join(d, n) {
				t.Errorf("JoinName(Clean(%q), %q) = %q, filepath.Join(%q, %q) = %q", d, n, JoinName(clean, n), d, n, filepath.Join(d, n))
			}
		}
	}
}
