package piastub

import "net/netip"

// peerPool hands out one server's peer addresses (peer_ip) from the
// prefix of its server_vip. Never handed out: server_vip, the prefix's
// first and last address, any address ending in .0 or .255 (some stacks
// take those for a network or broadcast address), and what reserved
// says (the stub's resolvers). Addresses go in order after the last one
// handed out, wrapping round at the end of the prefix and skipping those
// in use, so an address freed comes back only once every other free one
// has been used.
type peerPool struct {
	prefix   netip.Prefix
	vip      netip.Addr
	reserved func(netip.Addr) bool
	last     netip.Addr
}

func newPeerPool(prefix netip.Prefix, vip netip.Addr, reserved func(netip.Addr) bool) *peerPool {
	return &peerPool{prefix: prefix.Masked(), vip: vip, reserved: reserved, last: vip}
}

// next is the next free address, where inUse says which are taken; false
// when none is left.
func (p *peerPool) next(inUse func(netip.Addr) bool) (netip.Addr, bool) {
	first := p.prefix.Addr()
	a := p.last
	for range 1 << (32 - p.prefix.Bits()) {
		if a = a.Next(); !a.IsValid() || !p.prefix.Contains(a) {
			a = first
		}
		if p.usable(a) && !inUse(a) {
			p.last = a
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (p *peerPool) usable(a netip.Addr) bool {
	b := a.As4()
	return a != p.vip && a != p.prefix.Addr() && p.prefix.Contains(a.Next()) &&
		b[3] != 0 && b[3] != 255 && !p.reserved(a)
}
