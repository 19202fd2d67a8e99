package release

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/dependents"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/netcfg/owners"
	"github.com/nodeagent/nodeagent/netcfg/route"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// node is the seeds' gateway node after an import and a take-over, as
// teardown would see it: every object nodeagent owns, to be removed.
func node(t *testing.T) (netcfg.Plans, netcfg.Desired, Owners, [2]wgtypes.Key) {
	t.Helper()
	pfx := netip.MustParsePrefix
	var keys [2]wgtypes.Key
	for i := range keys {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k.PublicKey()
	}
	vlan := func(name, parent string, id int, addrs ...string) link.ObservedLink {
		l := link.ObservedLink{Index: 10 + id, Name: name, Kind: "vlan", Parent: parent, VLANID: id, Up: true, Owned: true}
		for _, a := range addrs {
			l.Addrs = append(l.Addrs, link.ObservedAddr{Prefix: pfx(a), Owned: true, Markable: !pfx(a).Addr().Is4() || id != 52})
		}
		return l
	}
	shim := link.ObservedLink{Index: 60, Name: "vlan50-shim", Kind: "macvlan", Parent: "enp7s0.50", Owned: true}
	var tp netcfg.Plans
	tp.Link.Ops = []link.Op{
		{Kind: link.OpDeleteLink, Link: "enp7s0.50", Old: vlan("enp7s0.50", "enp7s0", 50, "10.10.50.1/24")},
		{Kind: link.OpDeleteLink, Link: "enp7s0.51", Old: vlan("enp7s0.51", "enp7s0", 51, "10.10.51.1/24", "fd51::1/64")},
		{Kind: link.OpDeleteLink, Link: "enp7s0.52", Old: vlan("enp7s0.52", "enp7s0", 52, "10.10.52.1/24")},
		{Kind: link.OpDeleteLink, Link: "vlan50-shim", Old: shim},
	}
	wg0 := wg.ObservedDevice{Name: "wg0", Index: 70, Kind: "wireguard", Impl: wg.ImplKernel, Owned: true,
		Peers: map[wgtypes.Key]wg.ObservedPeer{keys[0]: {PublicKey: keys[0]}, keys[1]: {PublicKey: keys[1]}}}
	wg1 := wg.ObservedDevice{Name: "wg1", Index: 71, Kind: "wireguard", Impl: wg.ImplKernel, Owned: true,
		Addrs: []wg.ObservedAddr{{Prefix: pfx("10.91.0.1/24"), Owned: true, Markable: true}}}
	pia := wg.ObservedDevice{Name: "wg-pia", Index: 72, Kind: "wireguard", Impl: wg.ImplKernel, Owned: true}
	tp.WG.Ops = []wg.Op{
		{Kind: wg.OpDeleteDevice, Device: "wg-pia", Old: pia},
		{Kind: wg.OpDeleteDevice, Device: "wg0", Old: wg0},
		{Kind: wg.OpDeleteDevice, Device: "wg1", Old: wg1},
	}
	rule := func(prio int, from string, table int) route.Rule {
		return route.Rule{Priority: prio, Family: unix.AF_INET, From: pfx(from), Table: table, Suppress: -1, Action: unix.FR_ACT_TO_TBL}
	}
	viaUp := route.Route{Table: 150, To: pfx("0.0.0.0/0"), Type: unix.RTN_UNICAST, Via: netip.MustParseAddr("192.0.2.1"), Dev: "up0"}
	onVLAN := route.Route{Table: 254, To: pfx("10.20.0.0/16"), Type: unix.RTN_UNICAST, Via: netip.MustParseAddr("10.10.50.254"), Dev: "enp7s0.50"}
	t160 := route.Route{Table: 160, To: pfx("10.60.0.0/16"), Type: unix.RTN_UNICAST, Via: netip.MustParseAddr("192.0.2.1"), Dev: "up0"}
	made := route.Route{Table: 150, To: pfx("0.0.0.0/0"), Type: unix.RTN_UNREACHABLE, Metric: route.KillSwitchMetric}
	tp.Route.Ops = []route.Op{
		{Kind: route.OpDelRule, Rule: rule(1000, "10.10.50.0/24", 150)},
		{Kind: route.OpDelRule, Rule: rule(1001, "10.10.60.0/24", 160)},
		{Kind: route.OpDelRule, Rule: rule(1002, "10.10.70.0/24", 160)},
		{Kind: route.OpDelRoute, Route: viaUp},
		{Kind: route.OpDelRoute, Route: onVLAN},
		{Kind: route.OpDelRoute, Route: t160},
		{Kind: route.OpDelRoute, Route: made},
	}
	var d netcfg.Desired
	d.Link.Links = []link.Link{
		{Name: "enp7s0.50", Kind: link.VLAN, Adopt: true},
		{Name: "enp7s0.51", Kind: link.VLAN, Adopt: true},
		{Name: "enp7s0.52", Kind: link.VLAN, Adopt: true},
		{Name: "vlan50-shim", Kind: link.Macvlan},
	}
	d.WG.Devices = []wg.Device{{Name: "wg0", Adopt: true}, {Name: "wg1", Adopt: true}, {Name: "wg-pia"}}
	d.Route.AdoptRoutes = map[route.Route]bool{viaUp: true, onVLAN: true, t160: true}
	d.Route.AdoptRules = map[route.Rule]bool{rule(1000, "10.10.50.0/24", 150): true, rule(1001, "10.10.60.0/24", 160): true}
	own := Owners{
		WGQuick: map[string]WGQuick{"wg0": {File: "/etc/wireguard/wg0.conf", Peers: map[string]bool{keys[0].String(): true}}},
		Units: []Unit{{Name: "vlan50.service", unitMakes: unitMakes{
			Links:  []string{"enp7s0.50"},
			Routes: []routeKey{{Table: 150, To: pfx("0.0.0.0/0")}, {Table: 254, To: pfx("10.20.0.0/16")}},
			Rules:  []ruleKey{{Family: unix.AF_INET, Priority: 1000, From: pfx("10.10.50.0/24"), Table: 150}},
		}}},
		Files: []owners.Owner{
			{Kind: owners.Networkd, Link: "enp7s0.51", File: "/etc/systemd/network/10-trunk.network", Role: "the parent's VLAN= line"},
			{Kind: owners.Networkd, Link: "enp7s0.51", File: "/etc/systemd/network/51-vlan51.netdev", Makes: true},
		},
		NodeagentEnabled: true,
	}
	return tp, d, own, keys
}

