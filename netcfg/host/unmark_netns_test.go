package host_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestUnmarkInPlace: LinkUnmark takes the alias off a link and nothing
// else; AddrUnmark takes nodeagent's IFA_PROTO off an address in place,
// keeping its flags (noprefixroute, nodad) and its lifetime, where the
// kernel takes a new IFA_PROTO on a replace (IPv6 from 6.1, IPv4 from
// 6.4); where it does not, it says so and leaves the address as it was.
// An address without the mark is unmarked already.
func TestUnmarkInPlace(t *testing.T) {
	ns := testenv.NewNetNS(t)
	ns.Exec(t, "ip", "link", "add", "old0", "type", "veth", "peer", "name", "old0p")
	ns.Exec(t, "ip", "link", "set", "old0", "alias", host.LinkAlias, "up")
	l, err := ns.NL.LinkByName("old0")
	if err != nil {
		t.Fatal(err)
	}
	index := l.Attrs().Index
	for _, p := range []string{"10.10.50.1/24", "10.10.51.1/24", "fd50::1/64"} {
		if err := ns.Host.AddrAdd(index, netip.MustParsePrefix(p)); err != nil {
			t.Fatal(err)
		}
	}
	// Forms another program gives them: noprefixroute, nodad with a
	// lifetime. (ip addr change keeps the protocol.)
	ns.Exec(t, "ip", "addr", "change", "10.10.51.1/24", "dev", "old0", "noprefixroute")
	ns.Exec(t, "ip", "-6", "addr", "change", "fd50::1/64", "dev", "old0", "nodad", "valid_lft", "3000", "preferred_lft", "2000")
	ns.Exec(t, "ip", "addr", "add", "10.10.52.1/24", "dev", "old0")
	before := form(t, ns)
	if err := ns.Host.LinkUnmark(index); err != nil {
		t.Fatal(err)
	}
	if l, _ := ns.NL.LinkByName("old0"); l.Attrs().Alias != "" || l.Attrs().Index != index {
		t.Errorf("after LinkUnmark: alias %q, index %d (was %d)", l.Attrs().Alias, l.Attrs().Index, index)
	}
	for _, s := range []string{"10.10.50.1/24", "10.10.51.1/24", "fd50::1/64", "10.10.52.1/24"} {
		p := netip.MustParsePrefix(s)
		done, err := ns.Host.AddrUnmark(index, p)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if want := ns.Host.AddrMarkInPlace(p) || s == "10.10.52.1/24"; done != want {
			t.Errorf("%s: unmarked %v, want %v (kernel marks in place: %v)", s, done, want, ns.Host.AddrMarkInPlace(p))
		}
	}
	after := form(t, ns)
	addrs, err := ns.Host.AddrList()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.LinkIndex == index && a.Owned() && ns.Host.AddrMarkInPlace(a.Prefix) {
			t.Errorf("%s keeps the mark", a.Prefix)
		}
	}
	if before != after {
		t.Errorf("unmarking changed the addresses' forms:\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// form is old0's addresses as ip prints them, without the protocol and
// the lifetimes' seconds (which tick).
func form(t *testing.T, ns *testenv.NetNS) string {
	var b strings.Builder
	for _, line := range strings.Split(ns.Exec(t, "ip", "addr", "show", "dev", "old0"), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "inet") {
			f := strings.Fields(line)
			var keep []string
			for i := 0; i < len(f); i++ {
				if f[i] == "proto" {
					i++
					continue
				}
				keep = append(keep, f[i])
			}
			b.WriteString(strings.Join(keep, " ") + "\n")
		}
		if strings.HasPrefix(line, "valid_lft") {
			b.WriteString(strings.Fields(line)[0] + " " + map[bool]string{true: "forever", false: "finite"}[strings.Contains(line, "valid_lft forever")] + "\n")
		}
	}
	return b.String()
}
