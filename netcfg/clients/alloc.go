package clients

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Device is what choosing a client's address needs to know of a device.
type Device struct {
	Name string
	// Addrs are the device's own addresses with their prefix lengths
	// (10.90.0.1/24): a client's address comes from their subnets.
	Addrs []netip.Prefix
	// Pools are the egress pools (clients.egress): addresses only
	// clients added --via their device get.
	Pools []Pool
}

// Pool is an egress pool.
type Pool struct {
	Prefix netip.Prefix
	Via    string
}

// ErrFull is the error of an allocation that found no free address.
var ErrFull = errors.New("no free address")

// maxScan bounds the addresses looked at in one subnet: an IPv6 /64 is
// never walked whole (the lowest free address is found long before).
const maxScan = 1 << 20

// Allocate chooses a new client's addresses: want, when given (--ip),
// each checked; else the lowest free address of the device's first IPv4
// subnet and, where the device has an IPv6 subnet, the IPv6 address with
// the same host number (or the lowest free one). A client --via a device
// gets its IPv4 address from that device's pool and no IPv6 address
// (a PIA tunnel carries IPv4 only); other clients never get one in a
// pool. used are the prefixes the device's peers hold (in the register,
// disabled and expired ones included, and in the config). It returns
// /32 and /128 prefixes.
func Allocate(dev Device, used []netip.Prefix, via string, want []netip.Addr) ([]netip.Prefix, error) {
	var pool netip.Prefix
	if via != "" {
		i := slices.IndexFunc(dev.Pools, func(p Pool) bool { return p.Via == via })
		if i < 0 {
			var vias []string
			for _, p := range dev.Pools {
				vias = append(vias, p.Via)
			}
			if len(vias) == 0 {
				return nil, fmt.Errorf("%s has no clients.egress pool, so no client of it leaves by %s (see clients.egress in nodeagent.yaml(5))", dev.Name, via)
			}
			return nil, fmt.Errorf("%s has no clients.egress pool via %s (its pools leave by %s)", dev.Name, via, strings.Join(vias, ", "))
		}
		pool = dev.Pools[i].Prefix
	}
	taken := newTaken(dev, used)
	if len(want) > 0 {
		return checkWanted(dev, taken, pool, want)
	}
	var out []netip.Prefix
	var host uint64
	found4 := false
	for _, s := range dev.Addrs {
		s = s.Masked()
		if !s.Addr().Is4() {
			continue
		}
		scope := s
		if pool.IsValid() {
			if !(s.Bits() <= pool.Bits() && s.Contains(pool.Addr())) {
				continue
			}
			scope = pool
		}
		a, n, err := lowestFree(s, scope, taken, dev.Pools, pool.IsValid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w in %s (%d in use)", dev.Name, err, scope, n)
		}
		out = append(out, netip.PrefixFrom(a, 32))
		host = hostNumber(s, a)
		found4 = true
		break
	}
	if pool.IsValid() {
		if !found4 {
			return nil, fmt.Errorf("%s: the pool %s is in none of the device's subnets", dev.Name, pool)
		}
		return out, nil
	}
	for _, s := range dev.Addrs {
		s = s.Masked()
		if !s.Addr().Is6() {
			continue
		}
		if found4 {
			if a, ok := withHost(s, host); ok && !taken.has(a) {
				out = append(out, netip.PrefixFrom(a, 128))
				break
			}
		}
		a, n, err := lowestFree(s, s, taken, nil, false)
		if err != nil {
			if !found4 {
				return nil, fmt.Errorf("%s: %w in %s (%d in use)", dev.Name, err, s, n)
			}
			break // the IPv4 address alone, then
		}
		out = append(out, netip.PrefixFrom(a, 128))
		break
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no addresses, so a client's address cannot be chosen (give wireguard[].addresses, like 10.90.0.1/24)", dev.Name)
	}
	return out, nil
}

