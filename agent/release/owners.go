package release

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/nodeagent/nodeagent/netcfg/importer"
	"github.com/nodeagent/nodeagent/netcfg/owners"
)

// Owners are what would make the adopted objects again once nodeagent
// lets go of them, as the files under /etc say now: the old setup that
// nodeagent import took them from (its switch-over steps disable the
// units and retire the network configuration files; a way back enables
// or restores them).
type Owners struct {
	// WGQuick are the devices with a wg-quick file
	// (/etc/wireguard/NAME.conf), whose wg-quick@NAME makes the device
	// itself: `wg-quick up` fails while a device of its name exists.
	WGQuick map[string]WGQuick
	// Units are the services under /etc/systemd/system whose Exec lines
	// run `ip link add`, `ip route add` or `ip rule add`, each of which
	// fails while what it adds exists.
	Units []Unit
	// Files are the network configuration files that make or configure
	// the links (systemd-networkd, netplan, ifupdown, NetworkManager):
	// each of them takes an existing link over as it is.
	Files []owners.Owner
	// NodeagentEnabled: nodeagent.service is enabled, so the next boot
	// starts it, and it takes every object of the config over again.
	NodeagentEnabled bool
	// PIAUnits are the units that run PIA's manual-connections scripts
	// (the import read them, and its steps stopped them): they make the
	// old setup's PIA tunnel again.
	PIAUnits []string
	// DropIns are the drop-ins of other units that name nodeagent (the
	// k3s drop-in, 10-nodeagent.conf): their Wants= starts nodeagent again
	// with the unit, and their ExecStartPre waits for it.
	DropIns []string
	// Problems are files that could not be read (one line each, never a
	// file's contents).
	Problems []string
}

// WGQuick is a device's wg-quick file.
type WGQuick struct {
	File string
	// Enabled: multi-user.target wants wg-quick@NAME.
	Enabled bool
	// Peers are the public keys of its [Peer] stanzas.
	Peers map[string]bool
}

// Unit is one service that makes objects with ip(8).
type Unit struct {
	Name    string
	Enabled bool
	unitMakes
}

// maxUnit bounds a unit file read.
const maxUnit = 1 << 20

// maxUnits bounds the units read.
const maxUnits = 4096

// ReadOwners reads the owners of links (VLANs, macvlans) and devices
// (WireGuard) from etc, the directory that stands for /etc. Files are
// opened without following links and size-capped; what cannot be read is
// a problem, a missing file none.
func ReadOwners(etc string, links, devices []string) Owners {
	snap := importer.Snapshot{}
	for _, l := range links {
		snap.Links = append(snap.Links, importer.Link{Name: l, Kind: "vlan"})
	}
	for _, d := range devices {
		snap.Links = append(snap.Links, importer.Link{Name: d, Kind: "wireguard"})
	}
	importer.ReadFiles(etc, &snap)
	o := Owners{WGQuick: map[string]WGQuick{}, Files: snap.Owners, Problems: snap.Problems}
	if snap.PIA != nil {
		o.PIAUnits = snap.PIA.Units
	}
	for _, w := range snap.WGQuick {
		if !slices.Contains(devices, w.Name) {
			continue
		}
		q := WGQuick{File: filepath.Join("/etc/wireguard", w.Name+".conf"), Enabled: slices.Contains(snap.WGQuickUnits, w.Name), Peers: map[string]bool{}}
		for _, p := range w.Peers {
			q.Peers[p.PublicKey] = true
		}
		o.WGQuick[w.Name] = q
	}
	tables := map[string]int{}
	for id, name := range snap.TableNames {
		tables[name] = id
	}
	wants := filepath.Join(etc, "systemd", "system", "multi-user.target.wants")
	enabled := func(unit string) bool {
		_, err := os.Lstat(filepath.Join(wants, unit))
		return err == nil
	}
	o.NodeagentEnabled = enabled("nodeagent.service")
	dir := filepath.Join(etc, "systemd", "system")
	d, err := fsafe.OpenDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			o.Problems = append(o.Problems, fmt.Sprintf("/etc/systemd/system: cannot list: %v", err))
		}
		return o
	}
	defer d.Close()
	entries, err := d.ReadDir()
	if err != nil {
		o.Problems = append(o.Problems, fmt.Sprintf("/etc/systemd/system: cannot list: %v", err))
		return o
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasSuffix(e.Name(), ".service.d") && e.Name() != "nodeagent.service.d" {
			o.DropIns = append(o.DropIns, dropIns(filepath.Join(dir, e.Name()), &o.Problems)...)
		}
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".service") || strings.HasPrefix(name, ".") || !e.Type().IsRegular() {
			continue
		}
		if n++; n > maxUnits {
			o.Problems = append(o.Problems, fmt.Sprintf("/etc/systemd/system: more than %d units; the rest are not read", maxUnits))
			break
		}
		b, _, err := d.ReadFile(name, fsafe.Rules{MaxSize: maxUnit})
		if err != nil {
			o.Problems = append(o.Problems, strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		m := parseUnit(string(b), tables)
		if len(m.Links)+len(m.Routes)+len(m.Rules) > 0 {
			o.Units = append(o.Units, Unit{Name: name, Enabled: enabled(name), unitMakes: m})
		}
	}
	return o
}

// dropIns are the .conf files of the drop-in directory dir that name
// nodeagent, as /etc names them.
func dropIns(dir string, problems *[]string) []string {
	d, err := fsafe.OpenDir(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	entries, err := d.ReadDir()
	if err != nil {
		return nil
	}
	var out []string
	for i, e := range entries {
		if i == maxUnits {
			break
		}
		if !strings.HasSuffix(e.Name(), ".conf") || !e.Type().IsRegular() {
			continue
		}
		b, _, err := d.ReadFile(e.Name(), fsafe.Rules{MaxSize: maxUnit})
		if err != nil {
			*problems = append(*problems, strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		if strings.Contains(string(b), "nodeagent") {
			out = append(out, path.Join("/etc/systemd/system", filepath.Base(dir), e.Name()))
		}
	}
	return out
}
