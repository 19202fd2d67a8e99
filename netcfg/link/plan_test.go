package link

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestMakePlan(t *testing.T) {
	trunk := ObservedLink{Index: 2, Name: "enp1s0", Kind: "device", MTU: 1500, Up: true}
	v50 := Link{Name: "enp1s0.50", Kind: VLAN, Parent: "enp1s0", VLANID: 50, MTU: 1500, Up: true, Addrs: []netip.Prefix{pfx("10.10.50.1/24")}}
	v50obs := ObservedLink{Index: 7, Name: "enp1s0.50", Kind: "vlan", Parent: "enp1s0", VLANID: 50, MTU: 1500, Up: true, Owned: true,
		Addrs: []ObservedAddr{{Prefix: pfx("10.10.50.1/24"), Owned: true}}}
	shim := Link{Name: "vlan50-shim", Kind: Macvlan, Parent: "enp1s0.50", Mode: "bridge", Up: true, Addrs: []netip.Prefix{pfx("10.10.50.3/32")}}
	with := func(l Link, f func(*Link)) Link { f(&l); return l }
	withObs := func(l ObservedLink, f func(*ObservedLink)) ObservedLink {
		l.Addrs = append([]ObservedAddr(nil), l.Addrs...)
		f(&l)
		return l
	}
	links := func(ls ...ObservedLink) map[string]ObservedLink {
		m := map[string]ObservedLink{}
		for _, l := range ls {
			m[l.Name] = l
		}
		return m
	}
	tests := []struct {
		name string
		d    []Link
		o    Observed
		want string
	}{
		{"cold start creates parents before children", []Link{shim, v50}, Observed{Links: links(trunk)},
			"+ link enp1s0.50 (vlan 50 on enp1s0, mtu 1500, up)\n+ link vlan50-shim (macvlan bridge on enp1s0.50, up)\n+ address 10.10.50.3/32 on vlan50-shim\n+ address 10.10.50.1/24 on enp1s0.50\n"},
		{"converged is empty", []Link{v50}, Observed{Links: links(trunk, v50obs)}, ""},
		{"mtu changes in place", []Link{with(v50, func(l *Link) { l.MTU = 1400 })}, Observed{Links: links(trunk, v50obs)},
			"~ link enp1s0.50 mtu 1500 -> 1400\n"},
		{"mtu above parent is refused", []Link{with(v50, func(l *Link) { l.MTU = 9000 })}, Observed{Links: links(trunk, v50obs)},
			"! link enp1s0.50: mtu 9000 is above parent enp1s0's mtu 1500\n"},
		{"vlan id change recreates", []Link{with(v50, func(l *Link) { l.VLANID = 51 })}, Observed{Links: links(trunk, v50obs)},
			"- link enp1s0.50 (vlan 50 on enp1s0): recreate: vlan id 50 -> 51\n+ link enp1s0.50 (vlan 51 on enp1s0, mtu 1500, up)\n+ address 10.10.50.1/24 on enp1s0.50\n"},
		{"removed from config is deleted", nil, Observed{Links: links(trunk, v50obs)},
			"- link enp1s0.50 (vlan 50 on enp1s0)\n"},
		{"unmarked link is a conflict", []Link{v50}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) { l.Owned = false }))},
			"! link enp1s0.50: exists and was not created by nodeagent; left untouched (set adopt: true to take it over)\n"},
		{"adopt marks a matching link", []Link{with(v50, func(l *Link) { l.Adopt = true })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) { l.Owned = false }))},
			"~ link enp1s0.50 adopt (mark as nodeagent's)\n"},
		// Never delete to adopt: the plan says what is taken as it is.
		{"adopt takes an IPv4 address as it is where the kernel cannot mark it", []Link{with(v50, func(l *Link) { l.Adopt = true })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) { l.Owned = false; l.Addrs[0].Owned = false }))},
			"~ link enp1s0.50 adopt (mark as nodeagent's; kept as they are, never deleted to be marked: 10.10.50.1/24 (the kernel marks an IPv4 address in place only from Linux 6.4))\n"},
		{"adopt refuses a link that differs", []Link{with(v50, func(l *Link) { l.Adopt = true; l.VLANID = 60 })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) { l.Owned = false }))},
			"! link enp1s0.50: exists but cannot be adopted: vlan id 50 -> 60\n"},
		// The kernel puts a macvlan on a macvlan on that one's parent.
		{"a macvlan on a macvlan reads back on the macvlan's parent", []Link{v50, shim, with(shim, func(l *Link) { l.Name, l.Parent, l.Addrs = "inner", "vlan50-shim", nil })},
			Observed{Links: links(trunk, v50obs,
				ObservedLink{Index: 8, Name: "vlan50-shim", Kind: "macvlan", Parent: "enp1s0.50", Mode: "bridge", Up: true, Owned: true, Addrs: []ObservedAddr{{Prefix: pfx("10.10.50.3/32"), Owned: true}}},
				ObservedLink{Index: 9, Name: "inner", Kind: "macvlan", Parent: "enp1s0.50", Mode: "bridge", Up: true, Owned: true})}, ""},
		{"a macvlan on a macvlan that moved is made again", []Link{v50, with(shim, func(l *Link) { l.Name, l.Parent, l.Addrs = "inner", "vlan50-shim", nil })},
			Observed{Links: links(trunk, v50obs,
				ObservedLink{Index: 8, Name: "vlan50-shim", Kind: "macvlan", Parent: "enp1s0.50", Mode: "bridge", Up: true},
				ObservedLink{Index: 9, Name: "inner", Kind: "macvlan", Parent: "enp1s0", Mode: "bridge", Up: true, Owned: true})},
			"- link inner (macvlan on enp1s0): recreate: parent enp1s0 -> enp1s0.50 (vlan50-shim's parent: a macvlan on a macvlan is on that one's parent)\n+ link inner (macvlan bridge on vlan50-shim, up)\n"},
		{"missing parent is pending", []Link{v50}, Observed{Links: links()},
			"! link enp1s0.50: pending: parent enp1s0 does not exist\n"},
		{"a shim on a pending VLAN is pending too", []Link{v50, shim}, Observed{Links: links()},
			"! link enp1s0.50: pending: parent enp1s0 does not exist\n! link vlan50-shim: pending: parent enp1s0 does not exist\n"},
		{"address swap; foreign address kept", []Link{with(v50, func(l *Link) { l.Addrs = []netip.Prefix{pfx("10.10.50.2/24")} })},
			Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
				l.Addrs = append(l.Addrs, ObservedAddr{Prefix: pfx("192.0.2.9/32")})
			}))},
			"- address 10.10.50.1/24 on enp1s0.50\n+ address 10.10.50.2/24 on enp1s0.50\n"},
		// NetworkManager's reapply: the prefix back without the mark, with
		// noprefixroute.
		{"an address in NetworkManager's form is re-owned", []Link{v50}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Addrs[0] = ObservedAddr{Prefix: pfx("10.10.50.1/24"), Form: []string{"noprefixroute"}, Flags: 0x280}
		}))},
			"~ re-own address 10.10.50.1/24 on enp1s0.50 (noprefixroute, not ours)\n"},
		{"an address of ours that expires is re-owned", []Link{v50}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Addrs[0].Form = []string{"valid_lft 300sec"}
		}))},
			"~ re-own address 10.10.50.1/24 on enp1s0.50 (valid_lft 300sec)\n"},
		{"a plain address without the mark is marked where the kernel does it in place", []Link{v50}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Addrs[0] = ObservedAddr{Prefix: pfx("10.10.50.1/24"), Markable: true}
		}))},
			"~ re-own address 10.10.50.1/24 on enp1s0.50 (not ours)\n"},
		{"a plain address without the mark is left where the kernel cannot mark it in place", []Link{v50}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Addrs[0] = ObservedAddr{Prefix: pfx("10.10.50.1/24")}
		}))}, ""},
		{"a plain address left so is not deleted with the config", []Link{with(v50, func(l *Link) { l.Addrs = nil })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Addrs[0] = ObservedAddr{Prefix: pfx("10.10.50.1/24")}
		}))}, ""},
		{"adopt marks a plain address in place", []Link{with(v50, func(l *Link) { l.Adopt = true })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Owned = false
			l.Addrs[0] = ObservedAddr{Prefix: pfx("10.10.50.1/24"), Markable: true}
		}))},
			"~ link enp1s0.50 adopt (mark as nodeagent's)\n~ adopt address 10.10.50.1/24 on enp1s0.50 (mark as nodeagent's)\n"},
		{"adopt never deletes an IPv4 address in another form", []Link{with(v50, func(l *Link) { l.Adopt = true })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Owned = false
			l.Addrs[0] = ObservedAddr{Prefix: pfx("10.10.50.1/24"), Form: []string{"noprefixroute"}, Markable: true}
		}))},
			"~ link enp1s0.50 adopt (mark as nodeagent's; kept as they are, never deleted to be marked: 10.10.50.1/24 (noprefixroute: the kernel cannot change an IPv4 address's flags in place))\n"},
		{"an adopted link's IPv4 address in another form stays so", []Link{with(v50, func(l *Link) { l.Adopt = true })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Addrs[0] = ObservedAddr{Prefix: pfx("10.10.50.1/24"), Form: []string{"noprefixroute"}, Markable: true}
		}))}, ""},
		{"adopt marks an IPv6 address in another form in place", []Link{with(v50, func(l *Link) { l.Adopt = true; l.Addrs = []netip.Prefix{pfx("fd00:50::1/64")} })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Owned = false
			l.Addrs[0] = ObservedAddr{Prefix: pfx("fd00:50::1/64"), Form: []string{"noprefixroute", "nodad"}, Markable: true}
		}))},
			"~ link enp1s0.50 adopt (mark as nodeagent's)\n~ adopt address fd00:50::1/64 on enp1s0.50 (mark as nodeagent's in place, was noprefixroute, nodad, not ours)\n"},
		{"adopt keeps an IPv6 address with a metric", []Link{with(v50, func(l *Link) { l.Adopt = true; l.Addrs = []netip.Prefix{pfx("fd00:50::1/64")} })}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) {
			l.Owned = false
			l.Addrs[0] = ObservedAddr{Prefix: pfx("fd00:50::1/64"), Form: []string{"metric 100"}, Markable: true}
		}))},
			"~ link enp1s0.50 adopt (mark as nodeagent's; kept as they are, never deleted to be marked: fd00:50::1/64 (a metric, which the kernel keeps through a replace))\n"},
		{"down", []Link{with(v50, func(l *Link) { l.Up = false })}, Observed{Links: links(trunk, v50obs)},
			"~ link enp1s0.50 up -> down\n"},
		{"interrupted create is marked", []Link{v50}, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) { l.Interrupted = true }))},
			"~ link enp1s0.50 mark (its creation was interrupted)\n"},
		{"interrupted create no longer wanted is deleted", nil, Observed{Links: links(trunk, withObs(v50obs, func(l *ObservedLink) { l.Interrupted = true }))},
			"- link enp1s0.50 (vlan 50 on enp1s0)\n"},
		{"foreign links of other kinds untouched", nil, Observed{Links: links(trunk, ObservedLink{Name: "wg0", Kind: "wireguard", Owned: true})}, ""},
		{"mtu lowered on children first, raised on parents first",
			[]Link{with(v50, func(l *Link) { l.MTU = 9000 }), with(shim, func(l *Link) { l.MTU = 9000 }),
				{Name: "enp1s0.60", Kind: VLAN, Parent: "enp1s0", VLANID: 60, MTU: 1400, Up: true},
				{Name: "shim60", Kind: Macvlan, Parent: "enp1s0.60", Mode: "bridge", MTU: 1400, Up: true}},
			Observed{Links: links(withObs(trunk, func(l *ObservedLink) { l.MTU = 9000 }), v50obs,
				ObservedLink{Index: 8, Name: "vlan50-shim", Kind: "macvlan", Parent: "enp1s0.50", Mode: "bridge", MTU: 1500, Up: true, Owned: true,
					Addrs: []ObservedAddr{{Prefix: pfx("10.10.50.3/32"), Owned: true}}},
				ObservedLink{Index: 9, Name: "enp1s0.60", Kind: "vlan", Parent: "enp1s0", VLANID: 60, MTU: 1500, Up: true, Owned: true},
				ObservedLink{Index: 10, Name: "shim60", Kind: "macvlan", Parent: "enp1s0.60", Mode: "bridge", MTU: 1500, Up: true, Owned: true})},
			"~ link shim60 mtu 1500 -> 1400\n~ link enp1s0.60 mtu 1500 -> 1400\n~ link enp1s0.50 mtu 1500 -> 9000\n~ link vlan50-shim mtu 1500 -> 9000\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := MakePlan(Desired{Links: tt.d}, tt.o).String()
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// A re-own is a write of an address: what the drift metrics count as a
// repair of kind "address".
func TestReownIsAnAddressWrite(t *testing.T) {
	o := Op{Kind: OpReownAddr, Link: "shim0", Addr: pfx("10.10.50.3/24"), Reason: "noprefixroute, not ours"}
	e := o.Entry()
	if e.Kind != plan.KindAddress || !e.Writes() || e.Object != "address 10.10.50.3/24 on shim0" || e.Text != "~ re-own address 10.10.50.3/24 on shim0 (noprefixroute, not ours)" {
		t.Errorf("entry %+v", e)
	}
}
