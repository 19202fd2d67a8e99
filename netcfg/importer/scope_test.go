package importer

import "testing"

// TestOwnerShapes: the shapes the sources install (scope.go) name their
// owners; a rule of the old setup's shape names none.
func TestOwnerShapes(t *testing.T) {
	for _, c := range []struct {
		rule Rule
		want string
	}{
		{Rule{Priority: 9, FwMark: "0x200/0xf00", Table: 2004, Action: "table", Protocol: 2}, "Cilium's (its L7 proxy's)"},
		{Rule{Priority: 10, FwMark: "0xb00/0xf00", Table: 2005, Action: "table", Protocol: 2}, "Cilium's (its L7 proxy's)"},
		{Rule{Priority: 100, Table: 255, Action: "table", Protocol: 2}, "Cilium's (the kernel's local-table rule, which Cilium moves from 0 to 100 to put its own ahead of it)"},
		{Rule{Priority: 5250, FwMark: "0x80000/0xff0000", Action: "unreachable"}, "Tailscale's (its policy routing (5200 and up))"},
		{Rule{Priority: 32765, From: "10.42.0.0/24", Table: 77, Action: "table"}, "kube-router's (its pod networks' policy routing (table 77, kube-router))"},
		{Rule{Priority: 32764, FwMark: "0x3e8", Table: 78, Action: "table"}, "kube-router's (its DSR services' (table 78, kube-router-dsr))"},
		{Rule{Priority: 32765, Table: 79, Action: "table"}, "kube-router's (its external IPs' (table 79, external_ip))"},
		{Rule{Priority: 1000, From: "10.10.50.0/24", Table: 150, Action: "table"}, ""},
	} {
		if got := ruleOwner(c.rule); got != c.want {
			t.Errorf("rule %+v: owner %q, want %q", c.rule, got, c.want)
		}
	}
	b := &builder{s: Snapshot{TableNames: map[int]string{77: "kube-router"},
		Routes: []Route{{Table: 300, To: "172.18.0.0/16", Dev: "br-0123456789ab"}, {Table: 301, To: "10.0.0.0/8", Dev: "eth0"}}}}
	for id, want := range map[int]string{52: "Tailscale's (its policy routing (5200 and up))", 77: "kube-router's (its pod networks' policy routing (table 77, kube-router))",
		2005: "Cilium's (its L7 proxy's)", 300: "Docker's (its bridge br-0123456789ab)", 301: ""} {
		if got := b.tableOwner(id); got != want {
			t.Errorf("table %d: owner %q, want %q", id, got, want)
		}
	}
	for name, want := range map[string]string{"docker0": "Docker's (its bridge docker0)", "tailscale0": "Tailscale's (through tailscale0)",
		"lxc12ab": "Cilium's (through lxc12ab)", "kube-bridge": "kube-router's (through kube-bridge)", "enp1s0": ""} {
		if got := linkOwner(name); got != want {
			t.Errorf("link %s: owner %q, want %q", name, got, want)
		}
	}
}
