package piastub

import (
	"encoding/binary"
	"io"
	"net/netip"
	"strings"
)

// The resolvers addKey names (dns_servers), on the stub's loopback: from
// the node they are reachable only through the tunnel. They answer
// TestName with TestAddr, NXDOMAIN for other names, and count queries.

// DNSServers are the resolvers addKey hands out, in order.
var DNSServers = []netip.Addr{netip.MustParseAddr("10.0.0.243"), netip.MustParseAddr("10.0.0.242")}

// TestName resolves, at the stub's resolvers, to TestAddr.
const TestName = "test.piastub.example"

// TestAddr is TestName's address.
var TestAddr = netip.MustParseAddr("198.51.100.77")

func (s *Stub) startDNS() {
	for _, a := range DNSServers {
		run(s.t, s.NS, "ip addr add "+a.String()+"/32 dev lo")
		addr := netip.AddrPortFrom(a, 53).String()
		pc, err := s.NS.Host.ListenPacket("udp", addr)
		if err != nil {
			s.t.Fatalf("piastub: dns %s: %v", a, err)
		}
		l, err := s.NS.Host.Listen("tcp", addr)
		if err != nil {
			s.t.Fatalf("piastub: dns %s: %v", a, err)
		}
		s.t.Cleanup(func() { pc.Close(); l.Close() })
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				s.count("dns:" + a.String())
				if ans := dnsAnswer(buf[:n]); ans != nil {
					pc.WriteTo(ans, from)
				}
			}
		}()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				s.count("dns:" + a.String())
				go func() {
					defer c.Close()
					var hdr [2]byte
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(hdr[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					if ans := dnsAnswer(q); ans != nil {
						c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(ans))), ans...))
					}
				}()
			}
		}()
	}
}

// dnsAnswer answers one query: TestName's A record, an empty NOERROR for
// the root, NXDOMAIN otherwise; nil for what is not a query.
func dnsAnswer(q []byte) []byte {
	if len(q) < 12 || q[2]&0x80 != 0 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		n := int(q[i])
		if i+1+n > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+n]))
		i += 1 + n
	}
	if i+5 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i+1:])
	question := q[12 : i+5]
	name := strings.ToLower(strings.Join(labels, "."))
	resp := append([]byte{q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0}, question...)
	switch {
	case name == TestName && qtype == 1:
		resp[7] = 1
		a := TestAddr.As4()
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, a[0], a[1], a[2], a[3])
	case name == TestName || name == "":
	default:
		resp[3] |= 3 // NXDOMAIN
	}
	return resp
}
