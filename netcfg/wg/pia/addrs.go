package pia

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
)

// What a server's answer may decide, and what it may not. addKey's
// addresses become the device's address, the address probed through the
// tunnel and the target of the VLAN's DNS: none of them may be an address
// the node already uses for something else, or one that is not a unicast
// address on some network at all.

// MaxDNSServers bounds addKey's dns_servers (PIA hands out two).
const MaxDNSServers = 8

// maxCN bounds a cn (a DNS host name is at most 253 characters).
const maxCN = 253

// ValidCN reports whether cn is a DNS host name: dot-separated labels of
// letters, digits and hyphens, 1-63 characters each, no label starting or
// ending with a hyphen, at most 253 characters in all. A cn goes into a
// URL's host and the TLS name: anything else (a space, '%', '/', '?', ':',
// '@') would change what the URL says or where it goes.
func ValidCN(cn string) bool {
	if cn == "" || len(cn) > maxCN {
		return false
	}
	label := 0
	for i := 0; i < len(cn); i++ {
		c := cn[i]
		switch {
		case c == '.':
			if label == 0 || cn[i-1] == '-' {
				return false
			}
			label = 0
			continue
		case c == '-':
			if label == 0 {
				return false
			}
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	return label > 0 && cn[len(cn)-1] != '-'
}

var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// unicast4 reports why a is not an IPv4 unicast address a server may hand
// out ("" when it is): loopback, unspecified, multicast, the limited
// broadcast, link-local (169.254/16, where cloud metadata services
// answer) and the reserved 240/4 are not.
func unicast4(a netip.Addr) string {
	switch {
	case !a.Is4():
		return "not an IPv4 address"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsMulticast():
		return "multicast"
	case a == limitedBroadcast:
		return "broadcast"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.As4()[0] >= 240:
		return "reserved (240.0.0.0/4)"
	}
	return ""
}

// check reports what is wrong with r as a registration to run a device
// with, nil when nothing is: a server key of 32 bytes, a port, a server
// whose cn is a host name, every address a unicast IPv4 address, and no
// more than MaxDNSServers resolvers.
func (r Registration) check() error {
	if k, err := base64.StdEncoding.DecodeString(r.ServerKey); err != nil || len(k) != 32 {
		return errors.New("server_key is not valid")
	}
	if r.ServerPort < 1 || r.ServerPort > 65535 {
		return errors.New("server_port is not valid")
	}
	if !ValidCN(r.Server.CN) {
		return errors.New("the server's cn is not a host name")
	}
	for _, f := range []struct {
		name string
		a    netip.Addr
	}{{"server_ip", r.ServerIP}, {"server_vip", r.ServerVIP}, {"peer_ip", r.PeerIP}} {
		if why := unicast4(f.a); why != "" {
			return fmt.Errorf("%s is not valid (%s)", f.name, why)
		}
	}
	// The tunnel's own addresses must be distinct: a server_vip or
	// resolver that is peer_ip is the node itself (a probe answered
	// locally proves nothing; DNS "to PIA" goes to the node's resolver),
	// and one that is server_ip is outside the tunnel.
	if r.ServerVIP == r.PeerIP || r.ServerVIP == r.ServerIP || r.PeerIP == r.ServerIP {
		return errors.New("server_vip, peer_ip and server_ip are not three addresses")
	}
	if r.Server.IP != "" && r.ServerIP.String() != r.Server.IP {
		// The endpoint is the server of the signed list, as PIA's own
		// client takes it, never one an answer names.
		return fmt.Errorf("server_ip %s is not the listed server's %s", r.ServerIP, r.Server.IP)
	}
	if len(r.DNS) > MaxDNSServers {
		return fmt.Errorf("dns_servers lists %d resolvers, over the %d allowed", len(r.DNS), MaxDNSServers)
	}
	for _, d := range r.DNS {
		if why := unicast4(d); why != "" {
			return fmt.Errorf("dns_servers is not valid (%s: %s)", d, why)
		}
		if d == r.PeerIP || d == r.ServerIP {
			return fmt.Errorf("dns_servers is not valid (%s is the tunnel's own or the server's address)", d)
		}
	}
	return nil
}

// clash reports which of r's addresses inside the tunnel (peer_ip,
// server_vip, dns_servers) lies in one of reserved, the prefixes the node
// has or its config names; "" when none does. Such an address would take
// over the node's own (a resolver "in the tunnel" that is the node's VLAN
// address sends the VLAN's DNS to the node).
func (r Registration) clash(reserved []netip.Prefix) string {
	in := func(a netip.Addr) (netip.Prefix, bool) {
		for _, p := range reserved {
			if p.Contains(a) {
				return p, true
			}
		}
		return netip.Prefix{}, false
	}
	if p, ok := in(r.PeerIP); ok {
		return fmt.Sprintf("peer_ip %s lies in %s, which the node uses", r.PeerIP, p)
	}
	if p, ok := in(r.ServerVIP); ok {
		return fmt.Sprintf("server_vip %s lies in %s, which the node uses", r.ServerVIP, p)
	}
	for _, d := range r.DNS {
		if p, ok := in(d); ok {
			return fmt.Sprintf("dns_servers' %s lies in %s, which the node uses", d, p)
		}
	}
	return ""
}
