package nft

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

func gateway() Desired {
	pfx := netip.MustParsePrefix
	return Desired{
		Masquerade: []Masquerade{{pfx("10.10.50.0/24"), "wg-pia"}, {pfx("10.90.0.0/24"), "enp1s0"}},
		KillSwitch: []KillSwitch{{From: pfx("10.10.50.0/24"), AllowOut: []string{"wg-pia"}}, {From: pfx("fd00:50::/64"), AllowOut: []string{"wg-pia"}}},
		MSSClamp:   []string{"wg-pia"},
	}
}

// observed returns the tables d renders, as if the kernel held them,
// changed by edit.
func observed(d Desired, edit func(t *Table)) Observed {
	ts := d.Tables()
	for i := range ts {
		if edit != nil {
			edit(&ts[i])
		}
	}
	return Observed{Tables: ts}
}

func chainOf(t *Table, name string) *Chain {
	for i := range t.Chains {
		if t.Chains[i].Name == name {
			return &t.Chains[i]
		}
	}
	panic("no chain " + name)
}

func setOf(t *Table, name string) *Set {
	for i := range t.Sets {
		if t.Sets[i].Name == name {
			return &t.Sets[i]
		}
	}
	panic("no set " + name)
}

const gatewayColdPlan = `+ nft inet nodeagent table
+ nft inet nodeagent counter ks_drops
+ nft inet nodeagent set ks_wg-pia_out { type ifname; }
+ nft inet nodeagent set ks_wg-pia_out: element "wg-pia"
+ nft inet nodeagent set ks_wg-pia_v4 { type ipv4_addr; flags interval; }
+ nft inet nodeagent set ks_wg-pia_v4: element 10.10.50.0/24
+ nft inet nodeagent set ks_wg-pia_v6 { type ipv6_addr; flags interval; }
+ nft inet nodeagent set ks_wg-pia_v6: element fd00:50::/64
+ nft inet nodeagent set mss_if { type ifname; }
+ nft inet nodeagent set mss_if: element "wg-pia"
+ nft inet nodeagent set masq_enp1s0_v4 { type ipv4_addr; flags interval; }
+ nft inet nodeagent set masq_enp1s0_v4: element 10.90.0.0/24
+ nft inet nodeagent set masq_wg-pia_v4 { type ipv4_addr; flags interval; }
+ nft inet nodeagent set masq_wg-pia_v4: element 10.10.50.0/24
+ nft inet nodeagent chain forward { type filter hook forward priority -10; policy accept; }
+ nft inet nodeagent chain forward: ip saddr @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"
+ nft inet nodeagent chain forward: ip6 saddr @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"
+ nft inet nodeagent chain mssclamp { type filter hook forward priority -150; policy accept; }
+ nft inet nodeagent chain mssclamp: oifname @mss_if tcp flags syn tcp option maxseg size set rt mtu
+ nft inet nodeagent chain mssclamp: iifname @mss_if tcp flags syn tcp option maxseg size set rt mtu
+ nft inet nodeagent chain postrouting { type nat hook postrouting priority 100; policy accept; }
+ nft inet nodeagent chain postrouting: ip saddr @masq_enp1s0_v4 oifname "enp1s0" masquerade
+ nft inet nodeagent chain postrouting: ip saddr @masq_wg-pia_v4 oifname "wg-pia" masquerade
+ nft inet nodeagent chain output { type filter hook output priority -10; policy accept; }
+ nft inet nodeagent chain output: ct state related meta nfproto ipv4 meta l4proto icmp @th,160,32 @ks_wg-pia_v4 ip daddr != @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"
+ nft inet nodeagent chain output: ct state related meta nfproto ipv4 meta l4proto icmp @th,192,32 @ks_wg-pia_v4 ip daddr != @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"
+ nft inet nodeagent chain output: ct state related meta nfproto ipv6 meta l4proto ipv6-icmp @th,128,128 @ks_wg-pia_v6 ip6 daddr != @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"
+ nft inet nodeagent chain output: ct state related meta nfproto ipv6 meta l4proto ipv6-icmp @th,256,128 @ks_wg-pia_v6 ip6 daddr != @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"
`