// TestMakeByOwner: what release does with each object, by who made it
// and who takes it back (the package comment).
func TestMakeByOwner(t *testing.T) {
	tp, d, own, keys := node(t)
	p := Make(tp, d, own, Options{})
	want := `- link enp7s0.50 (vlan 50 on enp7s0): vlan50.service makes it again (its ip link add fails while it exists)
~ link enp7s0.51 (vlan 51 on enp7s0) hand back: unmark it and its addresses 10.10.51.1/24, fd51::1/64; it stays as it is: systemd-networkd takes it as it is (/etc/systemd/network/51-vlan51.netdev)
~ link enp7s0.52 (vlan 52 on enp7s0) hand back: unmark it; it stays as it is; 10.10.52.1/24 keeps the mark (the kernel changes an IPv4 address's mark in place only from Linux 6.4, and release deletes nothing): nothing under /etc makes it now
- link vlan50-shim (macvlan on enp7s0.50)
- wireguard wg-pia (kernel)
- wireguard wg0 (kernel): wg-quick@wg0 makes it again from /etc/wireguard/wg0.conf (wg-quick up fails while it exists)
~ wireguard wg1 (kernel) hand back: unmark it and its addresses 10.91.0.1/24; it stays as it is, peers and all: nothing under /etc makes it now
- rule 1000: from 10.10.50.0/24 lookup 150: vlan50.service adds it again (its ip rule add fails while it exists)
~ rule 1001: from 10.10.60.0/24 lookup 160 hand back: an unmarked copy (as ip rule add makes it) added beside it, then it deleted
- rule 1002: from 10.10.70.0/24 lookup 160
- route default via 192.0.2.1 dev up0 table 150: vlan50.service adds it again (its ip route add fails while it exists)
- route 10.20.0.0/16 via 10.10.50.254 dev enp7s0.50 table 254
~ route 10.60.0.0/16 via 192.0.2.1 dev up0 table 160 hand back: unmark (protocol boot, as ip route add gives it), and it stays
- route unreachable default table 150 metric 4294967295
`
	if diff := cmp.Diff(strings.Split(want, "\n"), strings.Split(p.Plans.String(), "\n")); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
	wantSteps := []string{
		"systemctl disable nodeagent   # else the next boot starts it, and it takes every object of the config over again",
		"systemctl stop vlan50.service; systemctl enable --now vlan50.service   # makes enp7s0.50 again",
		"systemctl stop wg-quick@wg0; systemctl enable --now wg-quick@wg0   # makes wg0 again",
		"networkctl reload   # systemd-networkd finds enp7s0.51 there and uses it as it is (/etc/systemd/network/51-vlan51.netdev)",
	}
	if diff := cmp.Diff(wantSteps, p.Steps); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	notes := strings.Join(p.Notes, "\n")
	for _, n := range []string{
		"enp7s0.52 (vlan) is handed back as it is, and nothing under /etc makes it",
		"wg1 (wireguard) is handed back as it is, and nothing under /etc makes it",
		"1 peer(s) of wg0 are not in /etc/wireguard/wg0.conf (added since the import, in nodeagent's register): " + keys[1].String(),
	} {
		if !strings.Contains(notes, n) {
			t.Errorf("no note %q in:\n%s", n, notes)
		}
	}
	if strings.Contains(notes, keys[0].String()) {
		t.Errorf("a peer the wg-quick file has is noted as missing:\n%s", notes)
	}
	if diff := cmp.Diff([]string{"enp7s0.50", "wg0"}, p.Deleted); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
	// PIA's scripts' units make their tunnel again, when the config has
	// a PIA tunnel of nodeagent's; a kill switch's going is said.
	own.PIAUnits = []string{"pia-vpn.service"}
	d.Nft.KillSwitch = []nft.KillSwitch{{}}
	q := Make(tp, d, own, Options{PIA: []string{"wg-pia"}})
	if !slices.Contains(q.Steps, "systemctl enable --now pia-vpn.service   # PIA's manual-connections scripts make their tunnel again") ||
		!strings.Contains(strings.Join(q.Notes, "\n"), "the kill switch goes with nodeagent's nftables table") {
		t.Errorf("with PIA's scripts' unit and a kill switch: steps %q, notes %q", q.Steps, q.Notes)
	}
	if p := Make(tp, d, own, Options{}); slices.ContainsFunc(p.Steps, func(s string) bool { return strings.Contains(s, "pia-vpn") }) {
		t.Errorf("PIA's scripts are started again without a PIA tunnel in the config: %q", p.Steps)
	}
	// Pure: the teardown plan it was given is as it was.
	if tp.Link.Ops[1].Kind != link.OpDeleteLink || tp.WG.Ops[1].Detail != "" || tp.Route.Ops[0].Reason != "" {
		t.Error("Make changed the teardown plan it was given")
	}
}

