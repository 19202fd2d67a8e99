package wg

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// fakeResolver answers from a table and counts look-ups.
type fakeResolver struct {
	addrs   map[string][]netip.Addr
	lookups int
}

func (f *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	f.lookups++
	if a, ok := f.addrs[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestResolveCache: a name is looked up again after ResolveEvery, a failed
// one after RetryResolve, a stale peer forces a fresh look-up (at most
// every RetryResolve), IPv4 is preferred, and addresses skip DNS.
func TestResolveCache(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f := &fakeResolver{addrs: map[string][]netip.Addr{"vpn.example": {netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("198.51.100.1")}}}
	h := &Handle{Resolver: f, Now: func() time.Time { return now }}
	ctx := context.Background()
	step := func(name string, d time.Duration, endpoint string, fresh bool, want string, lookups int) {
		t.Helper()
		now = now.Add(d)
		r := h.resolve(ctx, endpoint, fresh)
		got := r.Err
		if r.Addr.IsValid() {
			got = r.Addr.String()
		}
		if got != want || f.lookups != lookups {
			t.Errorf("%s: got %q after %d look-ups, want %q after %d", name, got, f.lookups, want, lookups)
		}
	}
	step("first look-up prefers IPv4", 0, "vpn.example:51820", false, "198.51.100.1:51820", 1)
	step("cached", time.Minute, "vpn.example:51820", false, "198.51.100.1:51820", 1)
	step("other port, same name: cached", 0, "vpn.example:4500", false, "198.51.100.1:4500", 1)
	f.addrs["vpn.example"] = []netip.Addr{netip.MustParseAddr("198.51.100.2")}
	step("stale peer forces a fresh look-up", 0, "vpn.example:51820", true, "198.51.100.2:51820", 2)
	step("but not again within RetryResolve", 10*time.Second, "vpn.example:51820", true, "198.51.100.2:51820", 2)
	step("expired after ResolveEvery", ResolveEvery, "vpn.example:51820", false, "198.51.100.2:51820", 3)
	step("unknown name", 0, "nosuch.example:51820", false, "no such host", 4)
	step("failure cached briefly", time.Second, "nosuch.example:51820", false, "no such host", 4)
	step("failure retried after RetryResolve", RetryResolve, "nosuch.example:51820", false, "no such host", 5)
	step("an address needs no DNS", 0, "[2001:db8::7]:51820", false, "[2001:db8::7]:51820", 5)
	f.addrs = nil
	if r := (&Handle{Resolver: errResolver{}}).resolve(ctx, "x.example:1", false); r.Err == "" {
		t.Error("a resolver error is not reported")
	}
}

type errResolver struct{}

func (errResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("dns server unreachable")
}
