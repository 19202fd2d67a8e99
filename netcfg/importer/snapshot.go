// Package importer reads a node set up the old way (VLANs and macvlans made
// by ip(8) in systemd units, WireGuard by wg-quick, policy routing by
// scripts) and writes a nodeagent config that takes it over: every object
// it names is adopted in place (adopt: true), never deleted and made again.
//
// It works in two steps. Read fills a Snapshot, a plain JSON-serialisable
// record of what the node has (links, addresses, WireGuard devices, rules,
// routes, table names, a few sysctls, wg-quick files and the systemd units
// that made things); Build, a pure function, turns a Snapshot into the
// config's YAML text (with comments for what it could not or should not
// import), the key and peer files the config names, and the switch-over
// steps. The golden tests feed Build snapshots from JSON.
//
// Nothing here runs ip, nft, wg or systemctl: the kernel is read over
// netlink and wgctrl, files under a root given by the caller (so tests
// point /etc at a directory of their own), opened without following links,
// fstat-checked and size-capped. No error or note quotes a file's
// contents; a hook line that is shown has anything shaped like a key
// replaced.
package importer

import "github.com/nodeagent/nodeagent/netcfg/owners"

// Snapshot is what a node has, as Read found it.
type Snapshot struct {
	// Links are the namespace's links, by name.
	Links []Link `json:"links"`
	// WireGuard are the kernel's WireGuard devices with their keys and
	// peers (empty without root: wgctrl needs CAP_NET_ADMIN).
	WireGuard []WGDevice `json:"wireguard,omitempty"`
	// Rules are every policy routing rule of both families.
	Rules []Rule `json:"rules,omitempty"`
	// Routes are the routes of every table but local.
	Routes []Route `json:"routes,omitempty"`
	// TableNames are the routing tables' names from
	// /etc/iproute2/rt_tables and rt_tables.d/*.conf, id to name (the
	// reserved tables' included when the files name them).
	TableNames map[int]string `json:"tableNames,omitempty"`
	// TableNameFiles says which file gave each name
	// (/etc/iproute2/rt_tables.d/x.conf); a name without one is taken as
	// nodeagent's own.
	TableNameFiles map[int]string `json:"tableNameFiles,omitempty"`
	// Sysctls are the values of the keys of SysctlKeys, in the config's
	// syntax (net.ipv4.conf.enp1s0/50.rp_filter).
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// WGQuick are the wg-quick files /etc/wireguard/*.conf, parsed.
	WGQuick []WGQuickFile `json:"wgQuick,omitempty"`
	// WGQuickUnits are the interfaces whose wg-quick@NAME.service is
	// enabled (linked from multi-user.target.wants).
	WGQuickUnits []string `json:"wgQuickUnits,omitempty"`
	// Units are the /etc/systemd/system/*.service files whose ExecStart
	// (or ExecStartPre/Post) runs ip link add, with the links they make.
	Units []Unit `json:"units,omitempty"`
	// Owners are the network configuration files (systemd-networkd,
	// netplan, ifupdown, NetworkManager) that make or configure the VLAN,
	// macvlan and WireGuard links.
	Owners []owners.Owner `json:"owners,omitempty"`
	// PIA is what PIA's manual-connections scripts left (their processes,
	// /opt/piavpn-manual, the units that run them), nil for none.
	PIA *PIAScripts `json:"pia,omitempty"`
	// Problems are what could not be read (not root, a file refused), one
	// line each, without any file's contents.
	Problems []string `json:"problems,omitempty"`
}

// Link is one link of the namespace.
type Link struct {
	Name string `json:"name"`
	// Kind is the link's IFLA_INFO_KIND: vlan, macvlan, wireguard, or
	// another (veth, bridge, bond, tun, ...); "" for a hardware link.
	Kind   string `json:"kind,omitempty"`
	Parent string `json:"parent,omitempty"`
	VLANID int    `json:"vlanID,omitempty"`
	// MacvlanMode is bridge, private, vepa, passthru or source.
	MacvlanMode string `json:"macvlanMode,omitempty"`
	MTU         int    `json:"mtu"`
	Up          bool   `json:"up"`
	Addresses   []Addr `json:"addresses,omitempty"`
	// Alias is the link's ifalias; nodeagent's links have "nodeagent".
	Alias string `json:"alias,omitempty"`
	Group uint32 `json:"group,omitempty"`
}

// Addr is an interface address.
type Addr struct {
	// Prefix is the address with its prefix length (10.10.50.1/24).
	Prefix string `json:"prefix"`
	// Scope is global, site, link or host.
	Scope string `json:"scope"`
	// Dynamic: the kernel does not hold it as permanent (DHCP's, SLAAC's,
	// or one with a lifetime).
	Dynamic bool `json:"dynamic,omitempty"`
}

