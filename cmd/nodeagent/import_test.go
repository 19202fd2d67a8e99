package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

func TestImportUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"import", "--help"}, 0, "nodeagent import --out DIR [--root DIR] [--only NAME]... [--etc DIR]"},
		{[]string{"import"}, 2, "--out DIR is required"},
		{[]string{"import", "--out", "/etc/nodeagent"}, 2, "is --root /etc/nodeagent or inside it"},
		{[]string{"import", "--out", "/tmp/x", "--root", "/tmp/x/y/.."}, 2, "or inside it"},
		{[]string{"import", "--out", "/tmp/x", "--root", "etc"}, 2, "not an absolute path"},
		{[]string{"import", "-out", "/tmp/x"}, 2, "a long flag takes two dashes"},
		{[]string{"import", "--out", "/tmp/x", "extra"}, 2, "takes no arguments"},
		{[]string{"import", "--bogus"}, 2, "unknown flag: --bogus"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		if code != c.code || !strings.Contains(out.String()+errb.String(), c.want) {
			t.Errorf("%q: exit %d, want %d with %q\nstdout: %s\nstderr: %s", c.args, code, c.code, c.want, out.String(), errb.String())
		}
	}
	var out bytes.Buffer
	run([]string{"--help"}, &out, &out)
	if !strings.Contains(out.String(), "nodeagent import --out DIR") {
		t.Errorf("the help does not name import:\n%s", out.String())
	}
}

// TestImportWrites imports this namespace (links and routes are readable
// without root) with files from an /etc of the test's own, and checks the
// output directory: modes, a config that validates, and the refusal to
// write into a directory that is not empty.
func TestImportWrites(t *testing.T) {
	etc := t.TempDir()
	os.MkdirAll(filepath.Join(etc, "iproute2"), 0o755)
	os.WriteFile(filepath.Join(etc, "iproute2", "rt_tables"), []byte("254\tmain\n"), 0o644)
	// A wg-quick device that is down is imported from its file alone, so
	// there is something to write whatever this namespace holds.
	os.MkdirAll(filepath.Join(etc, "wireguard"), 0o700)
	os.MkdirAll(filepath.Join(etc, "systemd", "system", "multi-user.target.wants"), 0o755)
	os.WriteFile(filepath.Join(etc, "systemd", "system", "multi-user.target.wants", "wg-quick@natest9.service"), nil, 0o644)
	// A hook with a secret in it: never printed, never in a 0644 file.
	os.WriteFile(filepath.Join(etc, "wireguard", "natest9.conf"), []byte(`[Interface]
PrivateKey = kiqhO9HXRnqm4eSI6Icv+qbnnfGAUvevh3txSPGsohI=
Address = 10.249.0.1/24
PostUp = curl -fsS "https://ddns.example/update?token=s3cr3t" -u pia:hunter2pass

# laptop
[Peer]
PublicKey = 5RC/XR+nUsU+g0VRAVqGqE2OZGMvrxzhCF3foL+uj9o=
AllowedIPs = 10.249.0.2/32
`), 0o600)
	dir := filepath.Join(t.TempDir(), "out")
	var out, errb bytes.Buffer
	if code := run([]string{"import", "--out", dir, "--etc", etc, "--root", "/srv/na"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"wrote " + filepath.Join(dir, "nodeagent.yaml"), "steps (as root, in order", "cp -a " + dir + "/* /srv/na/"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.String())
		}
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, mode %v", dir, err, st.Mode())
	}
	cfg := filepath.Join(dir, "nodeagent.yaml")
	if st, err := os.Stat(cfg); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("%s: %v, mode %v", cfg, err, st.Mode())
	}
	if _, err := config.Load(cfg); err != nil {
		t.Errorf("the config does not validate: %v", err)
	}
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{"keys", 0o700 | os.ModeDir}, {"keys/natest9.key", 0o600}, {"peers.d", 0o700 | os.ModeDir}, {"peers.d/laptop.conf", 0o644}} {
		st, err := os.Lstat(filepath.Join(dir, f.path))
		if err != nil {
			t.Errorf("%s: %v", f.path, err)
		} else if st.Mode() != f.mode {
			t.Errorf("%s: mode %v, want %v", f.path, st.Mode(), f.mode)
		}
	}
	if b, _ := os.ReadFile(cfg); !strings.Contains(string(b), "privateKeyFile: /srv/na/keys/natest9.key") {
		t.Errorf("the config does not name the key under --root:\n%s", b)
	}
	for _, secret := range []string{"s3cr3t", "hunter2pass"} {
		if strings.Contains(out.String()+errb.String(), secret) {
			t.Errorf("the output quotes a secret:\n%s%s", out.String(), errb.String())
		}
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, _ := os.ReadFile(p)
			if st, _ := os.Stat(p); strings.Contains(string(b), secret) && st.Mode().Perm() != 0o600 {
				t.Errorf("%s (%v) holds a secret", p, st.Mode().Perm())
			}
			return nil
		})
	}
	if st, err := os.Stat(filepath.Join(dir, "import-notes.txt")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("import-notes.txt: %v %v", st, err)
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"import", "--out", dir, "--etc", etc}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "is not empty") {
		t.Errorf("into a written directory: exit %d\n%s", code, errb.String())
	}
	if os.Geteuid() == 0 {
		theirs := filepath.Join(t.TempDir(), "theirs")
		os.Mkdir(theirs, 0o755)
		os.Chown(theirs, 65534, 65534)
		out.Reset()
		errb.Reset()
		if code := run([]string{"import", "--out", filepath.Join(theirs, "out"), "--etc", etc}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "belongs to uid 65534") {
			t.Errorf("under another user's directory: exit %d\n%s", code, errb.String())
		}
		if entries, _ := os.ReadDir(theirs); len(entries) != 0 {
			t.Errorf("wrote under another user's directory: %v", entries)
		}
	}
}
