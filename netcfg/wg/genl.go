package wg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// kernelConn writes a kernel device's configuration as wg(8) does: every
// peer packed into WG_CMD_SET_DEVICE messages until a message is full, a
// peer with more allowed IPs than fit split across messages (its later
// parts never replace what its first part set). wgctrl sends a config of
// more than 32 peers as one message per peer. Reads, and userspace devices
// (UAPI), stay with wgctrl.
//
// A message is at most msgLimit bytes, 32 KiB: wg(8) fills a page (libmnl's
// MNL_SOCKET_BUFFER_SIZE), but the kernel takes a request up to the
// socket's send buffer (208 KiB by default), and a bigger message means
// fewer round trips and less room left unused at the end of each. A
// kernel that refuses it (EMSGSIZE: a send buffer made small) gets pages.
type kernelConn struct {
	c      *genetlink.Conn
	family genetlink.Family
	// msgs counts the messages sent, for tests and benchmarks.
	msgs int64
	// small: the kernel refused a msgLimit message; pages from then on.
	small bool
}

// msgLimit is the most bytes of one message, headers included.
const msgLimit = 32 << 10

// pageLimit is wg(8)'s message size, the fallback.
func pageLimit() int {
	return min(os.Getpagesize(), 8192)
}

// Header sizes: nlmsghdr, genlmsghdr, an attribute header.
const (
	nlmsgHdrLen = 16
	genlHdrLen  = 4
	attrHdrLen  = 4
)

func (k *kernelConn) Close() error { return k.c.Close() }

