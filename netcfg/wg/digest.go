package wg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"time"

	"golang.org/x/sys/unix"
)

// A Digest summarises what of a device's configuration `wg set` can change:
// its keys, listen port and firewall mark, and each peer's key, preshared
// key, endpoint, keepalive and allowed IPs; not its counters or handshake
// times, which move on every packet. Two reads of an unchanged device give
// the same digest; a change to any of those gives another (but for a
// 2^-64 chance). A digest means something only within one process: the
// hash is seeded at random.
//
// The drift poll compares digests so that, with thousands of peers and
// nothing changing, it walks no peer and allocates nothing: a kernel
// device's digest is hashed straight off one generic netlink dump into a
// buffer reused from poll to poll; a userspace device's is a count of the
// UAPI connections other processes made to it (wg(8), wg-quick: the only
// way to change it from outside), so it costs nothing at all.
type Digest struct {
	// Sum is the kernel device's hash, or the userspace device's count.
	Sum uint64
	// Exists is false when there is no such device.
	Exists bool
}

// digestBuf is the dump receive buffer: the kernel fills a dump message up
// to the largest buffer a recvmsg on the socket has offered, capped at
// 32 KiB, so that is also the most one message can be.
const digestBuf = 32 << 10

// digestTimeout bounds each send and receive on the digest socket, so the
// poll never blocks without a deadline.
const digestTimeout = 2 * time.Second

// digester is the digest's netlink socket (in the handle's namespace) and
// buffers, kept from poll to poll.
type digester struct {
	fd     int
	family uint16
	seq    uint32
	buf    []byte
	req    []byte
	h      maphash.Hash
}

func (g *digester) close() {
	if g.fd > 0 {
		unix.Close(g.fd)
	}
	g.fd = -1
}

// Digest returns device name's digest; impl is how it runs (ImplKernel or
// ImplUserspace), as the last observation saw it.
func (h *Handle) Digest(name, impl string) (Digest, error) {
	if impl == ImplUserspace {
		if h.Userspace == nil {
			return Digest{}, nil
		}
		n, ok := h.Userspace.Generation(name)
		return Digest{Sum: n, Exists: ok}, nil
	}
	if !h.kernelHasWireGuard() {
		return Digest{}, nil
	}
	g, err := h.digester()
	if err != nil {
		return Digest{}, err
	}
	d, err := g.digest(name)
	if err != nil {
		h.dropDigester()
	}
	return d, err
}

// dropDigester closes the digest socket after a failed dump: one cut
// short (a timeout) would leave its tail queued and the socket refusing a
// new dump, so the next one starts afresh.
func (h *Handle) dropDigester() {
	if h.dg != nil {
		h.dg.close()
		h.dg = nil
	}
}

// digester opens the digest socket inside the namespace, once.
func (h *Handle) digester() (*digester, error) {
	if h.dg != nil {
		return h.dg, nil
	}
	k, err := h.kernelConn()
	if err != nil {
		return nil, err
	}
	// One seed for the handle's life: a digester made again (after an
	// error) must hash as the last one did, or every device would look
	// changed.
	if h.seed == (maphash.Seed{}) {
		h.seed = maphash.MakeSeed()
	}
	g := &digester{fd: -1, family: k.family.ID, buf: make([]byte, digestBuf), req: make([]byte, 0, 64)}
	g.h.SetSeed(h.seed)
	err = h.Host.Do(func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
		if err != nil {
			return err
		}
		g.fd = fd
		tv := unix.NsecToTimeval(int64(digestTimeout))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
	})
	if err != nil {
		g.close()
		return nil, fmt.Errorf("wireguard digest socket: %w", err)
	}
	h.dg = g
	return g, nil
}

// errDigestReply is a dump reply that does not parse.
var errDigestReply = errors.New("wireguard digest: malformed dump reply")

// digest dumps the device and hashes it. Items are hashed one by one and
// summed, so the result does not depend on where the kernel split the
// dump into messages (a peer whose allowed IPs do not fit is continued in
// the next message under its key again).
func (g *digester) digest(name string) (Digest, error) {
	var sum uint64
	var seen uint32 // device attributes already hashed (they may repeat per message)
	exists, err := g.dump(name, func(m []byte) bool {
		s, ok := g.device(m, &seen)
		sum += s
		return ok
	})
	if err != nil || !exists {
		return Digest{}, err
	}
	return Digest{Sum: sum, Exists: true}, nil
}

