package sysctl

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMakePlan(t *testing.T) {
	val := func(raw string) ObservedKey { return ObservedKey{Exists: true, Raw: raw} }
	keys := func(kv ...any) map[string]ObservedKey {
		m := map[string]ObservedKey{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1].(ObservedKey)
		}
		return m
	}
	allIfaces := []string{"net.ipv6.conf.all.forwarding", "net.ipv6.conf.default.forwarding", "net.ipv6.conf.enp1s0/50.forwarding", "net.ipv6.conf.lo.forwarding"}
	tests := []struct {
		name string
		d    map[string]string
		o    Observed
		want string
	}{
		{"converged is empty",
			map[string]string{"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": " 2 "},
			Observed{Keys: keys("net.ipv4.ip_forward", val("1\n"), "net.ipv4.conf.all.rp_filter", val("2\n"))},
			""},
		{"change",
			map[string]string{"net.ipv4.ip_forward": "1"},
			Observed{Keys: keys("net.ipv4.ip_forward", val("0\n"))},
			"~ sysctl net.ipv4.ip_forward 0 -> 1\n"},
		{"multi-value keys compare on fields",
			map[string]string{"net.ipv4.ip_local_port_range": "32768 60999", "net.ipv4.tcp_rmem": "4096  131072 6291456"},
			Observed{Keys: keys("net.ipv4.ip_local_port_range", val("32768\t60999\n"), "net.ipv4.tcp_rmem", val("4096\t131072\t6291456\n"))},
			""},
		{"multi-value change is quoted",
			map[string]string{"net.ipv4.ip_local_port_range": "20000\t40000"},
			Observed{Keys: keys("net.ipv4.ip_local_port_range", val("32768\t60999\n"))},
			"~ sysctl net.ipv4.ip_local_port_range \"32768 60999\" -> \"20000 40000\"\n"},
		{"integers compare numerically",
			map[string]string{"net.ipv4.conf.all.src_valid_mark": "01"},
			Observed{Keys: keys("net.ipv4.conf.all.src_valid_mark", val("1\n"))},
			""},
		{"glob expands to what was observed; all before default before interfaces",
			map[string]string{"net.ipv6.conf.*.forwarding": "1"},
			Observed{
				Keys: keys("net.ipv6.conf.all.forwarding", val("0\n"), "net.ipv6.conf.default.forwarding", val("0\n"),
					"net.ipv6.conf.enp1s0/50.forwarding", val("1\n"), "net.ipv6.conf.lo.forwarding", val("0\n")),
				Matches: map[string][]string{"net.ipv6.conf.*.forwarding": allIfaces},
			},
			"~ sysctl net.ipv6.conf.all.forwarding 0 -> 1\n~ sysctl net.ipv6.conf.default.forwarding 0 -> 1\n~ sysctl net.ipv6.conf.lo.forwarding 0 -> 1\n"},
		{"literal key beats a glob",
			map[string]string{"net.ipv6.conf.*.forwarding": "1", "net.ipv6.conf.lo.forwarding": "0"},
			Observed{
				Keys: keys("net.ipv6.conf.all.forwarding", val("1\n"), "net.ipv6.conf.default.forwarding", val("1\n"),
					"net.ipv6.conf.enp1s0/50.forwarding", val("1\n"), "net.ipv6.conf.lo.forwarding", val("1\n")),
				Matches: map[string][]string{"net.ipv6.conf.*.forwarding": allIfaces},
			},
			"~ sysctl net.ipv6.conf.lo.forwarding 1 -> 0\n"},
		{"equally specific globs that disagree conflict",
			map[string]string{"net.ipv4.conf.*.rp_filter": "1", "net.ipv4.conf.enp*.rp_filter": "2"},
			Observed{
				Keys: keys("net.ipv4.conf.all.rp_filter", val("1\n"), "net.ipv4.conf.enp1s0.rp_filter", val("1\n")),
				Matches: map[string][]string{
					"net.ipv4.conf.*.rp_filter":    {"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.enp1s0.rp_filter"},
					"net.ipv4.conf.enp*.rp_filter": {"net.ipv4.conf.enp1s0.rp_filter"},
				},
			},
			"! sysctl net.ipv4.conf.enp1s0.rp_filter: conflicting values 1 (from net.ipv4.conf.*.rp_filter) and 2 (from net.ipv4.conf.enp*.rp_filter)\n"},
		{"interface not present yet is pending; the rest is planned",
			map[string]string{"net.ipv4.conf.enp1s0/50.rp_filter": "2", "net.ipv4.ip_forward": "1"},
			Observed{Keys: keys("net.ipv4.ip_forward", val("0\n"), "net.ipv4.conf.enp1s0/50.rp_filter", ObservedKey{Iface: "enp1s0.50"})},
			"~ sysctl net.ipv4.ip_forward 0 -> 1\n! sysctl net.ipv4.conf.enp1s0/50.rp_filter: pending: no such key yet (interface enp1s0.50 not present)\n"},
		{"interface present without the family is an error",
			map[string]string{"net.ipv6.conf.wg0.forwarding": "1"},
			Observed{Keys: keys("net.ipv6.conf.wg0.forwarding", ObservedKey{Iface: "wg0", IfaceExists: true})},
			"! sysctl net.ipv6.conf.wg0.forwarding: no such key: interface wg0 exists but has no net.ipv6.conf entry\n"},
		{"missing key naming no interface is an error",
			map[string]string{"net.ipv4.ip_forwarding": "1", "net.ipv4.conf.all.rp_filtr": "1"},
			Observed{Keys: keys("net.ipv4.ip_forwarding", ObservedKey{}, "net.ipv4.conf.all.rp_filtr", ObservedKey{})},
			"! sysctl net.ipv4.ip_forwarding: no such key\n! sysctl net.ipv4.conf.all.rp_filtr: no such key\n"},
		{"glob matching nothing",
			map[string]string{"net.ipv4.conf.vlan*.rp_filter": "1", "net.ipv4.nope*": "1"},
			Observed{},
			"! sysctl net.ipv4.nope*: no key matches\n! sysctl net.ipv4.conf.vlan*.rp_filter: pending: no interface matches yet\n"},
		{"unreadable and invalid keys",
			map[string]string{"net.ipv4.route.flush": "1", "kernel.hostname": "x", "net.ipv4.conf.//.x": "1"},
			Observed{Keys: keys("net.ipv4.route.flush", ObservedKey{Exists: true, Unreadable: "is write-only; nodeagent sets only keys it can read back"})},
			"! sysctl kernel.hostname: invalid key: outside net.*; nodeagent manages only network sysctls\n" +
				"! sysctl net.ipv4.route.flush: is write-only; nodeagent sets only keys it can read back\n" +
				"! sysctl net.ipv4.conf.//.x: invalid key: segment \"//\" is not a file name\n"},
		{"no values is empty", nil, Observed{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := MakePlan(Desired{Values: tt.d}, tt.o)
			if diff := cmp.Diff(tt.want, p.String()); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if p.Empty() != (tt.want == "") {
				t.Errorf("Empty() = %v for plan %q", p.Empty(), p)
			}
		})
	}
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		key     string
		want    []string
		wantErr bool
	}{
		{"net.ipv4.ip_forward", []string{"net", "ipv4", "ip_forward"}, false},
		{"net.ipv4.conf.enp1s0/50.rp_filter", []string{"net", "ipv4", "conf", "enp1s0.50", "rp_filter"}, false},
		{"net.ipv6.conf.*.forwarding", []string{"net", "ipv6", "conf", "*", "forwarding"}, false},
		{"net.ipv4..ip_forward", nil, true},
		{"net.ipv4.conf./.x", nil, true},
		{"net.ipv4.conf.//.x", nil, true},
		{"net.ipv4.conf.e[th.x", nil, true},
		{"vm.swappiness", nil, true},
	}
	for _, tt := range tests {
		got, err := parseKey(tt.key)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseKey(%q) error = %v, want error %v", tt.key, err, tt.wantErr)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("parseKey(%q) (-want +got):\n%s", tt.key, diff)
		}
		if err == nil && keyOf(got) != tt.key {
			t.Errorf("keyOf(parseKey(%q)) = %q", tt.key, keyOf(got))
		}
	}
}
