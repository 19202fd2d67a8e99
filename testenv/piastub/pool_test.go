package piastub

import (
	"net/netip"
	"strings"
	"testing"
)

// The pool, unit by unit: in order, wrapping at the end of the prefix,
// skipping what is in use and what is reserved, a freed address back
// once the others are used, and none when all are taken.
func TestPeerPoolWrapsAndReuses(t *testing.T) {
	vip := netip.MustParseAddr("10.99.0.1")
	resolver := netip.MustParseAddr("10.99.0.5")
	p := newPeerPool(netip.PrefixFrom(vip, 28), vip, func(a netip.Addr) bool { return a == resolver })
	used := map[netip.Addr]bool{}
	take := func() netip.Addr {
		t.Helper()
		a, ok := p.next(func(a netip.Addr) bool { return used[a] })
		if !ok {
			t.Fatalf("no address with %d in use", len(used))
		}
		used[a] = true
		return a
	}
	// 10.99.0.0/28: .0 is the network, .1 server_vip, .5 a resolver, .15
	// the broadcast: 12 for peers.
	var got []string
	for range 12 {
		got = append(got, take().String())
	}
	want := "10.99.0.2 10.99.0.3 10.99.0.4 10.99.0.6 10.99.0.7 10.99.0.8 10.99.0.9 10.99.0.10 10.99.0.11 10.99.0.12 10.99.0.13 10.99.0.14"
	if strings.Join(got, " ") != want {
		t.Errorf("handed out %s\nwant        %s", strings.Join(got, " "), want)
	}
	if a, ok := p.next(func(a netip.Addr) bool { return used[a] }); ok {
		t.Errorf("a full pool handed out %s", a)
	}
	delete(used, netip.MustParseAddr("10.99.0.7"))
	delete(used, netip.MustParseAddr("10.99.0.3"))
	if a := take(); a.String() != "10.99.0.3" {
		t.Errorf("after wrapping: %s, want the first freed, 10.99.0.3", a)
	}
	if a := take(); a.String() != "10.99.0.7" {
		t.Errorf("then %s, want 10.99.0.7", a)
	}
	// In a /16 the .0 and .255 of every /24 are skipped too.
	big := newPeerPool(netip.MustParsePrefix("10.98.0.0/16"), netip.MustParseAddr("10.98.0.1"), func(netip.Addr) bool { return false })
	for i := range 600 {
		a, ok := big.next(func(netip.Addr) bool { return false })
		b := a.As4()
		if !ok || b[3] == 0 || b[3] == 255 || b[3] == 1 && b[2] == 0 {
			t.Fatalf("address %d: %s", i+1, a)
		}
	}
}
