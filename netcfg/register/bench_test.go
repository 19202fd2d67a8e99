package register

import (
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv"
)

// benchRegister writes n peer files as a remote-access server's register
// holds them: a public key and one /32 each.
func benchRegister(b *testing.B, n int) string {
	dir := b.TempDir()
	testenv.WriteRegister(b, dir, n)
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
