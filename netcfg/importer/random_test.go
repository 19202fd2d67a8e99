package importer

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestBuildRandom builds configs from random snapshots, odd kernels
// included (one address on two links, rules sharing priorities, routes of
// every type and family, tables named twice): every one must validate,
// which Build itself checks and reports as an error.
func TestBuildRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 1))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	addr := func() string {
		if r.IntN(3) == 0 {
			return fmt.Sprintf("fd00:%x::%x/%d", r.IntN(4), r.IntN(4)+1, pick2(r, 64, 128))
		}
		return fmt.Sprintf("10.%d.%d.%d/%d", r.IntN(3), r.IntN(3), r.IntN(4)+1, pick2(r, 24, 32))
	}
	prefix := func(v6 bool) string {
		if v6 {
			return pick("::/0", "fd00:1::/64", "fd00:2::/48")
		}
		return pick("0.0.0.0/0", "10.1.0.0/16", "10.2.3.0/24", "192.0.2.0/24")
	}
	for i := 0; i < 500; i++ {
		s := Snapshot{TableNames: map[int]string{100: pick("vpn", "a b", "main", "9"), 101: pick("vpn", "guest", "")}}
		s.Links = append(s.Links, Link{Name: "eth0", MTU: 1500, Up: true}, Link{Name: "br0", Kind: "bridge", MTU: 1500})
		for j := 0; j < r.IntN(5); j++ {
			l := Link{Name: fmt.Sprintf("l%d", j), MTU: pick2(r, 1500, 1400), Up: r.IntN(2) == 0,
				Parent: pick("eth0", "br0", "l0", "gone", ""), Kind: pick("vlan", "macvlan", "veth")}
			if l.Kind == "vlan" {
				l.VLANID = r.IntN(4094) + 1
			}
			l.MacvlanMode = pick("bridge", "private", "source")
			for k := 0; k < r.IntN(3); k++ {
				l.Addresses = append(l.Addresses, Addr{Prefix: addr(), Scope: pick("global", "global", "link"), Dynamic: r.IntN(4) == 0})
			}
			s.Links = append(s.Links, l)
		}
		for j := 0; j < r.IntN(8); j++ {
			v6 := r.IntN(2) == 0
			ru := Rule{Priority: r.IntN(4) * 100, Family: map[bool]string{false: "inet", true: "inet6"}[v6],
				Table: []int{0, 100, 101, 102, 254, 253}[r.IntN(6)], Action: pick("table", "table", "goto", "unreachable"),
				Invert: r.IntN(4) == 0, IIF: pick("", "eth0"), FwMark: pick("", "0x10", "0x10/0xff")}
			if r.IntN(2) == 0 {
				ru.From = prefix(v6)
			}
			if ru.Action != "table" {
				ru.Table = 0
			}
			s.Rules = append(s.Rules, ru)
		}
		for j := 0; j < r.IntN(10); j++ {
			v6 := r.IntN(2) == 0
			rt := Route{Table: []int{100, 101, 102, 254}[r.IntN(4)], To: prefix(v6), Type: pick("unicast", "unicast", "unreachable", "throw", "blackhole"),
				Protocol: []int{2, 3, 4, 16, 147}[r.IntN(5)], Scope: pick("global", "link", "host"), Metric: []int{0, 100, 1024, 4294967295}[r.IntN(4)],
				Dev: pick("", "eth0", "br0", "l1"), OnLink: r.IntN(5) == 0}
			if r.IntN(2) == 0 && rt.Type == "unicast" {
				rt.Via = map[bool]string{false: "10.1.0.1", true: "fd00:1::1"}[v6]
			}
			s.Routes = append(s.Routes, rt)
		}
		s.Sysctls = map[string]string{"net.ipv4.ip_forward": pick("0", "1"), "net.ipv4.conf.l0.rp_filter": pick("0", "2")}
		res, err := Build(s, Options{})
		if err != nil {
			t.Fatalf("snapshot %d: %v\n%+v", i, err, s)
		}
		again, _ := Build(s, Options{})
		if string(again.Config) != string(res.Config) {
			t.Fatalf("snapshot %d: a second Build differs", i)
		}
	}
}

func pick2(r *rand.Rand, a, b int) int {
	if r.IntN(2) == 0 {
		return a
	}
	return b
}
