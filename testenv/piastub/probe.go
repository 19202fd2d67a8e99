package piastub

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
)

// Probes of the lab's services, from inside its namespaces.

// Serve listens on addr in ns until the test ends: over TCP it writes
// "hello" to each connection, over UDP it echoes each datagram. It stands
// for an app on the VLAN that the forwarded port reaches.
func Serve(t testing.TB, ns *testenv.NetNS, addr string) {
	t.Helper()
	ServeTCP(t, ns, addr)
	pc, err := ns.Host.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			pc.WriteTo(b[:n], from)
		}
	}()
}

// ServeTCP is Serve over TCP alone.
func ServeTCP(t testing.TB, ns *testenv.NetNS, addr string) {
	t.Helper()
	l, err := ns.Host.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
}

// ReachTCP reports whether a TCP connection from ns to addr gets "hello".
func ReachTCP(ns *testenv.NetNS, addr string, timeout time.Duration) bool {
	ok := false
	ns.Host.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return nil
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		b := make([]byte, 5)
		n, _ := c.Read(b)
		ok = string(b[:n]) == "hello"
		return nil
	})
	return ok
}

// ReachUDP reports whether a datagram from ns to addr is echoed.
func ReachUDP(ns *testenv.NetNS, addr string, timeout time.Duration) bool {
	ok := false
	ns.Host.Do(func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return nil
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		c.Write([]byte("ping"))
		b := make([]byte, 8)
		n, _ := c.Read(b)
		ok = string(b[:n]) == "ping"
		return nil
	})
	return ok
}

// DNSQuery asks server (over UDP, from ns) for name's A record.
func DNSQuery(ns *testenv.NetNS, server, name string) (netip.Addr, error) {
	var ans netip.Addr
	err := ns.Host.Do(func() error {
		c, err := net.Dial("udp", net.JoinHostPort(server, "53"))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
		for _, label := range strings.Split(name, ".") {
			q = append(append(q, byte(len(label))), label...)
		}
		q = append(q, 0, 0, 1, 0, 1)
		if _, err := c.Write(q); err != nil {
			return err
		}
		b := make([]byte, 512)
		n, err := c.Read(b)
		if err != nil {
			return err
		}
		if n < len(q)+16 || binary.BigEndian.Uint16(b[6:]) != 1 {
			return fmt.Errorf("no answer record (rcode %d)", b[3]&0xf)
		}
		ans = netip.AddrFrom4([4]byte(b[n-4 : n]))
		return nil
	})
	return ans, err
}
