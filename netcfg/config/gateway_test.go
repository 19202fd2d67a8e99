package config

import (
	"slices"
	"testing"
	"time"
)

const gatewayBase = `node: {name: node-a}
vlans:
  - {name: enp1s0.50, parent: enp1s0, id: 50}
macvlans:
  - {name: vlan50-shim, parent: enp1s0.50, addresses: [10.10.50.2/24]}
wireguard:
  - name: wg-pia
    privateKeyFile: /etc/nodeagent/keys/wg-pia.key
    pia: {region: nl_amsterdam, credentialsFile: /etc/nodeagent/pia.cred}
kubernetes:
  kubeconfig: /etc/k.yaml
`

// TestGatewayDefaults: a role names its Lease, and the Lease's timing and
// the claim's probe have defaults that suit a take-over within seconds.
func TestGatewayDefaults(t *testing.T) {
	c, err := parseTest(t, gatewayBase+`gateway:
  name: vlan50-egress
  lease: {kubeconfig: /etc/nodeagent/gateway.kubeconfig}
  link: vlan50-shim
  addresses: [10.10.50.1/24, "fd00:50::1/64"]
  wireguard: [wg-pia]
  labels: {homelab.example/egress-gateway: "true"}
`)
	if err != nil {
		t.Fatal(err)
	}
	g := c.Gateway
	if g.Lease.Namespace != "nodeagent" || g.Lease.Name != "vlan50-egress" || g.Lease.Duration != 15*time.Second ||
		g.Lease.RenewDeadline != 10*time.Second || g.Lease.RetryPeriod != 2*time.Second {
		t.Errorf("lease defaults: %+v", g.Lease)
	}
	if g.Probe.Probes != 1 || g.Probe.Interval != 100*time.Millisecond || g.Probe.Wait != 200*time.Millisecond || g.Probe.Announcements != 3 {
		t.Errorf("probe defaults: %+v", g.Probe)
	}
	if got := g.GatewayPrefixes(); len(got) != 2 || got[0].String() != "10.10.50.1/24" {
		t.Errorf("prefixes %v", got)
	}
}

// TestGatewayErrors: each mistake is named at its line and field.
func TestGatewayErrors(t *testing.T) {
	const good = `gateway:
  name: vlan50-egress
  lease: {kubeconfig: /etc/nodeagent/gateway.kubeconfig}
  link: vlan50-shim
  addresses: [10.10.50.1/24]
`
	if _, err := parseTest(t, gatewayBase+good); err != nil {
		t.Fatalf("good: %v", err)
	}
	for _, tc := range []struct{ name, src, want string }{
		{"no name", "gateway:\n  lease: {kubeconfig: /etc/g.yaml}\n  link: vlan50-shim\n  addresses: [10.10.50.1/24]\n",
			"nodeagent.yaml:12: gateway.name: required (a lowercase DNS label naming the role, such as vlan50-egress)"},
		{"bad name", "gateway:\n  name: VLAN50\n  lease: {kubeconfig: /etc/g.yaml}\n  link: vlan50-shim\n  addresses: [10.10.50.1/24]\n",
			`nodeagent.yaml:13: gateway.name: "VLAN50" is not a lowercase DNS label (a-z, 0-9 and '-', at most 63)`},
		{"no kubeconfig", "gateway:\n  name: g\n  link: vlan50-shim\n  addresses: [10.10.50.1/24]\n",
			"nodeagent.yaml:12: gateway.lease.kubeconfig: required: the credentials that may read and write the role's Lease (packaging/examples/gateway-rbac.yaml makes them); the node's own identity cannot, since NodeRestriction confines a node to its own heartbeat Lease"},
		{"undeclared link", "gateway:\n  name: g\n  lease: {kubeconfig: /etc/g.yaml}\n  link: shim9\n  addresses: [10.10.50.1/24]\n",
			`nodeagent.yaml:15: gateway.link: no VLAN or macvlan "shim9" is declared`},
		{"wireguard link", "gateway:\n  name: g\n  lease: {kubeconfig: /etc/g.yaml}\n  link: wg-pia\n  addresses: [10.10.50.1/24]\n",
			`nodeagent.yaml:15: gateway.link: "wg-pia" is a WireGuard device; the gateway addresses live on a VLAN or macvlan the pods reach`},
		{"address twice", "gateway:\n  name: g\n  lease: {kubeconfig: /etc/g.yaml}\n  link: vlan50-shim\n  addresses: [10.10.50.2/24]\n",
			"nodeagent.yaml:16: gateway.addresses[0]: 10.10.50.2 is already assigned at macvlans[0].addresses[0] (line 5)"},
		{"no addresses", "gateway:\n  name: g\n  lease: {kubeconfig: /etc/g.yaml}\n  link: vlan50-shim\n",
			"nodeagent.yaml:12: gateway.addresses: required: the addresses the VLAN's pods route by (such as 10.10.50.1/24)"},
		{"undeclared device", good + "  wireguard: [wg9]\n",
			`nodeagent.yaml:17: gateway.wireguard[0]: no WireGuard interface "wg9" is declared`},
		{"label also static", "kubernetes:\n  kubeconfig: /etc/k.yaml\n  labels: {homelab.example/egress-gateway: \"true\"}\n" + good + "  labels: {homelab.example/egress-gateway: \"true\"}\n",
			`nodeagent.yaml:18: gateway.labels["homelab.example/egress-gateway"]: "homelab.example/egress-gateway" is also in kubernetes.labels or kubernetes.conditionalLabels; the role's label is on the holder's Node only`},
		{"renew not below duration", good + "  probe: {}\n",
			""},
		{"timing", "gateway:\n  name: g\n  lease: {kubeconfig: /etc/g.yaml, duration: 10s, renewDeadline: 10s}\n  link: vlan50-shim\n  addresses: [10.10.50.1/24]\n",
			"nodeagent.yaml:14: gateway.lease.renewDeadline: 10s is not below gateway.lease.duration (10s): a holder must give up renewing before the Lease can pass to another node"},
		{"retry too long", "gateway:\n  name: g\n  lease: {kubeconfig: /etc/g.yaml, retryPeriod: 9s}\n  link: vlan50-shim\n  addresses: [10.10.50.1/24]\n",
			"nodeagent.yaml:14: gateway.lease.retryPeriod: 9s is too long for gateway.lease.renewDeadline (10s): at most renewDeadline/1.2, so a renewal is retried before its deadline"},
		{"take back alone", good + "  preferred: {takeBack: true}\n",
			"nodeagent.yaml:17: gateway.preferred.takeBack: needs gateway.preferred.node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := gatewayBase + tc.src
			if tc.name == "label also static" {
				src = gatewayBase[:len(gatewayBase)-len("kubernetes:\n  kubeconfig: /etc/k.yaml\n")] + tc.src
			}
			_, err := parseTest(t, src)
			got := errorStrings(t, err)
			if tc.want == "" {
				if got != nil {
					t.Errorf("errors %q, want none", got)
				}
				return
			}
			if !slices.Equal(got, []string{tc.want}) {
				t.Errorf("errors %q\nwant [%q]", got, tc.want)
			}
		})
	}
}
