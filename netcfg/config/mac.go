package config

import (
	"bytes"
	"net"
)

// ParseMAC parses a macvlan's mac: an EUI-48 address (aa:bb:cc:dd:ee:ff)
// that a link can have: unicast and not all zeros.
func ParseMAC(s string) (net.HardwareAddr, string) {
	mac, err := net.ParseMAC(s)
	switch {
	case err != nil || len(mac) != 6:
		return nil, "is not a MAC address like 02:00:5e:10:00:01"
	case mac[0]&0x01 != 0:
		return nil, "is a multicast address; a link's address is unicast (the low bit of the first byte clear)"
	case bytes.Equal(mac, make(net.HardwareAddr, 6)):
		return nil, "is all zeros"
	}
	return mac, ""
}

// macs checks each macvlan's mac, and that no two macvlans share one.
func (v *validator) macs(macvlans []Macvlan) {
	seen := map[string]string{}
	for i, x := range macvlans {
		if x.MAC == "" {
			continue
		}
		p := fieldPath(indexPath("macvlans", i), "mac")
		mac, why := ParseMAC(x.MAC)
		if why != "" {
			v.errorf(p, "%q %s", x.MAC, why)
			continue
		}
		if other, dup := seen[mac.String()]; dup {
			v.errorf(p, "%s is also %s's; two links on one wire cannot share an address", mac, other)
			continue
		}
		seen[mac.String()] = x.Name
	}
}
