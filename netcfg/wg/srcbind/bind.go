// Package srcbind is a wireguard-go conn.Bind that answers every peer from
// the local address its packets arrived at, as kernel WireGuard does.
//
// # Why not conn.NewDefaultBind
//
// wireguard-go's StdNetBind is meant to do the same ("sticky sockets"): it
// asks for IP_PKTINFO / IPV6_PKTINFO on receive, keeps the destination
// address of each datagram in the endpoint, and puts it back as the source
// when sending. On Linux >= 5.12 it also turns UDP GRO on, and then every
// read goes through splitCoalescedMessages, which copies each datagram's
// bytes, length and sender into the front of the batch but not its control
// message. getSrcFromControl then sees no PKTINFO and clears the source,
// for every packet, coalesced or not, so Send leaves the source to the
// kernel, which picks the interface's primary address. A node with a
// second address (or one on another interface) answers from the wrong one:
// a stateful NAT in front of the client drops the answers and no handshake
// completes; without NAT the client's endpoint moves to the primary address.
//
// Wrapping StdNetBind cannot repair that. Its receive functions have lost
// the PKTINFO before they return; the endpoint's source is unexported and
// Send insists on *conn.StdNetEndpoint; and UDP GRO cannot be turned off
// from outside: the socket options are applied by an unexported control
// list, the sockets are unexported, and rxOffload is decided at Open by
// reading UDP_GRO back, so clearing the option later would still leave
// every read on the split path that drops the PKTINFO.
//
// # What this Bind does
//
// It opens one UDP socket per family (the same port, IPV6_V6ONLY on the
// IPv6 one, the same 7 MiB buffers, IP_PKTINFO and IPV6_RECVPKTINFO on) and
// reads and writes batches with recvmmsg/sendmmsg. UDP GRO and GSO are left
// off: each datagram arrives alone with its own PKTINFO, so no split step
// can separate a packet from its destination address. That costs the
// coalescing of bulk traffic into fewer socket buffers, not correctness;
// batching still takes up to 128 datagrams per system call.
//
// Each received endpoint remembers the datagram's destination address;
// Send passes it back as the source (IP_PKTINFO's ipi_spec_dst,
// IPV6_PKTINFO's ipi6_addr). The interface is not pinned (ipi_ifindex is
// 0), so routing picks the way out as it does for kernel WireGuard; only an
// IPv6 link-local source keeps the interface it arrived on, which it needs.
// When the address has gone away the kernel refuses it (ENETUNREACH for
// IPv4, EINVAL for IPv6); Send then sends again without it and, if that
// works, the endpoint forgets it, at once, where StdNetBind would keep
// failing until a handshake retry clears it.
//
// Endpoints are safe for concurrent use: ClearSrc (called by the device
// under its peer lock) only sets a flag that Send reads atomically.
package srcbind

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
)

// socketBufferSize is StdNetBind's: the socket buffers asked for (beyond
// net.core.{r,w}mem_max where the caller may).
const socketBufferSize = 7 << 20

// controlSize holds one IPV6_PKTINFO (the larger of the two) with room to
// spare, so a PKTINFO is never truncated.
const controlSize = 64

var (
	_ conn.Bind     = (*Bind)(nil)
	_ conn.Endpoint = (*Endpoint)(nil)
)

// Bind is a conn.Bind that keeps each peer's local address (package doc).
// Its zero value is not usable; call New.
type Bind struct {
	mu  sync.Mutex
	v4  *net.UDPConn
	v6  *net.UDPConn
	rc4 syscall.RawConn
	rc6 syscall.RawConn

	senders sync.Pool // *sender
}

// New returns a closed Bind; the device opens it.
func New() *Bind {
	return &Bind{senders: sync.Pool{New: func() any { return newSender() }}}
}

// Endpoint is a peer's address and the local address its last packet came
// to.
type Endpoint struct {
	dst netip.AddrPort
	// src is the local address to send from; invalid for an endpoint that
	// was configured rather than received. ifidx is the interface the packet
	// arrived on, used only for an IPv6 link-local src.
	src   netip.Addr
	ifidx uint32
	// cleared is set by ClearSrc: src is then no longer used. It is the only
	// field that changes after the endpoint is made.
	cleared atomic.Bool
}

