package filecheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSandboxHiddenMatchesTheUnit: the trees validate calls hidden are
// the ones nodeagent.service's sandbox hides: it has ProtectHome=yes and
// PrivateTmp=yes.
func TestSandboxHiddenMatchesTheUnit(t *testing.T) {
	b, err := os.ReadFile("../../systemd/nodeagent.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, line := range []string{"\nProtectHome=yes\n", "\nPrivateTmp=yes\n"} {
		if !strings.Contains(unit, line) {
			t.Errorf("nodeagent.service lacks %q: SandboxHidden is out of date", strings.TrimSpace(line))
		}
	}
	for _, want := range []string{"/home", "/root", "/run/user", "/tmp", "/var/tmp"} {
		found := false
		for _, h := range SandboxHidden {
			found = found || h == want
		}
		if !found {
			t.Errorf("SandboxHidden lacks %s", want)
		}
	}
}

// TestHookProblems: what validate says of a hook's file.
func TestHookProblems(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the hooks are made root's and other users'")
	}
	// Outside the hidden trees (t.TempDir is under /tmp): /run is root's.
	dir, err := os.MkdirTemp("/run", "nodeagent-hooktest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	mk := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o600)
		os.Chmod(p, mode)
		os.Chown(p, uid, 0)
		return p
	}
	good := mk("good", 0o755, 0)
	os.Symlink(good, filepath.Join(dir, "link"))
	theirs := filepath.Join(dir, "theirs")
	os.Mkdir(theirs, 0o755)
	os.Chown(theirs, 1000, 1000)
	inTheirs := filepath.Join(theirs, "hook")
	os.WriteFile(inTheirs, []byte("#!/bin/sh\n"), 0o755)
	tmp := filepath.Join(t.TempDir(), "x")
	os.WriteFile(tmp, []byte("#!/bin/sh\n"), 0o755)
	for _, c := range []struct {
		path string
		want []string // substrings, one per problem, in order
	}{
		{good, nil},
		{filepath.Join(dir, "link"), nil},
		{"/usr/bin/true", nil},
		{filepath.Join(dir, "missing"), []string{"missing does not exist"}},
		{mk("groupw", 0o775, 0), []string{"groupw is writable by group or others (mode 0775)"}},
		{mk("worldw", 0o757, 0), []string{"worldw is writable by group or others (mode 0757)"}},
		{mk("noexec", 0o644, 0), []string{"noexec is not executable (mode 0644)"}},
		{mk("user", 0o755, 1000), []string{"user is owned by uid 1000, not root"}},
		{dir, []string{"is not a regular file"}},
		{inTheirs, []string{"is owned by uid 1000, not root: its owner could replace the hook"}},
		{tmp, []string{"is under /tmp, which nodeagent.service's sandbox hides"}},
		{"/home/someone/hook", []string{"is under /home", "does not exist"}},
	} {
		got := HookProblems(c.path)
		if len(got) != len(c.want) {
			t.Errorf("%s: %q, want %d problems", c.path, got, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: problem %d %q lacks %q", c.path, i, got[i], w)
			}
		}
	}
}
