package main

import (
	"crypto/rand"
	"encoding/base64"
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
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(string(example), "/etc/nodeagent/", etc)), 0o644); err != nil {
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