// ClearSrc forgets the local address, so the kernel chooses one.
func (e *Endpoint) ClearSrc() { e.cleared.Store(true) }

// SrcIP returns the local address packets to the peer are sent from, or
// the zero Addr when the kernel chooses.
func (e *Endpoint) SrcIP() netip.Addr {
	if e.cleared.Load() {
		return netip.Addr{}
	}
	return e.src
}

// SrcToString returns SrcIP as text ("" when the kernel chooses).
func (e *Endpoint) SrcToString() string {
	if src := e.SrcIP(); src.IsValid() {
		return src.String()
	}
	return ""
}

// DstIP returns the peer's address.
func (e *Endpoint) DstIP() netip.Addr { return e.dst.Addr() }

// DstToString returns the peer's address and port, as "endpoint=" shows it.
func (e *Endpoint) DstToString() string { return e.dst.String() }

// DstToBytes returns the peer's address and port for the mac2 cookie; it
// is StdNetEndpoint's encoding.
func (e *Endpoint) DstToBytes() []byte {
	b, _ := e.dst.MarshalBinary()
	return b
}

// ParseEndpoint parses a configured peer endpoint ("ip:port"); it has no
// local address until the peer's first packet arrives.
func (*Bind) ParseEndpoint(s string) (conn.Endpoint, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, err
	}
	return &Endpoint{dst: ap}, nil
}

// BatchSize is the number of datagrams read or written per system call.
func (*Bind) BatchSize() int { return conn.IdealBatchSize }

// Open opens the IPv4 and IPv6 sockets on port (0: the same free port for
// both). A family the kernel lacks (EAFNOSUPPORT) is left out. The sockets
// belong to the network namespace of the calling thread.
func (b *Bind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.v4 != nil || b.v6 != nil {
		return nil, 0, conn.ErrBindAlreadyOpen
	}
	var (
		v4, v6 *net.UDPConn
		actual int
		err    error
	)
	for tries := 0; ; tries++ {
		v4, actual, err = listen("udp4", int(port))
		if err != nil && !errors.Is(err, syscall.EAFNOSUPPORT) {
			return nil, 0, err
		}
		v6, actual, err = listen("udp6", actual)
		if err == nil || errors.Is(err, syscall.EAFNOSUPPORT) {
			break
		}
		if v4 != nil {
			v4.Close()
		}
		// The port the kernel chose for IPv4 is taken for IPv6: choose again.
		if port != 0 || !errors.Is(err, syscall.EADDRINUSE) || tries >= 100 {
			return nil, 0, err
		}
	}
	var fns []conn.ReceiveFunc
	for _, c := range []*net.UDPConn{v4, v6} {
		if c == nil {
			continue
		}
		rc, err := c.SyscallConn()
		if err != nil {
			closeAll(v4, v6)
			return nil, 0, err
		}
		if c == v4 {
			b.v4, b.rc4 = c, rc
			fns = append(fns, newReader(rc, false).receiveIPv4)
		} else {
			b.v6, b.rc6 = c, rc
			fns = append(fns, newReader(rc, true).receiveIPv6)
		}
	}
	if len(fns) == 0 {
		return nil, 0, syscall.EAFNOSUPPORT
	}
	return fns, uint16(actual), nil
}

func closeAll(cs ...*net.UDPConn) {
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}

// listen opens one family's socket on port (0 or the other family's) and
// returns the port it got. A family the kernel lacks returns no socket.
func listen(network string, port int) (*net.UDPConn, int, error) {
	lc := net.ListenConfig{Control: func(network, _ string, c syscall.RawConn) error {
		var err error
		cerr := c.Control(func(fd uintptr) { err = setOptions(int(fd), network) })
		if cerr != nil {
			return cerr
		}
		return err
	}}
	pc, err := lc.ListenPacket(context.Background(), network, ":"+strconv.Itoa(port))
	if err != nil {
		return nil, port, err
	}
	c := pc.(*net.UDPConn)
	return c, c.LocalAddr().(*net.UDPAddr).Port, nil
}

