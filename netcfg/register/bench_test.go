package register

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// benchRegister writes n peer files as a remote-access server's register
// holds them: a public key and one /32 each.
func benchRegister(b *testing.B, n int) string {
	dir := b.TempDir()
	for i := 0; i < n; i++ {
		var k wgtypes.Key
		rand.Read(k[:])
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("peer%05d.yaml", i)),
			[]byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.%d.%d.%d/32]\n", k, 64+i/65536, i/256%256, i%256)), 0o644)
	}
	return dir
}

// BenchmarkLoad5000 reads and parses a register of 5000 peer files cold
// (no cache): the cost of a daemon's first read.
func BenchmarkLoad5000(b *testing.B) {
	dir := benchRegister(b, 5000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if c := Load(dir, config.Options{}); len(c.Peers) != 5000 || len(c.Errors) > 0 {
			b.Fatalf("%d peers, errors %v", len(c.Peers), c.Errors)
		}
	}
}
