package link

import (
	"bytes"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
)

// A shim made with no mac configured has the host's stable address for
// its name, given in the create message (so udev's persistent policy,
// which rewrites only random addresses, leaves it): locally administered,
// unicast, the same after a delete and re-create and for a second handle
// on the namespace (a restarted daemon), and different for another name.
// A configured mac is made with, changed to when the config changes, and
// put back when someone else changes it; an unconfigured one is left.
func TestMacvlanAddress(t *testing.T) {
	node, _ := trunkPair(t)
	macOf := func(name string) net.HardwareAddr {
		t.Helper()
		l, err := node.NL.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().HardwareAddr
	}
	d := Desired{Links: []Link{shim("10.10.50.3/24")}, DAD: fastDAD}
	mustSync(t, node.Host, d)
	want := node.Host.StableMAC("shim0")
	if got := macOf("shim0"); !bytes.Equal(got, want) || got[0]&0x03 != 0x02 {
		t.Fatalf("shim0 made with %s, want the stable %s (locally administered, unicast)", got, want)
	}
	if other := node.Host.StableMAC("shim1"); bytes.Equal(other, want) {
		t.Errorf("shim1's stable address equals shim0's: %s", other)
	}
	again, err := host.Open(node.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if got := again.StableMAC("shim0"); !bytes.Equal(got, want) {
		t.Errorf("a second handle (a restart) derives %s, want %s", got, want)
	}
	node.Exec(t, "ip", "link", "del", "shim0")
	mustSync(t, node.Host, d)
	if got := macOf("shim0"); !bytes.Equal(got, want) {
		t.Errorf("re-created with %s, want %s", got, want)
	}
	assertNoop(t, node, d)
	// Not configured: another address given by hand is left alone.
	node.Exec(t, "ip", "link", "set", "shim0", "address", "02:00:00:00:00:99")
	assertNoop(t, node, d)

	// Configured: changed to, then kept.
	pinned, _ := net.ParseMAC("02:11:22:33:44:55")
	d.Links[0].MAC = pinned
	p := mustSync(t, node.Host, d)
	if !strings.Contains(p.String(), "~ link shim0 mac 02:00:00:00:00:99 -> 02:11:22:33:44:55") {
		t.Errorf("plan for the configured mac:\n%s", p)
	}
	if got := macOf("shim0"); !bytes.Equal(got, pinned) {
		t.Fatalf("after the config's mac: %s", got)
	}
	assertNoop(t, node, d)
	node.Exec(t, "ip", "link", "set", "shim0", "address", "02:00:00:00:00:98")
	mustSync(t, node.Host, d)
	if got := macOf("shim0"); !bytes.Equal(got, pinned) {
		t.Errorf("a changed configured mac was not put back: %s", got)
	}
	node.Exec(t, "ip", "link", "del", "shim0")
	mustSync(t, node.Host, d)
	if got := macOf("shim0"); !bytes.Equal(got, pinned) {
		t.Errorf("re-created with %s, want the configured %s", got, pinned)
	}
}

// Every ARP the shim sends while it claims and announces its address
// (probes and gratuitous ARPs) carries the link's address as its sender,
// in 10 create cycles: the address is the one it was made with, never an
// earlier one. The first cycle claims the address with the full probes;
// the nine after re-add an address that was nodeagent's moments ago, with
// one probe each (claims.go).
func TestARPSentFromTheLinksAddress(t *testing.T) {
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Fatal("tcpdump is missing (testenv/deps.sh installs it)")
	}
	node, other := trunkPair(t)
	cap := exec.Command("ip", "netns", "exec", other.Name, "tcpdump", "-i", "wire0", "-l", "-n", "-e", "-U", "arp")
	var out syncBuf
	cap.Stdout, cap.Stderr = &out, &out
	if err := cap.Start(); err != nil {
		t.Fatal(err)
	}
	defer cap.Process.Kill()
	time.Sleep(500 * time.Millisecond) // tcpdump listening
	d := Desired{Links: []Link{shim("10.10.50.3/24")}, DAD: fastDAD}
	want := node.Host.StableMAC("shim0").String()
	for range 10 {
		mustSync(t, node.Host, d)
		node.Exec(t, "ip", "link", "del", "shim0")
	}
	time.Sleep(500 * time.Millisecond)
	cap.Process.Kill()
	cap.Wait()
	n := 0
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.Contains(line, "ARP") {
			continue
		}
		n++
		if f := strings.Fields(line); len(f) < 2 || f[1] != want {
			t.Errorf("an ARP not from %s: %s", want, line)
		}
	}
	if want := fastDAD.Probes + fastDAD.Announcements + 9*(1+fastDAD.Announcements); n < want {
		t.Errorf("captured %d ARPs in 10 cycles, want at least %d:\n%s", n, want, out.String())
	}
}

// syncBuf is an output both the capture and the test use.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
