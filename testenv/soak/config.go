package soak

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

// ExampleFile is the homelab config the soak runs, relative to the
// repository root.
const ExampleFile = "examples/homelab.yaml"

// ConfigParams are what the soak's lab changes in the example: the names
// that must be unique on a shared machine (userspace WireGuard sockets are
// global), where files live, the stub's URLs and trust, and the VLAN links
// on a kernel without 8021q.
type ConfigParams struct {
	// Dir stands for / : /etc/nodeagent/x becomes Dir/etc/nodeagent/x.
	Dir string
	// PIADev and WG0Dev replace wg-pia and wg0.
	PIADev, WG0Dev string
	// StandIn: no 8021q, so VLAN 50 and 49 become macvlans in vepa mode
	// on the trunk (vlan50, vlan49), which, like a VLAN link, never reach
	// their own macvlan children.
	StandIn bool
	// Node is the Node's name; Kubeconfig the node identity's file.
	Node, Kubeconfig string
	// Stub are the PIA stub's URLs and PEM files.
	ServerList, TokenURL, CAFile, ServerListKeyFile, WebCAFile string
	// Region is the stub's region.
	Region string
	// Hook is the port hook; HookEvery and HookTimeout its schedule.
	Hook                   string
	HookEvery, HookTimeout string
	// Endpoint is what clients dial (clients.endpoint).
	Endpoint string
}

// VLAN is the link standing for enp1s0.50 under p.
func (p ConfigParams) VLAN() string {
	if p.StandIn {
		return "vlan50"
	}
	return "enp1s0.50"
}

func (p ConfigParams) vlan49() string {
	if p.StandIn {
		return "vlan49"
	}
	return "enp1s0.49"
}

// HomelabConfig is the example homelab config with p's changes, as YAML.
// Everything else (the kill switch, the routing, the firewall, the labels,
// the checks) is the example's own, so the soak runs what users copy.
func HomelabConfig(example []byte, p ConfigParams) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(example, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", ExampleFile, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a mapping", ExampleFile)
	}
	root := doc.Content[0]
	rename := map[string]string{
		"wg-pia":                   p.PIADev,
		"wg0":                      p.WG0Dev,
		"enp1s0.50":                p.VLAN(),
		"enp1s0.49":                p.vlan49(),
		"wireguard/wg-pia/healthy": "wireguard/" + p.PIADev + "/healthy",
		"vpn.example.org:51820":    p.Endpoint,
	}
	walkScalars(root, func(n *yaml.Node) {
		if v, ok := rename[n.Value]; ok {
			n.Value = v
		} else if strings.HasPrefix(n.Value, "/etc/nodeagent/") {
			n.Value = filepath.Join(p.Dir, n.Value)
		}
	})

	// What the example leaves commented out as site-specific, the lab
	// has: the Ceph SAN's VLAN 49 (whose address and link the nemesis
	// deletes), the Gateway's VIP for checks.arpReachable, and wg-pia's
	// key from a file of the lab's.
	vlans := get(root, "vlans")
	if vlans == nil || vlans.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s: no vlans list", ExampleFile)
	}
	vlan49 := mapping("name", p.vlan49(), "parent", "enp1s0", "id", "49", "mtu", "1500")
	vlan49.Content = append(vlan49.Content, scalar("addresses"),
		&yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle, Content: []*yaml.Node{scalar("10.10.49.10/24")}})
	vlans.Content = append(vlans.Content, vlan49)
	set(root, "checks", &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{scalar("arpReachable"),
		{Kind: yaml.SequenceNode, Style: yaml.FlowStyle, Content: []*yaml.Node{scalar(vip)}}}})

	set(root, "node", mapping("name", p.Node))
	// DAD as the lab tests run it: one probe, 50 ms, 200 ms (the example's
	// three probes over 4 s would make every repair of a deleted address
	// wait for them).
	set(root, "dad", mapping("probes", "1", "interval", "50ms", "wait", "200ms"))
	if p.StandIn {
		vlans := get(root, "vlans")
		if vlans == nil || vlans.Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("%s: no vlans list", ExampleFile)
		}
		var standIns []*yaml.Node
		for _, v := range vlans.Content {
			m := mapping("name", scalarOf(get(v, "name")), "parent", scalarOf(get(v, "parent")), "mode", "vepa")
			if a := get(v, "addresses"); a != nil {
				m.Content = append(m.Content, scalar("addresses"), a)
			}
			m.HeadComment = "stands in for the VLAN (this kernel has no 8021q)"
			standIns = append(standIns, m)
		}
		del(root, "vlans")
		macvlans := get(root, "macvlans")
		if macvlans == nil {
			return nil, fmt.Errorf("%s: no macvlans list", ExampleFile)
		}
		// The VLANs first: the shim's parent is one of them.
		macvlans.Content = append(standIns, macvlans.Content...)
	}
	var pia, wg0 *yaml.Node
	if wgs := get(root, "wireguard"); wgs != nil {
		for _, w := range wgs.Content {
			switch scalarOf(get(w, "name")) {
			case p.PIADev:
				pia = get(w, "pia")
			case p.WG0Dev:
				wg0 = w
			}
		}
	}
	if pia == nil || wg0 == nil {
		return nil, fmt.Errorf("%s: no wg-pia with pia, or no wg0", ExampleFile)
	}
	for _, w := range get(root, "wireguard").Content {
		if scalarOf(get(w, "name")) == p.PIADev {
			set(w, "privateKeyFile", scalar(filepath.Join(p.Dir, "/etc/nodeagent/keys/wg-pia.key")))
		}
	}
	set(pia, "region", scalar(p.Region))
	for _, kv := range [][2]string{{"serverList", p.ServerList}, {"tokenURL", p.TokenURL}, {"caFile", p.CAFile},
		{"serverListKeyFile", p.ServerListKeyFile}, {"webCAFile", p.WebCAFile}} {
		set(pia, kv[0], scalar(kv[1]))
	}
	pf := get(pia, "portForward")
	if pf == nil {
		return nil, fmt.Errorf("%s: wg-pia has no portForward", ExampleFile)
	}
	set(pf, "onChange", &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle, Content: []*yaml.Node{scalar(p.Hook)}})
	set(pf, "every", scalar(p.HookEvery))
	set(pf, "hookTimeout", scalar(p.HookTimeout))
	if k := get(root, "kubernetes"); k != nil {
		set(k, "kubeconfig", scalar(p.Kubeconfig))
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return append([]byte("# "+ExampleFile+" as the soak runs it (testenv/soak)\n"), buf.Bytes()...), nil
}

func walkScalars(n *yaml.Node, fn func(*yaml.Node)) {
	switch n.Kind {
	case yaml.ScalarNode:
		fn(n)
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			walkScalars(n.Content[i], fn)
		}
	case yaml.SequenceNode, yaml.DocumentNode:
		for _, c := range n.Content {
			walkScalars(c, fn)
		}
	}
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

func scalarOf(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	return n.Value
}

// mapping is a flow mapping of the key, value pairs kv.
func mapping(kv ...string) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Content = append(m.Content, scalar(kv[i]), scalar(kv[i+1]))
	}
	return m
}

func get(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// set sets key in mapping m to v, keeping the key's place and comments
// when it is there.
func set(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			v.LineComment = m.Content[i+1].LineComment
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, scalar(key), v)
}

func del(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}