// setOptions is what the socket needs before bind: buffers (best effort,
// as StdNetBind), PKTINFO on receive, and IPv6-only for the IPv6 socket.
func setOptions(fd int, network string) error {
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, socketBufferSize)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, socketBufferSize)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBufferSize)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBufferSize)
	switch network {
	case "udp4":
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, 1); err != nil {
			return fmt.Errorf("IP_PKTINFO: %w", err)
		}
	case "udp6":
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1); err != nil {
			return fmt.Errorf("IPV6_RECVPKTINFO: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return fmt.Errorf("IPV6_V6ONLY: %w", err)
		}
	default:
		return fmt.Errorf("unhandled network %s: %w", network, unix.EINVAL)
	}
	return nil
}

// Close closes both sockets; the receive functions then return
// net.ErrClosed.
func (b *Bind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var err4, err6 error
	if b.v4 != nil {
		err4 = b.v4.Close()
	}
	if b.v6 != nil {
		err6 = b.v6.Close()
	}
	b.v4, b.v6, b.rc4, b.rc6 = nil, nil, nil, nil
	return errors.Join(err4, err6)
}

// SetMark sets SO_MARK on both sockets (a no-op while closed).
func (b *Bind) SetMark(mark uint32) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, rc := range []syscall.RawConn{b.rc4, b.rc6} {
		if rc == nil {
			continue
		}
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		}); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("SO_MARK: %w", err)
		}
	}
	return nil
}

// reader is one socket's receive state. The device reads each receive
// function from one goroutine; mu keeps it correct if something else does.
type reader struct {
	mu    sync.Mutex
	rc    syscall.RawConn
	is6   bool
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	oob   []byte                  // controlSize per message
}

func newReader(rc syscall.RawConn, is6 bool) *reader {
	n := conn.IdealBatchSize
	return &reader{
		rc:    rc,
		is6:   is6,
		hdrs:  make([]unix.Mmsghdr, n),
		iovs:  make([]unix.Iovec, n),
		names: make([]unix.RawSockaddrInet6, n),
		oob:   make([]byte, n*controlSize),
	}
}

// receiveIPv4 and receiveIPv6 are the receive functions; their names end
// in the family so wireguard-go's logs call them v4 and v6.
func (r *reader) receiveIPv4(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
	return r.receive(bufs, sizes, eps)
}

func (r *reader) receiveIPv6(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
	return r.receive(bufs, sizes, eps)
}

func (r *reader) receive(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(len(bufs), len(r.hdrs))
	if n == 0 {
		return 0, nil
	}
	for i := range n {
		r.iovs[i] = unix.Iovec{}
		if len(bufs[i]) > 0 {
			r.iovs[i].Base = &bufs[i][0]
			r.iovs[i].SetLen(len(bufs[i]))
		}
		h := &r.hdrs[i]
		*h = unix.Mmsghdr{}
		h.Hdr.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Hdr.Namelen = unix.SizeofSockaddrInet6
		h.Hdr.Iov = &r.iovs[i]
		h.Hdr.SetIovlen(1)
		h.Hdr.Control = &r.oob[i*controlSize]
		h.Hdr.SetControllen(controlSize)
	}
	var (
		got   int
		errno syscall.Errno
	)
	err := r.rc.Read(func(fd uintptr) bool {
		m, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(n), 0, 0, 0)
		for e == unix.EINTR {
			m, _, e = unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(n), 0, 0, 0)
		}
		got, errno = int(m), e
		return errno != unix.EAGAIN
	})
	runtime.KeepAlive(bufs)
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, os.NewSyscallError("recvmmsg", errno)
	}
	var prev *Endpoint
	for i := range got {
		h := &r.hdrs[i]
		sizes[i] = int(h.Len)
		dst := r.from(i)
		var src netip.Addr
		var ifidx uint32
		if h.Hdr.Flags&unix.MSG_CTRUNC == 0 {
			src, ifidx = parsePktinfo(r.oob[i*controlSize : i*controlSize+int(h.Hdr.Controllen)])
		}
		// Datagrams of one batch from the same peer to the same address
		// share an endpoint: the device keeps only the last one anyway.
		if prev == nil || prev.dst != dst || prev.src != src || prev.ifidx != ifidx {
			prev = &Endpoint{dst: dst, src: src, ifidx: ifidx}
		}
		eps[i] = prev
	}
	return got, nil
}

