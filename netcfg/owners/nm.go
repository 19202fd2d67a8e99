package owners

import (
	"fmt"
	"path/filepath"
)

// networkManager finds the keyfile profiles that make the links: a
// profile of type vlan, macvlan or wireguard whose interface-name is the
// link (a vlan profile without one names its link parent.id).
func (r *reader) networkManager() {
	dir := filepath.Join(r.etc, "NetworkManager", "system-connections")
	for _, f := range r.list(dir) {
		b, ok := r.read(f)
		if !ok {
			continue
		}
		ini := parseINI(b)
		typ := ini.last("connection", "type")
		name := ini.last("connection", "interface-name")
		if name == "" && typ == "vlan" {
			if p, id := ini.last("vlan", "parent"), ini.last("vlan", "id"); p != "" && id != "" {
				name = p + "." + id
			}
		}
		if !r.links[name] {
			continue
		}
		r.out = append(r.out, Owner{Kind: NetworkManager, Link: name, File: r.nodePath(f), Makes: true,
			ID: ini.last("connection", "id"), UUID: ini.last("connection", "uuid"),
			Role: fmt.Sprintf("the %s profile that creates %s", typ, name)})
	}
}
