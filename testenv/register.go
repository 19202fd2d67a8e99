package testenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// WriteRegister fills dir (made if missing) with n peer files as a
// remote-access server's register holds them, peer00000.yaml on: a random
// public key (the kernel does not check that a peer's key is a real one)
// and one /32 each from 10.64.0.0 on.
func WriteRegister(tb testing.TB, dir string, n int) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < n; i++ {
		var k [32]byte
		rand.Read(k[:])
		body := fmt.Sprintf("publicKey: %s\nallowedIPs: [10.%d.%d.%d/32]\n", base64Key(k), 64+i/65536, i/256%256, i%256)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("peer%05d.yaml", i)), []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

func base64Key(k [32]byte) string { return base64.StdEncoding.EncodeToString(k[:]) }
