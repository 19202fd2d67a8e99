package link

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
)

// Observe reads the links and addresses that matter to d: every link
// nodeagent owns (marked, or born with host.CreatingGroup and not yet
// marked) and every link d names as a link or a parent. It reads them from
// the sync's snapshot s (one link dump and one address dump, shared with
// the subsystems that need them too). It remembers the IPv4 addresses it
// finds to be nodeagent's, for the check of a re-add (claims.go).
func Observe(ctx context.Context, s *host.Snapshot, d Desired) (Observed, error) {
	links, err := s.Links()
	if err != nil {
		return Observed{}, err
	}
	named := map[string]bool{}
	for _, l := range d.Links {
		named[l.Name] = true
		named[l.Parent] = true
	}
	byIndex := make(map[int]string, len(links))
	for _, l := range links {
		byIndex[l.Index] = l.Name
	}
	o := Observed{Links: map[string]ObservedLink{}, MACs: map[int]net.HardwareAddr{}}
	keep := map[int]string{}
	h := s.Host()
	h.LinksDumped(links)
	ours := map[int]host.Link{}
	for _, l := range links {
		o.MaxIndex = max(o.MaxIndex, l.Index)
		// Born with the in-flight group and not marked yet, or seen as
		// nodeagent's and its alias changed since by another program:
		// nodeagent's, to be marked again.
		owned, interrupted, remark := h.Owned(l)
		if owned {
			ours[l.Index] = l
		}
		if !owned && !named[l.Name] {
			continue
		}
		o.MACs[l.Index] = l.HardwareAddr
		o.Links[l.Name] = ObservedLink{
			Index: l.Index, Name: l.Name, Kind: l.Kind, Parent: byIndex[l.ParentIndex],
			VLANID: l.VLANID, Mode: modeName(l), MTU: l.MTU, Up: l.Up,
			Owned: owned, Interrupted: interrupted, Remark: remark, AltNames: l.AltNames,
		}
		keep[l.Index] = l.Name
	}
	h.Seen(ours)
	if len(keep) == 0 {
		return o, nil
	}
	addrs, err := s.Addrs()
	if err != nil {
		return Observed{}, err
	}
	// Each address seen as nodeagent's is remembered, so that a re-add of
	// it soon after takes the quick check (claims.go).
	mem, now := claimsOf(h), time.Now()
	mem.mu.Lock()
	defer mem.mu.Unlock()
	for _, a := range addrs {
		name, ok := keep[a.LinkIndex]
		if !ok || a.Prefix.Addr().IsLinkLocalUnicast() {
			continue
		}
		ol := o.Links[name]
		// Before Linux 6.1 the kernel drops IFA_PROTO; then the global
		// addresses of a link nodeagent owns are taken to be its own.
		owned := a.Owned() || (!h.AddrProto && ol.Owned && a.Scope == 0)
		if owned && a.Prefix.Addr().Is4() {
			mem.sawOurs(name, a.Prefix.Addr(), now)
		}
		ol.Addrs = append(ol.Addrs, ObservedAddr{
			Prefix: a.Prefix, Owned: owned, Form: a.Form(), Flags: a.Flags,
			Markable: h.AddrMarkInPlace(a.Prefix),
		})
		o.Links[name] = ol
	}
	return o, nil
}

// modeName is the macvlan mode of l by name, "" for other kinds.
func modeName(l host.Link) string {
	if l.Kind != string(Macvlan) {
		return ""
	}
	for _, m := range []string{"private", "vepa", "bridge", "passthru", "source"} {
		if kernelMode(m) == l.MacvlanMode {
			return m
		}
	}
	return fmt.Sprintf("mode %d", l.MacvlanMode)
}

// kernelMode is the kernel's MACVLAN_MODE_* value for a mode name
// (linux/if_link.h; vishvananda's own enum numbers them differently).
func kernelMode(s string) uint32 {
	switch s {
	case "private":
		return 1
	case "vepa":
		return 2
	case "passthru":
		return 8
	case "source":
		return 16
	}
	return 4 // bridge
}

// v4 returns the IPv4 addresses among ps.
func v4(ps []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, p := range ps {
		if p.Addr().Is4() {
			out = append(out, p.Addr())
		}
	}
	return out
}
