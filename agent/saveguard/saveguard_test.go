package saveguard

import (
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

const running = `vlans:
  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.50.1/24]}
  - {name: enp1s0.60, parent: enp1s0, id: 60}
routing:
  tables:
    - {id: 150, name: vpn, killSwitch: true, routes: [{to: default, dev: enp1s0.60}]}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  masquerade: [{from: 10.10.50.0/24, out: enp1s0}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [enp1s0.60]}]
`

func parse(t *testing.T, s string) *config.Config {
	t.Helper()
	c, err := config.Parse("nodeagent.yaml", []byte(s))
	if err != nil {
		t.Fatalf("parse:\n%s\n%v", s, err)
	}
	return c
}

func TestRisks(t *testing.T) {
	run := parse(t, running)
	for _, tc := range []struct {
		name, next string
		want       []string // substrings, in order; none: an ordinary change
	}{
		{"the same", running, nil},
		{"one VLAN fewer", strings.Replace(running, "  - {name: enp1s0.60, parent: enp1s0, id: 60}\n", "", 1) + "", nil},
		{"a masquerade more", strings.Replace(running, "out: enp1s0}]", "out: enp1s0}, {from: 10.10.51.0/24, out: enp1s0}]", 1), nil},
		{"comments only", "# later\n", []string{"it declares no objects: applied, it would remove all 6"}},
		{"{}", "{}\n", []string{"it declares no objects"}},
		{"no masquerade", strings.Replace(running, "  masquerade: [{from: 10.10.50.0/24, out: enp1s0}]\n", "", 1), []string{"every entry of firewall.masquerade (1)"}},
		{"kill switch off", strings.Replace(running, "killSwitch: true", "killSwitch: false", 1), []string{"disarms the kill switch of routing table 150 (vpn)", "no longer sends 10.10.50.0/24 into kill-switch table 150 (rule 1000)"}},
		{"firewall kill switch gone", strings.Replace(running, "  killSwitch: [{from: 10.10.50.0/24, allowOut: [enp1s0.60]}]\n", "", 1), []string{"every entry of firewall.killSwitch (1)", "drops the firewall kill switch for 10.10.50.0/24"}},
		{"source out of the kill switch", strings.Replace(running, "from: 10.10.50.0/24, table: 150", "from: 10.10.99.0/24, table: 150", 1), []string{"no longer sends 10.10.50.0/24 into kill-switch table 150"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Risks(run, parse(t, tc.next))
			if len(tc.want) == 0 {
				if len(got) != 0 {
					t.Fatalf("an ordinary change held: %q", got)
				}
				return
			}
			all := Summary(got)
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("risks %q lack %q", all, w)
				}
			}
		})
	}
	if got := Risks(nil, run); got != nil {
		t.Errorf("at start (nothing running): %q", got)
	}
}

func TestEmpty(t *testing.T) {
	for s, want := range map[string]bool{"": true, " \n\t\n": true, "# x\n": false, "{}": false} {
		if Empty([]byte(s)) != want {
			t.Errorf("Empty(%q) = %v", s, !want)
		}
	}
}
