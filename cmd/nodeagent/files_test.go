package main

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
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
