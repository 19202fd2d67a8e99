package owners

import (
	"fmt"
	"path/filepath"

	"gopkg.in/yaml.v3"
)

// netplan finds the entries of /etc/netplan/*.yaml that make the links
// (network: vlans:, and the other virtual kinds' sections), with their
// lines and the renderer (the entry's, else the file's network: one, else
// networkd).
func (r *reader) netplan() {
	dir := filepath.Join(r.etc, "netplan")
	for _, f := range r.list(dir, ".yaml", ".yml") {
		b, ok := r.read(f)
		if !ok {
			continue
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(b, &doc); err != nil || len(doc.Content) == 0 {
			if err != nil {
				r.problems = append(r.problems, r.nodePath(f)+": not YAML netplan reads")
			}
			continue
		}
		network := mapValue(doc.Content[0], "network")
		if network == nil {
			continue
		}
		renderer := "networkd"
		if v := mapValue(network, "renderer"); v != nil && v.Kind == yaml.ScalarNode {
			renderer = v.Value
		}
		for _, section := range []string{"vlans", "bridges", "bonds", "tunnels"} {
			sec, secKey := mapValue(network, section), mapKey(network, section)
			if sec == nil || sec.Kind != yaml.MappingNode {
				continue
			}
			for i := 0; i+1 < len(sec.Content); i += 2 {
				k, v := sec.Content[i], sec.Content[i+1]
				if !r.links[k.Value] {
					continue
				}
				o := Owner{Kind: Netplan, Link: k.Value, File: r.nodePath(f), Makes: true, Renderer: renderer,
					First: k.Line, Last: lastLine(v), Role: fmt.Sprintf("%s's entry under %s", k.Value, section)}
				if rv := mapValue(v, "renderer"); rv != nil {
					o.Renderer = rv.Value
				}
				if len(sec.Content) == 2 {
					// The section's only entry: its key goes too (an
					// empty section is not one netplan reads).
					o.First = secKey.Line
					o.Role = fmt.Sprintf("the %s section, %s's entry alone", section, k.Value)
				}
				r.out = append(r.out, o)
			}
		}
	}
}

// mapValue is the value of key in the mapping n, nil when absent.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// mapKey is the key node of key in the mapping n, nil when absent.
func mapKey(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i]
		}
	}
	return nil
}

// lastLine is the last line n's text reaches (the last line of its last
// descendant; a block scalar's own lines are not counted beyond its
// start).
func lastLine(n *yaml.Node) int {
	last := n.Line
	for _, c := range n.Content {
		last = max(last, lastLine(c))
	}
	return last
}