// from returns the address message i came from.
func (r *reader) from(i int) netip.AddrPort {
	if !r.is6 {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.names[i]))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port))
	}
	sa := &r.names[i]
	a := netip.AddrFrom16(sa.Addr)
	if sa.Scope_id != 0 {
		a = a.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
	}
	return netip.AddrPortFrom(a, ntohs(sa.Port))
}

// parsePktinfo returns the destination address and arrival interface from
// a received control message, or the zero Addr when it has no PKTINFO.
func parsePktinfo(control []byte) (netip.Addr, uint32) {
	for len(control) >= unix.SizeofCmsghdr {
		h, data, rest, err := unix.ParseOneSocketControlMessage(control)
		if err != nil {
			break
		}
		control = rest
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			info := (*unix.Inet4Pktinfo)(unsafe.Pointer(&data[0]))
			// ipi_spec_dst is the local address to answer from: the
			// destination itself for unicast.
			return netip.AddrFrom4(info.Spec_dst), uint32(info.Ifindex)
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			info := (*unix.Inet6Pktinfo)(unsafe.Pointer(&data[0]))
			return netip.AddrFrom16(info.Addr), info.Ifindex
		}
	}
	return netip.Addr{}, 0
}

// sender is one Send's scratch space.
type sender struct {
	hdrs [conn.IdealBatchSize]unix.Mmsghdr
	iovs [conn.IdealBatchSize]unix.Iovec
	sa   unix.RawSockaddrInet6 // large enough for either family
	oob  []byte
}

func newSender() *sender { return &sender{oob: make([]byte, controlSize)} }

// Send writes bufs to the peer, from the endpoint's local address if it has
// one. If the kernel refuses that address (it is no longer the node's), the
// endpoint forgets it and the rest is sent from whatever address the
// kernel chooses.
func (b *Bind) Send(bufs [][]byte, ep conn.Endpoint) error {
	e, ok := ep.(*Endpoint)
	if !ok {
		return conn.ErrWrongEndpointType
	}
	dst := e.dst.Addr()
	is4 := dst.Unmap().Is4()
	b.mu.Lock()
	rc := b.rc6
	if is4 {
		rc = b.rc4
	}
	b.mu.Unlock()
	if rc == nil {
		return syscall.EAFNOSUPPORT
	}

	s := b.senders.Get().(*sender)
	defer b.senders.Put(s)
	namelen := s.setDst(e.dst, is4)
	src := e.SrcIP()
	controllen := s.setSrc(src, e.ifidx)

	for len(bufs) > 0 {
		n := min(len(bufs), len(s.hdrs))
		for i := range n {
			s.iovs[i] = unix.Iovec{}
			if len(bufs[i]) > 0 {
				s.iovs[i].Base = &bufs[i][0]
				s.iovs[i].SetLen(len(bufs[i]))
			}
			h := &s.hdrs[i]
			*h = unix.Mmsghdr{}
			h.Hdr.Name = (*byte)(unsafe.Pointer(&s.sa))
			h.Hdr.Namelen = namelen
			h.Hdr.Iov = &s.iovs[i]
			h.Hdr.SetIovlen(1)
			if controllen > 0 {
				h.Hdr.Control = &s.oob[0]
				h.Hdr.SetControllen(controllen)
			}
		}
		for start := 0; start < n; {
			sent, err := sendmmsg(rc, s.hdrs[start:n])
			if err != nil && controllen > 0 && srcRefused(err) {
				// Perhaps the local address is gone. Try again without it;
				// if that works, the endpoint forgets it, as kernel
				// WireGuard does, rather than fail until the next handshake
				// retry clears it.
				for i := start; i < n; i++ {
					s.hdrs[i].Hdr.Control = nil
					s.hdrs[i].Hdr.SetControllen(0)
				}
				controllen = 0
				sent, err = sendmmsg(rc, s.hdrs[start:n])
				if err == nil {
					e.ClearSrc()
				}
			}
			if err != nil {
				runtime.KeepAlive(bufs)
				return err
			}
			start += sent
		}
		runtime.KeepAlive(bufs)
		bufs = bufs[n:]
	}
	return nil
}

