package testenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// RegisterPeer is one peer WriteRegister wrote: its key and its one
// allowed IP.
type RegisterPeer struct {
	Key       [32]byte
	AllowedIP string
}

// WriteRegister fills dir (made if missing) with n peer files as a
// remote-access server's register holds them, peer00000.yaml on: a random
// public key (the kernel does not check that a peer's key is a real one)
// and one /32 each from 10.64.0.0 on. It returns the peers in file order.
func WriteRegister(tb testing.TB, dir string, n int) []RegisterPeer {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	peers := make([]RegisterPeer, n)
	for i := range peers {
		p := &peers[i]
		rand.Read(p.Key[:])
		p.AllowedIP = fmt.Sprintf("10.%d.%d.%d/32", 64+i/65536, i/256%256, i%256)
		body := fmt.Sprintf("publicKey: %s\nallowedIPs: [%s]\n", base64Key(p.Key), p.AllowedIP)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("peer%05d.yaml", i)), []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return peers
}

func base64Key(k [32]byte) string { return base64.StdEncoding.EncodeToString(k[:]) }