// checkWanted checks addresses given with --ip.
func checkWanted(dev Device, taken *taken, pool netip.Prefix, want []netip.Addr) ([]netip.Prefix, error) {
	var out []netip.Prefix
	fams := map[bool]bool{}
	for _, a := range want {
		a = a.Unmap()
		if fams[a.Is4()] {
			return nil, fmt.Errorf("--ip %s: one address per family", a)
		}
		fams[a.Is4()] = true
		i := slices.IndexFunc(dev.Addrs, func(p netip.Prefix) bool { return p.Masked().Contains(a) })
		if i < 0 {
			return nil, fmt.Errorf("--ip %s is in none of %s's subnets (%s)", a, dev.Name, prefixTexts(dev.Addrs))
		}
		s := dev.Addrs[i].Masked()
		switch {
		case a == s.Addr() || (a.Is4() && s.Bits() < 31 && a == lastAddr(s)):
			return nil, fmt.Errorf("--ip %s is %s's network or broadcast address", a, s)
		case taken.has(a):
			return nil, fmt.Errorf("--ip %s is in use (%s)", a, taken.owner(a))
		case pool.IsValid() && a.Is4() && !pool.Contains(a):
			return nil, fmt.Errorf("--ip %s is outside the pool %s of clients leaving by that device", a, pool)
		case pool.IsValid() && a.Is6():
			return nil, fmt.Errorf("--ip %s: a client leaving by a PIA tunnel has no IPv6 address", a)
		case !pool.IsValid() && inPools(dev.Pools, a):
			return nil, fmt.Errorf("--ip %s is in an egress pool; add the client with --full-tunnel --via that pool's device", a)
		}
		bits := 32
		if a.Is6() {
			bits = 128
		}
		out = append(out, netip.PrefixFrom(a, bits))
	}
	return out, nil
}

// taken is the addresses in use: single addresses in a set, wider
// prefixes in a list.
type taken struct {
	addrs map[netip.Addr]string
	wide  []netip.Prefix
}

func newTaken(dev Device, used []netip.Prefix) *taken {
	t := &taken{addrs: map[netip.Addr]string{}}
	for _, p := range dev.Addrs {
		t.addrs[p.Addr().Unmap()] = dev.Name + "'s own address"
	}
	for _, p := range used {
		if p.IsSingleIP() {
			t.addrs[p.Addr().Unmap()] = "another peer"
		} else {
			t.wide = append(t.wide, p.Masked())
		}
	}
	return t
}

func (t *taken) has(a netip.Addr) bool {
	if _, ok := t.addrs[a]; ok {
		return true
	}
	return slices.ContainsFunc(t.wide, func(p netip.Prefix) bool { return p.Contains(a) })
}

func (t *taken) owner(a netip.Addr) string {
	if s, ok := t.addrs[a]; ok {
		return s
	}
	return "another peer's prefix"
}

func inPools(pools []Pool, a netip.Addr) bool {
	return slices.ContainsFunc(pools, func(p Pool) bool { return p.Prefix.Contains(a) })
}

// lowestFree is the lowest address of scope (within subnet s) that is
// not taken, not s's network or broadcast address, and (outside a pool)
// in no pool; n is how many it passed over.
func lowestFree(s, scope netip.Prefix, t *taken, pools []Pool, inPool bool) (netip.Addr, int, error) {
	last := lastAddr(scope)
	n := 0
	for a, i := scope.Addr(), 0; i < maxScan; a, i = a.Next(), i+1 {
		if !a.IsValid() || !scope.Contains(a) {
			break
		}
		skip := a == s.Addr() || (a.Is4() && s.Bits() < 31 && a == lastAddr(s)) || t.has(a) || (!inPool && inPools(pools, a))
		if !skip {
			return a, n, nil
		}
		if t.has(a) {
			n++
		}
		if a == last {
			break
		}
	}
	return netip.Addr{}, n, ErrFull
}

// lastAddr is p's last address.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// hostNumber is a's offset in s (the low 64 bits of it).
func hostNumber(s netip.Prefix, a netip.Addr) uint64 {
	x, y := a.AsSlice(), s.Masked().Addr().AsSlice()
	var n uint64
	for i := range x {
		n = n<<8 | uint64(x[i]-y[i])
	}
	return n
}

// withHost is the address of s whose host number is n, if s holds it.
func withHost(s netip.Prefix, n uint64) (netip.Addr, bool) {
	b := s.Masked().Addr().AsSlice()
	for i := len(b) - 1; i >= 0 && n > 0; i-- {
		sum := uint64(b[i]) + n&0xff
		b[i] = byte(sum)
		n = n>>8 + sum>>8
	}
	a, _ := netip.AddrFromSlice(b)
	return a, n == 0 && s.Contains(a) && a != s.Masked().Addr()
}

func prefixTexts(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Masked().String())
	}
	return strings.Join(out, ", ")
}
