package wg

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// kernelDevice is a kernel device as one dump has it.
type kernelDevice struct {
	privateKey Key
	publicKey  wgtypes.Key
	listenPort int
	fwMark     int
	peers      map[wgtypes.Key]ObservedPeer
	digest     Digest
}

// readKernel reads kernel device name whole, straight off the generic
// netlink dump into the observation's types (wgctrl's reader builds its
// own types first, then each peer is copied again), and hashes the same
// dump into the device's digest, so the digest is exactly of the state
// observed. exists is false when there is no such WireGuard device.
// hint is how many peers to make room for (peerHint).
func (h *Handle) readKernel(name string, hint int) (kd kernelDevice, exists bool, err error) {
	g, err := h.digester()
	if err != nil {
		return kernelDevice{}, false, err
	}
	kd.peers = make(map[wgtypes.Key]ObservedPeer, hint)
	// The peers' allowed IPs are cut from shared slabs, a slice of its
	// own (its capacity its length) for each peer: one allocation per
	// slab, not one per peer.
	var slab []netip.Prefix
	var sum uint64
	var seen, have uint32
	exists, err = g.dump(name, func(m []byte) bool {
		s, ok := g.device(m, &seen)
		sum += s
		return ok && attrs(m, func(typ uint16, v []byte) bool {
			first := typ < 32 && have&(1<<typ) == 0
			if typ < 32 {
				have |= 1 << typ
			}
			switch typ {
			case unix.WGDEVICE_A_PRIVATE_KEY:
				if first && len(v) == 32 {
					copy(kd.privateKey[:], v)
				}
			case unix.WGDEVICE_A_PUBLIC_KEY:
				if first && len(v) == 32 {
					copy(kd.publicKey[:], v)
				}
			case unix.WGDEVICE_A_LISTEN_PORT:
				if first && len(v) >= 2 {
					kd.listenPort = int(binary.NativeEndian.Uint16(v))
				}
			case unix.WGDEVICE_A_FWMARK:
				if first && len(v) >= 4 {
					kd.fwMark = int(binary.NativeEndian.Uint32(v))
				}
			case unix.WGDEVICE_A_PEERS:
				return attrs(v, func(_ uint16, b []byte) bool { return readPeer(b, kd.peers, &slab) })
			}
			return true
		})
	})
	if err != nil {
		h.dropDigester()
		return kernelDevice{}, false, err
	}
	if !exists {
		return kernelDevice{}, false, nil
	}
	for k, p := range kd.peers {
		if len(p.AllowedIPs) > 1 {
			sortPrefixes(p.AllowedIPs)
			kd.peers[k] = p
		}
	}
	kd.digest = Digest{Sum: sum, Exists: true}
	h.sawPeers(name, len(kd.peers))
	return kd, true, nil
}

// peerHint is how many peers a read of device name makes room for: as
// many as it had when this handle last read it, or, where it has not
// read it yet, want (the desired count), so that the map of thousands of
// peers a device taken from a stage has is made once rather than grown
// and copied a dozen times.
func (h *Handle) peerHint(name string, want int) int {
	if n, ok := h.peersSeen[name]; ok {
		return n
	}
	return want
}

// sawPeers records that device name had n peers when last read, for
// peerHint.
func (h *Handle) sawPeers(name string, n int) {
	if h.peersSeen == nil {
		h.peersSeen = map[string]int{}
	}
	h.peersSeen[name] = n
}

// slabPrefixes is how many allowed IPs a slab holds.
const slabPrefixes = 1024

