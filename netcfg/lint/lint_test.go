package lint

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/config"
)

func warnings(t *testing.T, yaml string) []string {
	t.Helper()
	c, err := config.ParseWith("nodeagent.yaml", []byte(yaml), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatalf("the config does not validate: %v", err)
	}
	var out []string
	for _, w := range Check(c) {
		out = append(out, w.Error())
	}
	return out
}

// The seeds' layout as the example had it (the pods' gateway on
// enp1s0.50, their subnet routed out of it) and as it must be.
const (
	oldLayout = `vlans:
  - name: enp1s0.50
    parent: enp1s0
    id: 50
    addresses: [10.10.50.1/24]
macvlans:
  - {name: vlan50-shim, parent: enp1s0.50, addresses: [10.10.50.3/32]}
routing:
  tables:
    - id: 150
      routes:
        - {to: default, dev: wg-pia}
        - {to: 10.10.50.0/24, dev: enp1s0.50, scope: link}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
`
	newLayout = `vlans:
  - {name: enp1s0.50, parent: enp1s0, id: 50}
macvlans:
  - {name: vlan50-shim, parent: enp1s0.50, addresses: [10.10.50.1/24]}
routing:
  tables:
    - id: 150
      routes:
        - {to: default, dev: wg-pia}
        - {to: 10.10.50.0/24, dev: vlan50-shim, scope: link}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
`
)

func TestShimLayout(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"the pods' gateway and route on the VLAN", oldLayout, []string{
			"nodeagent.yaml:5: vlans[0].addresses[0]: macvlan pods on enp1s0.50 cannot reach 10.10.50.1 on enp1s0.50 itself; put it on vlan50-shim",
			"nodeagent.yaml:13: routing.tables[0].routes[1].dev: macvlan pods on enp1s0.50 never receive what the node sends out of enp1s0.50 itself; route 10.10.50.0/24 via vlan50-shim",
		}},
		{"the gateway and route on the shim", newLayout, nil},
		{"a shim with no address beside an addressed VLAN", "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.50.1/24]}\nmacvlans:\n  - {name: s, parent: enp1s0.50}\n",
			[]string{"nodeagent.yaml:2: vlans[0].addresses[0]: macvlan pods on enp1s0.50 cannot reach 10.10.50.1 on enp1s0.50 itself; put it on s"}},
		{"a shim serving another subnet", "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.60.1/24]}\nmacvlans:\n  - {name: s, parent: enp1s0.50, addresses: [10.10.50.1/24]}\n", nil},
		{"no shim: the VLAN's address serves hosts beyond the trunk", "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.50.1/24]}\n", nil},
		{"a vepa macvlan standing in for the VLAN", "macvlans:\n  - {name: vlan50, parent: enp1s0, mode: vepa, addresses: [10.10.50.1/24]}\n  - {name: vlan50-shim, parent: vlan50, addresses: [10.10.50.3/24]}\n",
			[]string{"nodeagent.yaml:2: macvlans[0].addresses[0]: macvlan pods on vlan50 cannot reach 10.10.50.1 on vlan50 itself; put it on vlan50-shim"}},
		{"a route to another subnet than the shim's", "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.60.1/24]}\nmacvlans:\n  - {name: s, parent: enp1s0.50, addresses: [10.10.50.1/24]}\nrouting:\n  tables:\n    - {id: 150, routes: [{to: 10.10.60.0/24, dev: enp1s0.50}]}\n", nil},
		{"pods on the trunk itself", "macvlans:\n  - {name: s, parent: enp1s0, addresses: [10.10.50.1/24]}\nrouting:\n  tables:\n    - {id: 150, routes: [{to: 10.10.50.0/24, dev: enp1s0}]}\n",
			[]string{"nodeagent.yaml:5: routing.tables[0].routes[0].dev: macvlan pods on enp1s0 never receive what the node sends out of enp1s0 itself; route 10.10.50.0/24 via s"}},
		{"a private-mode macvlan is no shim", "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.50.1/24]}\nmacvlans:\n  - {name: p, parent: enp1s0.50, mode: private, addresses: [10.10.50.3/24]}\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, warnings(t, tt.yaml)); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExampleHasNoWarnings: the shipped example is the layout that works.
func TestExampleHasNoWarnings(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "homelab.yaml")
	c, err := config.LoadWith(path, config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	if w := Check(c); len(w) > 0 {
		var s []string
		for _, e := range w {
			s = append(s, e.Error())
		}
		t.Errorf("the example warns:\n%s", strings.Join(s, "\n"))
	}
}

// TestTranslatedPort: a fixed toPort is warned about (peers are told the
// port the client listens on, which PIA does not forward); the forwarded
// port's own number, or no port forwarding, is not.
func TestTranslatedPort(t *testing.T) {
	pia := "wireguard:\n  - name: wg-pia\n    pia:\n      region: nl\n      credentialsFile: /etc/x\n      portForward: %s\n" +
		strings.Replace(newLayout, "    - id: 150\n", "    - id: 150\n      killSwitch: true\n", 1)
	for _, tc := range []struct {
		name, pf string
		want     []string
	}{
		{"fixed toPort", "{enabled: true, to: 10.10.50.10, toPort: 6881}", []string{
			"nodeagent.yaml:6: wireguard[0].pia.portForward.toPort: the forwarded port is PIA's, not 6881: a torrent client listening on 6881 announces a port peers cannot reach; drop toPort and set the client's port to the forwarded one (onChange)",
		}},
		{"the forwarded port's own", "{enabled: true, to: 10.10.50.10}", nil},
		{"toPort 0", "{enabled: true, to: 10.10.50.10, toPort: 0}", nil},
		{"reported only", "{enabled: true}", nil},
		{"off", "{enabled: false}", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := warnings(t, strings.Replace(pia, "%s", tc.pf, 1))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}