// TestMakeInPlace: --in-place deletes nothing adopted; what a unit or
// wg-quick makes is handed back as it is, and the step enables it for the
// next boot rather than starting it now.
func TestMakeInPlace(t *testing.T) {
	tp, d, own, _ := node(t)
	p := Make(tp, d, own, Options{InPlace: true})
	text := p.Plans.String()
	for _, l := range []string{
		"~ link enp7s0.50 (vlan 50 on enp7s0) hand back: unmark it and its addresses 10.10.50.1/24; it stays as it is: vlan50.service makes it at the next boot; not now, as its ip link add fails while it exists",
		"~ wireguard wg0 (kernel) hand back: unmark it; it stays as it is, peers and all: wg-quick@wg0 makes it at the next boot from /etc/wireguard/wg0.conf; not now, as wg-quick up fails while it exists",
		"~ rule 1000: from 10.10.50.0/24 lookup 150 hand back: an unmarked copy (as ip rule add makes it) added beside it, then it deleted: vlan50.service adds it at the next boot",
		"~ route default via 192.0.2.1 dev up0 table 150 hand back: unmark (protocol boot, as ip route add gives it), and it stays: vlan50.service adds it at the next boot",
		"~ route 10.20.0.0/16 via 10.10.50.254 dev enp7s0.50 table 254 hand back",
		"- link vlan50-shim (macvlan on enp7s0.50)\n",
		"- wireguard wg-pia (kernel)\n",
		"- rule 1002: from 10.10.70.0/24 lookup 160\n",
	} {
		if !strings.Contains(text, l) {
			t.Errorf("plan lacks %q:\n%s", l, text)
		}
	}
	if len(p.Deleted) != 0 {
		t.Errorf("in place, release deletes %v", p.Deleted)
	}
	steps := strings.Join(p.Steps, "\n")
	for _, s := range []string{"systemctl enable vlan50.service   # at the next boot", "systemctl enable wg-quick@wg0   # at the next boot"} {
		if !strings.Contains(steps, s) {
			t.Errorf("steps lack %q:\n%s", s, steps)
		}
	}
	if strings.Contains(steps, "--now") {
		t.Errorf("in place, a step starts a unit now:\n%s", steps)
	}
}