// readPeer parses one peer part into peers: a first part makes the peer,
// a later one (the same key, more allowed IPs) adds to it. A new peer's
// allowed IPs are cut from *slab (refilled when short); a later part's
// are appended, which copies them out of the slab, as its capacity is
// its length.
func readPeer(b []byte, peers map[wgtypes.Key]ObservedPeer, slab *[]netip.Prefix) bool {
	var p ObservedPeer
	var key, ips []byte
	ok := attrs(b, func(typ uint16, v []byte) bool {
		switch typ {
		case unix.WGPEER_A_PUBLIC_KEY:
			key = v
		case unix.WGPEER_A_PRESHARED_KEY:
			if len(v) == 32 {
				copy(p.PresharedKey[:], v)
			}
		case unix.WGPEER_A_ENDPOINT:
			p.Endpoint = parseSockaddr(v)
		case unix.WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL:
			if len(v) >= 2 {
				p.Keepalive = time.Duration(binary.NativeEndian.Uint16(v)) * time.Second
			}
		case unix.WGPEER_A_LAST_HANDSHAKE_TIME:
			if len(v) == 16 {
				sec, nsec := int64(binary.NativeEndian.Uint64(v)), int64(binary.NativeEndian.Uint64(v[8:]))
				if sec > 0 || nsec > 0 {
					p.LastHandshake = time.Unix(sec, nsec)
				}
			}
		case unix.WGPEER_A_RX_BYTES:
			if len(v) >= 8 {
				p.RxBytes = int64(binary.NativeEndian.Uint64(v))
			}
		case unix.WGPEER_A_TX_BYTES:
			if len(v) >= 8 {
				p.TxBytes = int64(binary.NativeEndian.Uint64(v))
			}
		case unix.WGPEER_A_ALLOWEDIPS:
			ips = v
		}
		return true
	})
	if !ok || len(key) != 32 {
		return false
	}
	copy(p.PublicKey[:], key)
	if have, seen := peers[p.PublicKey]; seen {
		p = have
	} else if n := countAttrs(ips); n > 0 {
		if len(*slab) < n {
			*slab = make([]netip.Prefix, max(n, slabPrefixes))
		}
		p.AllowedIPs, *slab = (*slab)[:0:n], (*slab)[n:]
	}
	if ips != nil && !attrs(ips, func(_ uint16, ip []byte) bool {
		pfx, ok := parseAllowedIP(ip)
		if ok {
			p.AllowedIPs = append(p.AllowedIPs, pfx)
		}
		return ok
	}) {
		return false
	}
	p.AllowedIPs = slices.Clip(p.AllowedIPs)
	peers[p.PublicKey] = p
	return true
}

// countAttrs is how many attributes b holds (at most; a malformed one
// ends the count).
func countAttrs(b []byte) int {
	n := 0
	attrs(b, func(uint16, []byte) bool { n++; return true })
	return n
}

// parseAllowedIP parses one WGALLOWEDIP nest.
func parseAllowedIP(b []byte) (netip.Prefix, bool) {
	var addr netip.Addr
	bits := -1
	ok := attrs(b, func(typ uint16, v []byte) bool {
		switch typ {
		case unix.WGALLOWEDIP_A_IPADDR:
			a, ok := netip.AddrFromSlice(v)
			addr = a.Unmap()
			return ok
		case unix.WGALLOWEDIP_A_CIDR_MASK:
			if len(v) >= 1 {
				bits = int(v[0])
			}
		}
		return true
	})
	if !ok || !addr.IsValid() || bits < 0 {
		return netip.Prefix{}, false
	}
	pfx, err := addr.Prefix(bits)
	return pfx, err == nil
}

// parseSockaddr reads a sockaddr_in or sockaddr_in6 (the port in network
// order); anything else is no endpoint.
func parseSockaddr(v []byte) netip.AddrPort {
	if len(v) < 4 {
		return netip.AddrPort{}
	}
	port := binary.BigEndian.Uint16(v[2:])
	switch binary.NativeEndian.Uint16(v) {
	case unix.AF_INET:
		if len(v) >= 8 {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(v[4:8])), port)
		}
	case unix.AF_INET6:
		if len(v) >= 24 {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(v[8:24])).Unmap(), port)
		}
	}
	return netip.AddrPort{}
}
