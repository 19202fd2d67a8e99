package pia

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"golang.org/x/sys/unix"
)

// Ping sends one ICMP echo request to dst out of the device dev (bound to
// it, so it goes through the tunnel whatever the routing tables say) and
// waits up to timeout for the reply, in h's namespace.
func Ping(h *host.Host, dev string, dst netip.Addr, timeout time.Duration) error {
	if !dst.Is4() {
		return errors.New("probe: not an IPv4 address")
	}
	return h.Do(func() error { return ping(dev, dst, timeout) })
}

func ping(dev string, dst netip.Addr, timeout time.Duration) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev); err != nil {
		return fmt.Errorf("probe: bind to %s: %w", dev, err)
	}
	// Let only echo replies through (ICMP_FILTER: a set bit blocks a type).
	if err := unix.SetsockoptInt(fd, unix.SOL_RAW, 1, ^(1 << 0)); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	id, seq := binary.BigEndian.Uint16(rnd[:2]), binary.BigEndian.Uint16(rnd[2:])
	pkt := make([]byte, 8+16)
	pkt[0] = 8 // echo request
	binary.BigEndian.PutUint16(pkt[4:], id)
	binary.BigEndian.PutUint16(pkt[6:], seq)
	copy(pkt[8:], "nodeagent-probe!")
	binary.BigEndian.PutUint16(pkt[2:], checksum(pkt))
	if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
		return fmt.Errorf("probe: send: %w", err)
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("probe: no echo reply from %s through %s within %s", dst, dev, timeout)
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("probe: receive: %w", err)
		}
		sa, ok := from.(*unix.SockaddrInet4)
		if !ok || netip.AddrFrom4(sa.Addr) != dst || n < 20 {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		if n < ihl+8 {
			continue
		}
		icmp := buf[ihl:n]
		if icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id && binary.BigEndian.Uint16(icmp[6:]) == seq {
			return nil
		}
	}
}

// checksum is the Internet checksum of b.
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// ProbeDNS asks the resolver server, through device dev, for the root's
// NS records and waits up to timeout for any answer to that query.
func ProbeDNS(h *host.Host, dev string, server netip.Addr, timeout time.Duration) error {
	if !server.Is4() {
		return errors.New("dns probe: not an IPv4 address")
	}
	return h.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
		if err != nil {
			return fmt.Errorf("dns probe: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev); err != nil {
			return fmt.Errorf("dns probe: bind to %s: %w", dev, err)
		}
		var id [2]byte
		rand.Read(id[:])
		// Header: id, RD, one question; the root, type NS, class IN.
		q := []byte{id[0], id[1], 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1}
		if err := unix.Sendto(fd, q, 0, &unix.SockaddrInet4{Addr: server.As4(), Port: 53}); err != nil {
			return fmt.Errorf("dns probe: send: %w", err)
		}
		deadline := time.Now().Add(timeout)
		buf := make([]byte, 1500)
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("dns probe: no answer from %s through %s within %s", server, dev, timeout)
			}
			tv := unix.NsecToTimeval(left.Nanoseconds())
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return fmt.Errorf("dns probe: receive: %w", err)
			}
			if sa, ok := from.(*unix.SockaddrInet4); ok && netip.AddrFrom4(sa.Addr) == server && n >= 12 && buf[0] == id[0] && buf[1] == id[1] && buf[2]&0x80 != 0 {
				return nil
			}
		}
	})
}
