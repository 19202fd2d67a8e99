package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// exampleWithFiles writes examples/homelab.yaml into dir with the files it
// names made there (/etc/nodeagent/ moved to dir): the two private keys
// and the PIA credentials, root's and private, and the register
// directory. validate reads them all; the example on a node without them
// is invalid, as it should be. It returns the config's path.
func exampleWithFiles(t *testing.T, dir string) string {
	t.Helper()
	example, err := os.ReadFile("../../examples/homelab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	etc := filepath.Join(dir, "etc") + "/"
	os.MkdirAll(etc+"keys", 0o755)
	os.MkdirAll(etc+"peers.d", 0o755)
	for _, f := range []string{"keys/wg-pia.key", "keys/wg0.key"} {
		k := make([]byte, 32)
		rand.Read(k)
		if err := os.WriteFile(etc+f, []byte(base64.StdEncoding.EncodeToString(k)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(etc+"pia.cred", []byte("p1234567\nsecret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "homelab.yaml")
	// The port hook: one that exists, root's, 0755, in root's directories
	// and outside the sandbox's hidden trees (dir is under /tmp).
	text := strings.ReplaceAll(string(example), "/usr/local/sbin/qbittorrent-port", "/usr/bin/true")
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(text, "/etc/nodeagent/", etc)), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestValidateAsUserHoldsKeysToRoot: validate run by a user other than
// root reads a key file that user owns, which the daemon (root) refuses:
// validate refuses it too, at its line, rather than call the config
// valid.
func TestValidateAsUserHoldsKeysToRoot(t *testing.T) {
	bin, dir := asNobody(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	key := filepath.Join(dir, "wg0.key")
	k := make([]byte, 32)
	rand.Read(k)
	os.WriteFile(key, []byte(base64.StdEncoding.EncodeToString(k)+"\n"), 0o600)
	if err := os.Chown(key, uid, -1); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte("wireguard:\n  - name: wg0\n    privateKeyFile: "+key+"\n    listenPort: 51820\n"), 0o644)
	out, err := exec.Command("su", "nobody", "-s", "/bin/sh", "-c", bin+" validate -c "+cfg+" --state-dir "+dir+"/state").CombinedOutput()
	want := cfg + ":3: wireguard[0].privateKeyFile: " + key + " is owned by uid " + nobody.Uid + ", not root; the daemon, which runs as root, refuses it"
	if err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("validate as nobody of a key nobody owns: %v\n%s\nwant %q", err, out, want)
	}
}

// TestValidateChecksTheHook: portForward.onChange's command is checked as
// a key file is, since the daemon runs it as root: a hook under /tmp
// (which the unit's PrivateTmp hides from the daemon), one writable by its
// group, and one that does not exist each fail validate, at the line of
// onChange.
func TestValidateChecksTheHook(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the hooks are root's files")
	}
	dir := t.TempDir()
	example := exampleWithFiles(t, dir)
	text, _ := os.ReadFile(example)
	line := 0
	for i, l := range strings.Split(string(text), "\n") {
		if strings.Contains(l, "onChange: [/usr/bin/true") {
			line = i + 1
		}
	}
	if line == 0 {
		t.Fatal("no onChange in the example")
	}
	// A directory outside the hidden trees for the group-writable and the
	// missing hook, so each has its one problem.
	rundir, err := os.MkdirTemp("/run", "nodeagent-hooktest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rundir) })
	tmpHook := filepath.Join(dir, "x")
	os.WriteFile(tmpHook, []byte("#!/bin/sh\n"), 0o755)
	groupw := filepath.Join(rundir, "groupw")
	os.WriteFile(groupw, []byte("#!/bin/sh\n"), 0o775)
	os.Chmod(groupw, 0o775)
	for _, c := range []struct{ hook, want string }{
		{tmpHook, tmpHook + " is under /tmp, which nodeagent.service's sandbox hides from the daemon"},
		{groupw, groupw + " is writable by group or others (mode 0775)"},
		{filepath.Join(rundir, "missing"), filepath.Join(rundir, "missing") + " does not exist"},
	} {
		cfg := filepath.Join(dir, "hook.yaml")
		os.WriteFile(cfg, []byte(strings.Replace(string(text), "onChange: [/usr/bin/true", "onChange: ["+c.hook, 1)), 0o644)
		var out, errb bytes.Buffer
		code := run([]string{"validate", "-c", cfg}, &out, &errb)
		want := fmt.Sprintf("%s:%d: wireguard[0].pia.portForward.onChange: %s", cfg, line, c.want)
		if code != 1 || !strings.Contains(errb.String(), want) {
			t.Errorf("validate with the hook %s: exit %d\n%s\nwant exit 1 and %q", c.hook, code, errb.String(), want)
		}
	}
}
