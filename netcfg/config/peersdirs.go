package config

import (
	"path/filepath"
	"strings"
)

// peersDirs checks that every WireGuard device has a register of its own:
// no two peersDirs are one directory, and none is inside another's. A
// file in a shared directory would be a peer of both devices (and
// nodeagentctl peer add could not say which), and a register nested in
// another's is one an operator reads as part of it. Several devices use
// sibling directories: /etc/nodeagent/peers.d/wg0, /etc/nodeagent/peers.d/wg1.
func (v *validator) peersDirs(wgs []WireGuard) {
	type seen struct{ dir, path string }
	var dirs []seen
	for i, w := range wgs {
		if w.PeersDir == "" || !filepath.IsAbs(w.PeersDir) {
			continue // none, or refused by absPath already
		}
		p := fieldPath(indexPath("wireguard", i), "peersDir")
		dir := filepath.Clean(w.PeersDir)
		for _, d := range dirs {
			var how string
			switch {
			case d.dir == dir:
				how = "is also the peersDir of " + v.where(d.path) + " (a peer file there would be a peer of both)"
			case within(dir, d.dir):
				how = "is inside " + clipValue(d.dir) + ", the peersDir of " + v.where(d.path)
			case within(d.dir, dir):
				how = "holds " + clipValue(d.dir) + ", the peersDir of " + v.where(d.path)
			default:
				continue
			}
			v.errorf(p, "%s %s: each device needs a register of its own; give each a directory of its own, side by side (/etc/nodeagent/peers.d/DEVICE)",
				clipValue(w.PeersDir), how)
			break
		}
		dirs = append(dirs, seen{dir, p})
	}
}

// within reports whether dir is below parent (both clean and absolute).
func within(dir, parent string) bool {
	return strings.HasPrefix(dir, strings.TrimSuffix(parent, "/")+"/")
}