// attr appends one netlink attribute (header, value, padding to 4).
func attr(b []byte, typ uint16, v []byte) []byte {
	n := attrHdrLen + len(v)
	b = binary.NativeEndian.AppendUint16(b, uint16(n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	for ; n%4 != 0; n++ {
		b = append(b, 0)
	}
	return b
}

func attrU16(b []byte, typ uint16, v uint16) []byte {
	return attr(b, typ, binary.NativeEndian.AppendUint16(nil, v))
}

func attrU32(b []byte, typ uint16, v uint32) []byte {
	return attr(b, typ, binary.NativeEndian.AppendUint32(nil, v))
}

// nest appends a nested attribute whose payload fill writes.
func nest(b []byte, typ uint16, fill func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = fill(b)
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	binary.NativeEndian.PutUint16(b[start+2:], typ|unix.NLA_F_NESTED)
	return b
}

// deviceAttrs are the device-wide attributes of cfg, name first.
func deviceAttrs(name string, cfg wgtypes.Config) []byte {
	b := attr(nil, unix.WGDEVICE_A_IFNAME, append([]byte(name), 0))
	if cfg.PrivateKey != nil {
		b = attr(b, unix.WGDEVICE_A_PRIVATE_KEY, cfg.PrivateKey[:])
	}
	if cfg.ListenPort != nil {
		b = attrU16(b, unix.WGDEVICE_A_LISTEN_PORT, uint16(*cfg.ListenPort))
	}
	if cfg.FirewallMark != nil {
		b = attrU32(b, unix.WGDEVICE_A_FWMARK, uint32(*cfg.FirewallMark))
	}
	if cfg.ReplacePeers {
		b = attrU32(b, unix.WGDEVICE_A_FLAGS, unix.WGDEVICE_F_REPLACE_PEERS)
	}
	return b
}

// peerHead is a peer's attributes other than its allowed IPs; first says
// whether this is the peer's first part (later parts of a split peer carry
// only the key, and never replace the allowed IPs the first part set).
func peerHead(b []byte, p wgtypes.PeerConfig, first bool) ([]byte, error) {
	b = attr(b, unix.WGPEER_A_PUBLIC_KEY, p.PublicKey[:])
	var flags uint32
	if p.Remove {
		flags |= unix.WGPEER_F_REMOVE_ME
	}
	if p.UpdateOnly || !first {
		flags |= unix.WGPEER_F_UPDATE_ONLY
	}
	if p.ReplaceAllowedIPs && first {
		flags |= unix.WGPEER_F_REPLACE_ALLOWEDIPS
	}
	if flags != 0 {
		b = attrU32(b, unix.WGPEER_A_FLAGS, flags)
	}
	if !first {
		return b, nil
	}
	if p.PresharedKey != nil {
		b = attr(b, unix.WGPEER_A_PRESHARED_KEY, p.PresharedKey[:])
	}
	if p.Endpoint != nil {
		sa, err := sockaddr(*p.Endpoint)
		if err != nil {
			return nil, err
		}
		b = attr(b, unix.WGPEER_A_ENDPOINT, sa)
	}
	if p.PersistentKeepaliveInterval != nil {
		b = attrU16(b, unix.WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, uint16(p.PersistentKeepaliveInterval.Seconds()))
	}
	return b, nil
}

// allowedIP appends one allowed IP, as an element of WGPEER_A_ALLOWEDIPS.
func allowedIP(b []byte, n net.IPNet) []byte {
	return nest(b, 0, func(b []byte) []byte {
		ip, fam := n.IP.To4(), uint16(unix.AF_INET)
		if ip == nil {
			ip, fam = n.IP.To16(), unix.AF_INET6
		}
		ones, _ := n.Mask.Size()
		b = attrU16(b, unix.WGALLOWEDIP_A_FAMILY, fam)
		b = attr(b, unix.WGALLOWEDIP_A_IPADDR, ip)
		return attr(b, unix.WGALLOWEDIP_A_CIDR_MASK, []byte{byte(ones)})
	})
}

// allowedIPLen is the size of one encoded allowed IP.
func allowedIPLen(n net.IPNet) int {
	ipLen := 4
	if n.IP.To4() == nil {
		ipLen = 16
	}
	return attrHdrLen + (attrHdrLen + 4) + (attrHdrLen + ipLen) + (attrHdrLen + 4)
}

func sockaddr(ep net.UDPAddr) ([]byte, error) {
	port := binary.BigEndian.AppendUint16(nil, uint16(ep.Port))
	if ip4 := ep.IP.To4(); ip4 != nil {
		b := make([]byte, unix.SizeofSockaddrInet4)
		binary.NativeEndian.PutUint16(b, unix.AF_INET)
		copy(b[2:], port)
		copy(b[4:], ip4)
		return b, nil
	}
	if ip16 := ep.IP.To16(); ip16 != nil {
		b := make([]byte, unix.SizeofSockaddrInet6)
		binary.NativeEndian.PutUint16(b, unix.AF_INET6)
		copy(b[2:], port)
		copy(b[8:], ip16)
		return b, nil
	}
	return nil, fmt.Errorf("invalid endpoint address %v", ep.IP)
}

// messages encodes cfg for device name as the WG_CMD_SET_DEVICE payloads
// to send, in order, each within limit bytes with its headers.
func messages(name string, cfg wgtypes.Config, limit int) ([][]byte, error) {
	room := limit - nlmsgHdrLen - genlHdrLen
	dev := deviceAttrs(name, cfg)
	ifname := attr(nil, unix.WGDEVICE_A_IFNAME, append([]byte(name), 0))
	if len(cfg.Peers) == 0 {
		return [][]byte{dev}, nil
	}
	var out [][]byte
	cur := dev   // the message being filled; its PEERS nest starts at nestAt
	nestAt := -1 // where the open WGDEVICE_A_PEERS nest starts, -1 none
	closeMsg := func() {
		if nestAt >= 0 {
			binary.NativeEndian.PutUint16(cur[nestAt:], uint16(len(cur)-nestAt))
			binary.NativeEndian.PutUint16(cur[nestAt+2:], unix.WGDEVICE_A_PEERS|unix.NLA_F_NESTED)
		}
		out = append(out, cur)
		cur, nestAt = append([]byte(nil), ifname...), -1
	}
	openNest := func() {
		if nestAt < 0 {
			nestAt = len(cur)
			cur = append(cur, 0, 0, 0, 0)
		}
	}
	for _, p := range cfg.Peers {
		ips := p.AllowedIPs
		first := true
		for first || len(ips) > 0 {
			head, err := peerHead(nil, p, first)
			if err != nil {
				return nil, err
			}
			// A peer part: its nest, head, and as many allowed IPs as fit.
			fixed := attrHdrLen + len(head) + attrHdrLen // peer nest + head + allowed-IPs nest
			free := room - len(cur) - attrHdrLen         // the peers nest, if still to open
			if nestAt >= 0 {
				free += attrHdrLen
			}
			fit := 0
			used := fixed
			for fit < len(ips) && used+allowedIPLen(ips[fit]) <= free {
				used += allowedIPLen(ips[fit])
				fit++
			}
			if used > free || fit == 0 && len(ips) > 0 {
				// Not even the head and one allowed IP: a new message.
				if nestAt < 0 && len(cur) == len(ifname) {
					return nil, fmt.Errorf("peer %s does not fit in a netlink message", p.PublicKey)
				}
				closeMsg()
				continue
			}
			openNest()
			part := ips[:fit]
			cur = nest(cur, 0, func(b []byte) []byte {
				b = append(b, head...)
				if len(part) == 0 {
					return b
				}
				return nest(b, unix.WGPEER_A_ALLOWEDIPS, func(b []byte) []byte {
					for _, n := range part {
						b = allowedIP(b, n)
					}
					return b
				})
			})
			ips = ips[fit:]
			first = false
			if len(ips) > 0 {
				closeMsg() // the rest of this peer's IPs in the next message
			}
		}
	}
	if nestAt >= 0 || len(out) == 0 {
		closeMsg()
	}
	return out, nil
}

// configure sends cfg for device name, waiting for each message's ack.
func (k *kernelConn) configure(name string, cfg wgtypes.Config) error {
	limit := msgLimit
	if k.small {
		limit = pageLimit()
	}
	msgs, err := messages(name, cfg, limit)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		k.msgs++
		_, err := k.c.Execute(genetlink.Message{
			Header: genetlink.Header{Command: unix.WG_CMD_SET_DEVICE, Version: unix.WG_GENL_VERSION},
			Data:   m,
		}, k.family.ID, netlink.Request|netlink.Acknowledge)
		if errors.Is(err, unix.EMSGSIZE) && i == 0 && !k.small {
			// Nothing was applied: the first message was refused whole.
			k.small = true
			return k.configure(name, cfg)
		}
		if err != nil {
			return fmt.Errorf("wireguard %s: %w", name, err)
		}
	}
	return nil
}