// WGDevice is a kernel WireGuard device.
type WGDevice struct {
	Name string `json:"name"`
	// PrivateKey is the device's key in base64; empty when it could not
	// be read.
	PrivateKey string   `json:"privateKey,omitempty"`
	ListenPort int      `json:"listenPort,omitempty"`
	FwMark     int      `json:"fwMark,omitempty"`
	Peers      []WGPeer `json:"peers,omitempty"`
}

// WGPeer is one peer of a device (kernel or wg-quick file).
type WGPeer struct {
	PublicKey    string `json:"publicKey"`
	PresharedKey string `json:"presharedKey,omitempty"`
	// Endpoint is host:port; the kernel's is the address last seen.
	Endpoint            string   `json:"endpoint,omitempty"`
	AllowedIPs          []string `json:"allowedIPs,omitempty"`
	PersistentKeepalive int      `json:"persistentKeepalive,omitempty"`
	// NameHint is the comment line just above the [Peer] stanza of a
	// wg-quick file ("# alice's phone"), without the '#'.
	NameHint string `json:"nameHint,omitempty"`
}

// Rule is a policy routing rule.
type Rule struct {
	Priority int `json:"priority"`
	// Family is inet or inet6.
	Family string `json:"family"`
	// From and To are prefixes, "" for all.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	IIF  string `json:"iif,omitempty"`
	OIF  string `json:"oif,omitempty"`
	// FwMark is the mark as the config writes it: 0x10, or 0x10/0xff
	// with a mask other than 0xffffffff; "" for none.
	FwMark string `json:"fwMark,omitempty"`
	Table  int    `json:"table,omitempty"`
	// Action is table, goto, nop, blackhole, unreachable or prohibit.
	Action string `json:"action"`
	Invert bool   `json:"invert,omitempty"`
	// Extra names the selectors the config's rules do not have (uidrange,
	// ipproto, tos, ...): such a rule is not imported.
	Extra []string `json:"extra,omitempty"`
	// SuppressPrefixLength is nil for none.
	SuppressPrefixLength *int `json:"suppressPrefixLength,omitempty"`
	Protocol             int  `json:"protocol,omitempty"`
}

// Route is a route of a table other than local.
type Route struct {
	Table int `json:"table"`
	// To is a prefix, 0.0.0.0/0 or ::/0 for a default route.
	To string `json:"to"`
	// From is an IPv6 source-specific route's source prefix (`ip -6 route
	// add ... from P`), "" for none: such a route is never imported.
	From string `json:"from,omitempty"`
	Via  string `json:"via,omitempty"`
	Dev  string `json:"dev,omitempty"`
	Src  string `json:"src,omitempty"`
	// Metric is the route's priority (IPv6's default 1024 as the kernel
	// reports it).
	Metric int `json:"metric,omitempty"`
	// Scope is global, link, host, site or nowhere.
	Scope string `json:"scope"`
	// Type is unicast, unreachable, blackhole, prohibit, local, broadcast,
	// multicast, throw, ...
	Type     string `json:"type"`
	Protocol int    `json:"protocol"`
	OnLink   bool   `json:"onlink,omitempty"`
	// Extra names the attributes the config's routes do not have (mtu,
	// advmss, tos, realm, encap, ...): such a route is not imported.
	Extra []string `json:"extra,omitempty"`
	// Multipath: a route with several next hops (not imported).
	Multipath bool `json:"multipath,omitempty"`
}

// WGQuickFile is a wg-quick configuration /etc/wireguard/NAME.conf.
type WGQuickFile struct {
	// Name is the interface, the file's name without .conf.
	Name string `json:"name"`
	// PrivateKey is the [Interface]'s key; it is used only when the device
	// is not in the kernel (down).
	PrivateKey string `json:"privateKey,omitempty"`
	// Addresses are every Address line's entries, in order.
	Addresses []string `json:"addresses,omitempty"`
	DNS       []string `json:"dns,omitempty"`
	// Table is the Table line as written ("" when absent: auto).
	Table      string `json:"table,omitempty"`
	MTU        int    `json:"mtu,omitempty"`
	ListenPort int    `json:"listenPort,omitempty"`
	FwMark     string `json:"fwMark,omitempty"`
	SaveConfig bool   `json:"saveConfig,omitempty"`
	// Hooks are the PreUp, PostUp, PreDown and PostDown lines, in order.
	Hooks []Hook   `json:"hooks,omitempty"`
	Peers []WGPeer `json:"peers,omitempty"`
	// Problems are lines that could not be understood, by line number
	// only.
	Problems []string `json:"problems,omitempty"`
}

// Hook is one PreUp/PostUp/PreDown/PostDown line of a wg-quick file.
type Hook struct {
	// When is PreUp, PostUp, PreDown or PostDown.
	When    string `json:"when"`
	Command string `json:"command"`
}

// Unit is a systemd service that makes links with ip link add.
type Unit struct {
	// Name is the unit's file name (vlan50.service).
	Name string `json:"name"`
	// Links are the names of the links its ip link add commands make.
	Links []string `json:"links"`
}