// srcRefused reports whether err is how the kernel refuses a source address
// that is not the node's (measured, TestSourceGone): EINVAL for IPv6,
// ENETUNREACH for IPv4 (the route lookup finds no device with that
// address). ENETUNREACH also means no route at all; Send tells the two
// apart by trying again without the source.
func srcRefused(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENETUNREACH)
}

// setDst writes the peer's socket address and returns its length.
func (s *sender) setDst(dst netip.AddrPort, is4 bool) uint32 {
	s.sa = unix.RawSockaddrInet6{}
	if is4 {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&s.sa))
		sa.Family = unix.AF_INET
		sa.Port = htons(dst.Port())
		sa.Addr = dst.Addr().Unmap().As4()
		return unix.SizeofSockaddrInet4
	}
	s.sa.Family = unix.AF_INET6
	s.sa.Port = htons(dst.Port())
	s.sa.Addr = dst.Addr().As16()
	if z := dst.Addr().Zone(); z != "" {
		// Received link-local peers carry their scope as a number.
		if id, err := strconv.ParseUint(z, 10, 32); err == nil {
			s.sa.Scope_id = uint32(id)
		}
	}
	return unix.SizeofSockaddrInet6
}

// setSrc writes the PKTINFO that sends from src and returns its length, 0
// when src is not set (or is of the other family: the endpoint's address
// was changed under it).
func (s *sender) setSrc(src netip.Addr, ifidx uint32) int {
	clear(s.oob)
	if !src.IsValid() {
		return 0
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&s.oob[0]))
	data := unsafe.Pointer(&s.oob[unix.CmsgLen(0)])
	if s.sa.Family == unix.AF_INET {
		if !src.Is4() {
			return 0
		}
		h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
		// No ipi_ifindex: the route decides the way out.
		(*unix.Inet4Pktinfo)(data).Spec_dst = src.As4()
		return unix.CmsgSpace(unix.SizeofInet4Pktinfo)
	}
	if !src.Is6() || src.Is4In6() {
		return 0
	}
	h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
	info := (*unix.Inet6Pktinfo)(data)
	info.Addr = src.As16()
	if src.IsLinkLocalUnicast() {
		info.Ifindex = ifidx
	}
	return unix.CmsgSpace(unix.SizeofInet6Pktinfo)
}

// sendmmsg sends hdrs and returns how many went; a blocked socket waits.
func sendmmsg(rc syscall.RawConn, hdrs []unix.Mmsghdr) (int, error) {
	var (
		sent  int
		errno syscall.Errno
	)
	err := rc.Write(func(fd uintptr) bool {
		m, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), 0, 0, 0)
		for e == unix.EINTR {
			m, _, e = unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), 0, 0, 0)
		}
		sent, errno = int(m), e
		return errno != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, os.NewSyscallError("sendmmsg", errno)
	}
	if sent <= 0 {
		// sendmmsg sends at least one message or fails; do not spin.
		return 0, os.NewSyscallError("sendmmsg", unix.EIO)
	}
	return sent, nil
}

func htons(v uint16) uint16 {
	var b [2]byte
	b[0], b[1] = byte(v>>8), byte(v)
	return *(*uint16)(unsafe.Pointer(&b))
}

func ntohs(v uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&v))
	return uint16(b[0])<<8 | uint16(b[1])
}
