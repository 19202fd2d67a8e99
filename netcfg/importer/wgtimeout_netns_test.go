package importer

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
)

// TestReadWedgedUserspaceDevice: a tun link whose UAPI socket accepts and
// never answers (a wedged wireguard-go) does not hang the import: the
// read gives up after its timeout and says so.
func TestReadWedgedUserspaceDevice(t *testing.T) {
	ns := testenv.NewNetNS(t)
	name := "nawedge" + strings.TrimPrefix(ns.Name, "na-test-")[:4]
	ns.Exec(t, "ip", "tuntap", "add", "dev", name, "mode", "tun")
	os.MkdirAll("/var/run/wireguard", 0o755)
	sock := "/var/run/wireguard/" + name + ".sock"
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); os.Remove(sock) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	old := wgReadTimeout
	wgReadTimeout = 500 * time.Millisecond
	t.Cleanup(func() { wgReadTimeout = old })

	start := time.Now()
	s, err := Read(context.Background(), ns.Host, ReadOptions{Etc: t.TempDir()})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read in %s; problems %q", took, s.Problems)
	if took > 5*time.Second {
		t.Errorf("the read took %s: it waited for the wedged device", took)
	}
	found := false
	for _, p := range s.Problems {
		found = found || strings.Contains(p, "no answer within")
	}
	if !found {
		t.Errorf("no problem says the devices did not answer: %q", s.Problems)
	}
}
