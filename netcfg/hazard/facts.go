package hazard

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"strconv"
	"strings"
)

// The sysfs name_assign_type and addr_assign_type values udev reads.
const (
	netNameUser   = 3 // NET_NAME_USER: named by whoever made it
	netAddrPerm   = 0 // NET_ADDR_PERM
	netAddrRandom = 1 // NET_ADDR_RANDOM
	netAddrStolen = 2 // NET_ADDR_STOLEN: a VLAN's, its parent's
	netAddrSet    = 3 // NET_ADDR_SET: given by whoever made it
)

// Predict is what networkd and udev see of a link nodeagent makes of that
// kind, with that name and address, as the kernel makes it: a VLAN's udev
// DEVTYPE is vlan and ethtool names its driver "802.1Q VLAN Support"; a
// macvlan has no DEVTYPE (so its Type= is ether, from ARPHRD_ETHER) and
// the macvlan driver; a WireGuard link's DEVTYPE is wireguard, its ARPHRD
// none, its driver wireguard, and it has no address. Neither a VLAN nor a
// macvlan has a permanent address: ethtool answers all zeros, which is
// what networkd and udev then hold as the permanent address. The name is
// the creator's (NET_NAME_USER); a VLAN's address is its parent's
// (stolen), a macvlan's the one nodeagent gives it (set).
func Predict(name, kind string, mac net.HardwareAddr) Link {
	l := Link{Name: name, Kind: kind, MAC: mac, NameAssignType: netNameUser}
	switch kind {
	case "vlan":
		l.IfType, l.DevType, l.Driver, l.AddrAssignType = 1, "vlan", "802.1Q VLAN Support", netAddrStolen
	case "macvlan":
		l.IfType, l.Driver, l.AddrAssignType = 1, "macvlan", netAddrSet
	case "wireguard":
		l.IfType, l.DevType, l.Driver, l.MAC = 65534, "wireguard", "wireguard", nil
	}
	if len(l.MAC) > 0 {
		l.PermMAC = make(net.HardwareAddr, len(l.MAC))
	}
	l.Props = map[string]string{"INTERFACE": name, "SUBSYSTEM": "net", "DEVPATH": "/devices/virtual/net/" + name}
	if l.DevType != "" {
		l.Props["DEVTYPE"] = l.DevType
	}
	if l.Driver != "" {
		l.Props["ID_NET_DRIVER"] = l.Driver
	}
	return l
}

// Observe completes l, a link with that ifindex, from what the kernel
// and udev say of it under p: its ARPHRD type, DEVTYPE and sysfs
// attributes, and its udev device's properties (the uevent's and the
// database's, /run/udev/data/nINDEX). Where the sysfs entry of that name
// is another link (this process's /sys is another network namespace's)
// l is kept as given.
func (p Paths) Observe(l Link, index int) Link {
	dir := p.path("sys/class/net", l.Name)
	if idx, err := readInt(dir + "/ifindex"); err != nil || idx != index {
		return l
	}
	if t, err := readInt(dir + "/type"); err == nil {
		l.IfType = uint16(t)
	}
	if v, err := readInt(dir + "/name_assign_type"); err == nil {
		l.NameAssignType = v
	}
	if v, err := readInt(dir + "/addr_assign_type"); err == nil {
		l.AddrAssignType = v
	}
	props := map[string]string{"SUBSYSTEM": "net"}
	if target, err := os.Readlink(dir); err == nil {
		if i := strings.Index(target, "/devices/"); i >= 0 {
			props["DEVPATH"] = target[i:]
		}
	}
	l.DevType = ""
	if b, err := os.ReadFile(dir + "/uevent"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				props[k] = v
			}
		}
		l.DevType = props["DEVTYPE"]
	}
	if db, err := os.ReadFile(p.path("run/udev/data", "n"+strconv.Itoa(index))); err == nil {
		var tags, current []string
		sc := bufio.NewScanner(bytes.NewReader(db))
		for sc.Scan() {
			line := sc.Text()
			if len(line) < 2 || line[1] != ':' {
				continue
			}
			v := line[2:]
			switch line[0] {
			case 'E':
				if k, val, ok := strings.Cut(v, "="); ok {
					props[k] = val
				}
			case 'I':
				props["USEC_INITIALIZED"] = v
			case 'G':
				tags = append(tags, v)
			case 'Q':
				current = append(current, v)
			}
		}
		if len(tags) > 0 {
			props["TAGS"] = ":" + strings.Join(tags, ":") + ":"
		}
		if len(current) > 0 {
			props["CURRENT_TAGS"] = ":" + strings.Join(current, ":") + ":"
		}
		if d := props["ID_NET_DRIVER"]; d != "" {
			l.Driver = d
		}
	}
	l.Props = props
	return l
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