func TestMakePlan(t *testing.T) {
	pfx := netip.MustParsePrefix
	d := gateway()
	withSNAT := gateway()
	withSNAT.SNAT = []SNAT{{pfx("10.91.0.0/24"), "enp1s0", netip.MustParseAddr("192.168.2.10")},
		{pfx("fd00:91::/64"), "enp1s0", netip.MustParseAddr("2001:db8::10")}}
	withSNAT.Forward = []Forward{{"wg0", "enp1s0"}, {"wg0", "enp1s0"}}
	tests := []struct {
		name string
		d    Desired
		o    Observed
		want string
	}{
		{"cold start", d, Observed{}, gatewayColdPlan},
		{"converged", d, observed(d, nil), ""},
		{"kill-switch rule deleted by hand", d, observed(d, func(t *Table) {
			c := chainOf(t, "forward")
			c.Rules = c.Rules[1:]
		}), `+ nft inet nodeagent chain forward: ip saddr @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n"},
		{"kill-switch counter deleted by hand", d, observed(d, func(t *Table) {
			c := chainOf(t, "forward")
			c.Rules, t.Objects = nil, nil
		}), "+ nft inet nodeagent counter ks_drops\n" +
			`+ nft inet nodeagent chain forward: ip saddr @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
			`+ nft inet nodeagent chain forward: ip6 saddr @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n"},
		{"counters are no difference", d, observed(d, func(t *Table) { t.Objects[0].Counter = Counter{Packets: 7, Bytes: 700} }), ""},
		{"object added by hand", d, observed(d, func(t *Table) {
			t.Objects = append(t.Objects, Object{Type: nftables.ObjTypeQuota, Name: "q"}, Object{Type: nftables.ObjTypeCounter, Name: "x"})
		}), "- nft inet nodeagent quota q\n- nft inet nodeagent counter x\n"},
		{"kill-switch rules counting on their own are replaced", d, observed(d, func(t *Table) {
			t.Objects = nil
			for i, r := range chainOf(t, "forward").Rules {
				r.Exprs = slices.Clone(r.Exprs)
				r.Exprs[len(r.Exprs)-2] = &expr.Counter{Packets: 5}
				chainOf(t, "forward").Rules[i] = r
			}
		}), "+ nft inet nodeagent counter ks_drops\n" +
			`- nft inet nodeagent chain forward: ip saddr @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter drop comment "nodeagent kill switch"` + "\n" +
			`- nft inet nodeagent chain forward: ip6 saddr @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter drop comment "nodeagent kill switch"` + "\n" +
			`+ nft inet nodeagent chain forward: ip saddr @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
			`+ nft inet nodeagent chain forward: ip6 saddr @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n"},
		{"set flushed by hand", d, observed(d, func(t *Table) { setOf(t, "ks_wg-pia_v6").Elements = nil }),
			"+ nft inet nodeagent set ks_wg-pia_v6: element fd00:50::/64\n"},
		{"element added by hand", d, observed(d, func(t *Table) {
			s := setOf(t, "ks_wg-pia_out")
			s.Elements = append(s.Elements, nftables.SetElement{Key: ifname("eth0")})
		}), "- nft inet nodeagent set ks_wg-pia_out: element \"eth0\"\n"},
		{"chain deleted by hand", d, observed(d, func(t *Table) {
			t.Chains = slices.DeleteFunc(t.Chains, func(c Chain) bool { return c.Name == "postrouting" })
		}),
			"+ nft inet nodeagent chain postrouting { type nat hook postrouting priority 100; policy accept; }\n" +
				"+ nft inet nodeagent chain postrouting: ip saddr @masq_enp1s0_v4 oifname \"enp1s0\" masquerade\n" +
				"+ nft inet nodeagent chain postrouting: ip saddr @masq_wg-pia_v4 oifname \"wg-pia\" masquerade\n"},
		{"chain priority and policy changed by hand", d, observed(d, func(t *Table) {
			c := chainOf(t, "forward")
			drop := nftables.ChainPolicyDrop
			c.Priority, c.Policy = nftables.ChainPriorityRef(10), &drop
		}), "- nft inet nodeagent chain forward { type filter hook forward priority 10; policy drop; }\n" +
			"+ nft inet nodeagent chain forward { type filter hook forward priority -10; policy accept; }\n"},
		{"rules reordered", d, observed(d, func(t *Table) {
			c := chainOf(t, "forward")
			c.Rules = []Rule{c.Rules[1], c.Rules[0]}
		}), `- nft inet nodeagent chain forward: ip6 saddr @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
			`+ nft inet nodeagent chain forward: ip6 saddr @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n"},
		{"table made dormant", d, observed(d, func(t *Table) { t.Flags = 1 }),
			"- nft inet nodeagent table flags dormant\n+ nft inet nodeagent table\n"},
		{"foreign rule in our chain", d, observed(d, func(t *Table) {
			c := chainOf(t, "forward")
			c.Rules = append([]Rule{{Exprs: []any{Unknown{Name: "xt", Data: []byte{1, 2}}}}}, c.Rules...)
		}), "- nft inet nodeagent chain forward: [xt 0x0102]\n"},
		{"config change: one more source", func() Desired {
			d := gateway()
			d.KillSwitch = append(d.KillSwitch, KillSwitch{From: pfx("10.10.51.0/24"), AllowOut: []string{"wg-pia"}})
			return d
		}(), observed(d, nil),
			"- nft inet nodeagent set ks_wg-pia_v4: element 10.10.50.0/24\n+ nft inet nodeagent set ks_wg-pia_v4: element 10.10.50.0/23\n"},
		{"snat and forward", withSNAT, observed(d, nil),
			"+ nft inet nodeagent set snat_enp1s0_192.168.2.10 { type ipv4_addr; flags interval; }\n" +
				"+ nft inet nodeagent set snat_enp1s0_192.168.2.10: element 10.91.0.0/24\n" +
				"+ nft inet nodeagent set snat_enp1s0_2001-db8--10 { type ipv6_addr; flags interval; }\n" +
				"+ nft inet nodeagent set snat_enp1s0_2001-db8--10: element fd00:91::/64\n" +
				"+ nft inet nodeagent chain forward: ct state established,related accept\n" +
				"+ nft inet nodeagent chain forward: iifname \"wg0\" oifname \"enp1s0\" accept\n" +
				"+ nft inet nodeagent chain postrouting: ip saddr @snat_enp1s0_192.168.2.10 oifname \"enp1s0\" snat ip to 192.168.2.10\n" +
				"+ nft inet nodeagent chain postrouting: ip6 saddr @snat_enp1s0_2001-db8--10 oifname \"enp1s0\" snat ip6 to 2001:db8::10\n"},
		{"stray nodeagent table of another family", d, func() Observed {
			o := observed(d, nil)
			o.Tables = append(o.Tables, Table{Family: nftables.TableFamilyIPv4, Name: "nodeagent-old"})
			return o
		}(), "- nft ip nodeagent-old table\n"},
		{"table owned by another process", d, observed(d, func(t *Table) { t.Flags = nftTableFOwner }),
			"! nft inet nodeagent table flags owner: owned by another process's netlink socket (NFT_TABLE_F_OWNER); left untouched\n"},
		{"kill switch dropped from the config", func() Desired {
			d := gateway()
			d.KillSwitch = nil
			return d
		}(), observed(d, nil),
			"- nft inet nodeagent counter ks_drops\n" +
				"- nft inet nodeagent set ks_wg-pia_out { type ifname; }\n" +
				"- nft inet nodeagent set ks_wg-pia_v4 { type ipv4_addr; flags interval; }\n" +
				"- nft inet nodeagent set ks_wg-pia_v6 { type ipv6_addr; flags interval; }\n" +
				"- nft inet nodeagent chain forward { type filter hook forward priority -10; policy accept; }\n" +
				`- nft inet nodeagent chain forward: ip saddr @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
				`- nft inet nodeagent chain forward: ip6 saddr @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
				"- nft inet nodeagent chain output { type filter hook output priority -10; policy accept; }\n" +
				`- nft inet nodeagent chain output: ct state related meta nfproto ipv4 meta l4proto icmp @th,160,32 @ks_wg-pia_v4 ip daddr != @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
				`- nft inet nodeagent chain output: ct state related meta nfproto ipv4 meta l4proto icmp @th,192,32 @ks_wg-pia_v4 ip daddr != @ks_wg-pia_v4 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
				`- nft inet nodeagent chain output: ct state related meta nfproto ipv6 meta l4proto ipv6-icmp @th,128,128 @ks_wg-pia_v6 ip6 daddr != @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n" +
				`- nft inet nodeagent chain output: ct state related meta nfproto ipv6 meta l4proto ipv6-icmp @th,256,128 @ks_wg-pia_v6 ip6 daddr != @ks_wg-pia_v6 oifname != @ks_wg-pia_out counter name "ks_drops" drop comment "nodeagent kill switch"` + "\n"},
		{"teardown", Desired{}, observed(d, nil), "- nft inet nodeagent table\n"},
		{"nothing wanted, nothing there", Desired{}, Observed{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, MakePlan(tt.d, tt.o).String()); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSetElements(t *testing.T) {
	pfx := netip.MustParsePrefix
	tests := []struct {
		name string
		in   []netip.Prefix
		want []string
	}{
		{"adjacent and covered prefixes merge", []netip.Prefix{pfx("10.0.1.0/24"), pfx("10.0.0.0/24"), pfx("10.0.0.128/25")}, []string{"10.0.0.0/23"}},
		{"a range that is no prefix", []netip.Prefix{pfx("10.0.0.0/24"), pfx("10.0.1.0/25")}, []string{"10.0.0.0-10.0.1.127"}},
		{"everything", []netip.Prefix{pfx("0.0.0.0/0"), pfx("10.0.0.0/8")}, []string{"0.0.0.0/0"}},
		{"top of the space", []netip.Prefix{pfx("255.255.255.0/24")}, []string{"255.255.255.0/24"}},
		{"ipv6", []netip.Prefix{pfx("fd00:50::/64"), pfx("fd00:51::/64")}, []string{"fd00:50::/64", "fd00:51::/64"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v6 := tt.in[0].Addr().Is6()
			s := Set{Set: nftables.Set{Interval: true, KeyType: nftables.TypeIPAddr}, Elements: intervalElements(v6, tt.in)}
			if v6 {
				s.KeyType = nftables.TypeIP6Addr
			}
			if diff := cmp.Diff(tt.want, s.elements()); diff != "" {
				t.Errorf("elements (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKillSwitchGroups(t *testing.T) {
	pfx := netip.MustParsePrefix
	d := Desired{KillSwitch: []KillSwitch{
		{From: pfx("10.10.50.0/24"), AllowOut: []string{"wg-pia", "wg1"}},
		{From: pfx("10.10.51.0/24"), AllowOut: []string{"wg1", "wg-pia"}}, // same list, other order: same group
		{From: pfx("10.10.52.0/24"), AllowOut: []string{"wg-pia"}},
		{From: pfx("10.10.53.0/24"), AllowOut: []string{"a_b", "c"}}, // the same name as [a, b_c] after joining: hashed
		{From: pfx("10.10.54.0/24"), AllowOut: []string{"a", "b_c"}},
	}}
	var got []string
	for _, s := range d.Tables()[0].Sets {
		got = append(got, s.header()+" "+strings.Join(s.elements(), ","))
	}
	want := []string{
		"set ks_407746fc8544d43c_out { type ifname; } \"a\",\"b_c\"",
		"set ks_407746fc8544d43c_v4 { type ipv4_addr; flags interval; } 10.10.54.0/24",
		"set ks_1d50bb501b80c640_out { type ifname; } \"a_b\",\"c\"",
		"set ks_1d50bb501b80c640_v4 { type ipv4_addr; flags interval; } 10.10.53.0/24",
		"set ks_wg-pia_out { type ifname; } \"wg-pia\"",
		"set ks_wg-pia_v4 { type ipv4_addr; flags interval; } 10.10.52.0/24",
		"set ks_wg-pia_wg1_out { type ifname; } \"wg-pia\",\"wg1\"",
		"set ks_wg-pia_wg1_v4 { type ipv4_addr; flags interval; } 10.10.50.0/23",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
	if rules := len(d.Tables()[0].Chains[0].Rules); rules != 4 {
		t.Errorf("%d kill-switch rules for 4 groups", rules)
	}
}

func TestDesiredEqual(t *testing.T) {
	a, b := gateway(), gateway()
	if !a.Equal(b) {
		t.Fatal("equal desired values differ")
	}
	b.KillSwitch[0].AllowOut = slices.Concat(b.KillSwitch[0].AllowOut, []string{"x"})
	if a.Equal(b) {
		t.Fatal("different allowOut compares equal")
	}
}

// TestKillSwitchAllowTo: a kill switch with allowTo is a group of its own
// with a destination set its drop rule skips; the VLAN's group beside it
// keeps its sets and its rule as they were without it.
func TestKillSwitchAllowTo(t *testing.T) {
	pfx := netip.MustParsePrefix
	vlan := Desired{KillSwitch: []KillSwitch{{From: pfx("10.10.50.0/24"), AllowOut: []string{"wg-pia"}}}}
	both := vlan
	both.KillSwitch = append(slices.Clone(vlan.KillSwitch), KillSwitch{From: pfx("10.90.0.128/25"), AllowOut: []string{"wg-pia"},
		AllowTo: []netip.Prefix{pfx("192.168.2.0/24"), pfx("fd00:2::/64")}})
	var got []string
	for _, s := range both.Tables()[0].Sets {
		got = append(got, s.header()+" "+strings.Join(s.elements(), ","))
	}
	want := []string{
		"set ks_wg-pia_out { type ifname; } \"wg-pia\"",
		"set ks_wg-pia_v4 { type ipv4_addr; flags interval; } 10.10.50.0/24",
		"set ks_wg-pia_to_192.168.2.0-24_to_fd00-2---64_out { type ifname; } \"wg-pia\"",
		"set ks_wg-pia_to_192.168.2.0-24_to_fd00-2---64_v4 { type ipv4_addr; flags interval; } 10.90.0.128/25",
		"set ks_wg-pia_to_192.168.2.0-24_to_fd00-2---64_v4_to { type ipv4_addr; flags interval; } 192.168.2.0/24",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
	rules := both.Tables()[0].Chains[0].Rules
	if len(rules) != 2 || !slices.EqualFunc(rules[:1], vlan.Tables()[0].Chains[0].Rules, func(a, b Rule) bool { return reflect.DeepEqual(a, b) }) {
		t.Errorf("the VLAN's kill-switch rule changed beside the clients' (%d rules)", len(rules))
	}
	if len(rules[1].Exprs) <= len(rules[0].Exprs) {
		t.Errorf("the clients' rule does not test the destination: %d expressions, the VLAN's %d", len(rules[1].Exprs), len(rules[0].Exprs))
	}
}