// dump asks the kernel for device name's dump and calls each for every
// message's attributes (after the generic netlink header); false from it
// is a malformed reply. exists is false when there is no such WireGuard
// device.
func (g *digester) dump(name string, each func([]byte) bool) (exists bool, err error) {
	g.seq++
	seq := g.seq
	r := g.req[:0]
	r = binary.NativeEndian.AppendUint32(r, 0) // length, below
	r = binary.NativeEndian.AppendUint16(r, g.family)
	r = binary.NativeEndian.AppendUint16(r, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	r = binary.NativeEndian.AppendUint32(r, seq)
	r = binary.NativeEndian.AppendUint32(r, 0)
	r = append(r, unix.WG_CMD_GET_DEVICE, unix.WG_GENL_VERSION, 0, 0)
	n := attrHdrLen + len(name) + 1
	r = binary.NativeEndian.AppendUint16(r, uint16(n))
	r = binary.NativeEndian.AppendUint16(r, unix.WGDEVICE_A_IFNAME)
	r = append(r, name...)
	r = append(r, 0)
	for ; n%4 != 0; n++ {
		r = append(r, 0)
	}
	binary.NativeEndian.PutUint32(r, uint32(len(r)))
	g.req = r
	// A signal may interrupt a call on a socket with a timeout (EINTR
	// then, not a restart): try again.
	_, err = unix.Write(g.fd, r)
	for err == unix.EINTR {
		_, err = unix.Write(g.fd, r)
	}
	if err != nil {
		return false, fmt.Errorf("wireguard %s: dump: %w", name, err)
	}
	for {
		m, err := unix.Read(g.fd, g.buf)
		for err == unix.EINTR {
			m, err = unix.Read(g.fd, g.buf)
		}
		if err != nil {
			return false, fmt.Errorf("wireguard %s: dump: %w", name, err)
		}
		b := g.buf[:m]
		for len(b) >= nlmsgHdrLen {
			l := int(binary.NativeEndian.Uint32(b))
			typ := binary.NativeEndian.Uint16(b[4:])
			mseq := binary.NativeEndian.Uint32(b[8:])
			if l < nlmsgHdrLen || l > len(b) {
				return false, errDigestReply
			}
			msg := b[nlmsgHdrLen:l]
			b = b[min(nlmsgAlign(l), len(b)):]
			if mseq != seq {
				continue // not this dump's
			}
			switch typ {
			case unix.NLMSG_DONE:
				return true, nil
			case unix.NLMSG_ERROR:
				if len(msg) < 4 {
					return false, errDigestReply
				}
				errno := -int32(binary.NativeEndian.Uint32(msg))
				if errno == 0 {
					continue
				}
				switch e := unix.Errno(errno); e {
				case unix.ENODEV, unix.ENOENT, unix.EOPNOTSUPP:
					// No such link, or not a WireGuard one.
					return false, nil
				}
				return false, fmt.Errorf("wireguard %s: dump: %w", name, unix.Errno(errno))
			}
			if len(msg) < genlHdrLen || !each(msg[genlHdrLen:]) {
				return false, errDigestReply
			}
		}
	}
}

func nlmsgAlign(n int) int { return (n + 3) &^ 3 }

// attrs calls fn for each attribute in b, with its type (flags masked off)
// and value; false on a malformed attribute.
func attrs(b []byte, fn func(typ uint16, v []byte) bool) bool {
	for len(b) >= attrHdrLen {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < attrHdrLen || l > len(b) {
			return false
		}
		if !fn(typ, b[attrHdrLen:l]) {
			return false
		}
		b = b[min(nlmsgAlign(l), len(b)):]
	}
	return true
}

// device hashes one dump message's attributes.
func (g *digester) device(b []byte, seen *uint32) (uint64, bool) {
	var sum uint64
	ok := attrs(b, func(typ uint16, v []byte) bool {
		switch typ {
		case unix.WGDEVICE_A_PEERS:
			return attrs(v, func(_ uint16, peer []byte) bool {
				s, ok := g.peer(peer)
				sum += s
				return ok
			})
		case unix.WGDEVICE_A_IFNAME:
			return true
		}
		if typ < 32 {
			if *seen&(1<<typ) != 0 {
				return true
			}
			*seen |= 1 << typ
		}
		sum += g.item(nil, typ, v)
		return true
	})
	return sum, ok
}

// peer hashes one peer part: each configuration attribute, and each
// allowed IP, as an item of its own under the peer's key.
func (g *digester) peer(b []byte) (uint64, bool) {
	var key []byte
	if !attrs(b, func(typ uint16, v []byte) bool {
		if typ == unix.WGPEER_A_PUBLIC_KEY {
			key = v
		}
		return true
	}) || key == nil {
		return 0, false
	}
	var sum uint64
	ok := attrs(b, func(typ uint16, v []byte) bool {
		switch typ {
		case unix.WGPEER_A_PUBLIC_KEY, unix.WGPEER_A_LAST_HANDSHAKE_TIME, unix.WGPEER_A_RX_BYTES, unix.WGPEER_A_TX_BYTES:
		case unix.WGPEER_A_ALLOWEDIPS:
			return attrs(v, func(_ uint16, ip []byte) bool {
				sum += g.item(key, typ, ip)
				return true
			})
		default:
			sum += g.item(key, typ, v)
		}
		return true
	})
	return sum, ok
}

// item hashes one (peer key, attribute type, value).
func (g *digester) item(key []byte, typ uint16, v []byte) uint64 {
	g.h.Reset()
	g.h.Write(key)
	g.h.WriteByte(byte(typ))
	g.h.WriteByte(byte(typ >> 8))
	g.h.Write(v)
	return g.h.Sum64()
}