// TestMakeChildOfDeleted: an adopted link whose parent release deletes
// goes with it (the kernel deletes a VLAN's or macvlan's children), so it
// is planned as deleted, not handed back.
func TestMakeChildOfDeleted(t *testing.T) {
	tp, d, own, _ := node(t)
	child := link.ObservedLink{Index: 80, Name: "shim50", Kind: "macvlan", Parent: "enp7s0.50", Owned: true}
	tp.Link.Ops = append(tp.Link.Ops, link.Op{Kind: link.OpDeleteLink, Link: "shim50", Old: child})
	d.Link.Links = append(d.Link.Links, link.Link{Name: "shim50", Kind: link.Macvlan, Adopt: true})
	own.Files = append(own.Files, owners.Owner{Kind: owners.Networkd, Link: "shim50", File: "/etc/systemd/network/shim50.netdev", Makes: true})
	p := Make(tp, d, own, Options{})
	if !strings.Contains(p.Plans.String(), "- link shim50 (macvlan on enp7s0.50): goes with its parent enp7s0.50, which release deletes\n") {
		t.Errorf("the child of a deleted link:\n%s", p.Plans.String())
	}
}

// TestPodsRefusal: pods' links on a link release would delete refuse it,
// naming each with its lower link and the ways out; --in-place is offered
// only where the link is the old setup's (deleted for its unit), not one
// nodeagent made; no pods, no refusal.
func TestPodsRefusal(t *testing.T) {
	names := map[int]string{50: "enp7s0.50", 60: "vlan50-shim"}
	pod := dependents.Link{Parent: 50, Name: "net1", Kind: "macvlan", Where: "netns cni-1234"}
	err := podsRefusal([]dependents.Link{pod}, names, []string{"enp7s0.50"}, false)
	want := "1 link(s) of other network namespaces (pods) sit on links release would delete, and the kernel would delete them too:\n" +
		"  enp7s0.50: macvlan net1 in netns cni-1234\n" +
		"remove those pods first (or their attachments, with CNI DEL), or run nodeagent release --in-place (what the old setup makes itself is handed back as it is, and its units make it at the next boot), or run nodeagent release --force (the pods lose those links)"
	if err == nil || err.Error() != want {
		t.Errorf("refusal:\n%v\nwant:\n%s", err, want)
	}
	shimPod := dependents.Link{Parent: 60, Name: "net1", Kind: "macvlan", Where: "netns cni-5678"}
	err = podsRefusal([]dependents.Link{shimPod}, names, []string{"enp7s0.50"}, false)
	if err == nil || strings.Contains(err.Error(), "--in-place") || !strings.Contains(err.Error(), "vlan50-shim: macvlan net1 in netns cni-5678") {
		t.Errorf("a pod on nodeagent's own link: %v", err)
	}
	if err := podsRefusal(nil, names, []string{"enp7s0.50"}, false); err != nil {
		t.Errorf("no pods: %v", err)
	}
}
