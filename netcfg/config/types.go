package config

import "time"

// Config is the whole of /etc/nodeagent/nodeagent.yaml.
type Config struct {
	// Node names this node.
	Node Node `yaml:"node"`
	// DAD is duplicate-address detection for the IPv4 addresses the
	// config assigns. Default: on.
	DAD DAD `yaml:"dad"`
	// Sysctls are network sysctls to set, key to value, in sysctl(8)
	// syntax: keys under net. only, '.' between segments and '/' for a '.'
	// inside a segment (net.ipv4.conf.enp1s0/50.rp_filter), '*' in a
	// segment for every entry there (net.ipv6.conf.*.forwarding); values
	// are strings, not empty, without a line break. A key that already
	// has its value is not written. A key removed from the config, and
	// teardown, leave the value as it is. Default: none.
	Sysctls map[string]string `yaml:"sysctls"`
	// VLANs are the 802.1Q sub-interfaces to create. Default: none.
	VLANs []VLAN `yaml:"vlans"`
	// Macvlans are the macvlan host shims to create. Default: none.
	Macvlans []Macvlan `yaml:"macvlans"`
	// WireGuard is the WireGuard interfaces to create, with their peers.
	// Default: none.
	WireGuard []WireGuard `yaml:"wireguard"`
	// Routing is the routing tables, their routes, and the policy rules.
	Routing Routing `yaml:"routing"`
	// Firewall is nodeagent's own nftables table, inet nodeagent: absent
	// while this section declares nothing.
	Firewall Firewall `yaml:"firewall"`
	// Kubernetes is the labels nodeagent keeps on this node's Node object.
	// Default: no labelling.
	Kubernetes Kubernetes `yaml:"kubernetes"`
	// Checks are the probes reported as conditions and run around every
	// change (safe apply).
	Checks Checks `yaml:"checks"`
	// Gateway is a role one node of several holds at a time, elected by a
	// Kubernetes Lease and fenced on the wire. Default: none.
	Gateway *Gateway `yaml:"gateway"`

	// File is the path the config was read from; it prefixes every error.
	File string `yaml:"-"`
	// Lines maps each field path written in the file to its line, for
	// what reports on the config after parsing (netcfg/lint); nil for a
	// config built in code.
	Lines Lines `yaml:"-"`
}

// Node identifies this node.
type Node struct {
	// Name is the node's name, a lowercase DNS subdomain of at most 253
	// characters; the Node object it labels has it. Default: the hostname.
	Name string `yaml:"name"`
}

// DAD configures RFC 5227 duplicate-address detection before an IPv4
// address is claimed, and the gratuitous ARP announcements after it.
type DAD struct {
	// Disabled turns probing and announcing off. Default: false.
	Disabled bool `yaml:"disabled"`
	// Probes is how many ARP probes are sent (RFC 5227 PROBE_NUM), 1-10.
	// Default: 3.
	Probes int `yaml:"probes"`
	// Interval is the gap between probes, 1ms-10s. Default: 1s.
	Interval time.Duration `yaml:"interval"`
	// Wait is how long to listen for an answer after the last probe
	// (RFC 5227 ANNOUNCE_WAIT), 1ms-10s. Default: 2s.
	Wait time.Duration `yaml:"wait"`
	// Announcements is how many gratuitous ARPs follow a claim, 0-10; 0
	// written out sends none. Default: 2.
	Announcements int `yaml:"announcements"`
}

// VLAN is an 802.1Q sub-interface on a trunk.
type VLAN struct {
	// Name is the interface name (required): at most 15 bytes, no '/',
	// ':' or whitespace, unique among the links of the config, such as
	// enp1s0.50.
	Name string `yaml:"name"`
	// Parent is the trunk the VLAN is tagged on (required): a link of the
	// node, or a VLAN or macvlan of the config; not a WireGuard interface.
	// While it does not exist the VLAN is pending (see nodeagent(8)).
	Parent string `yaml:"parent"`
	// ID is the 802.1Q VLAN id (required), 1-4094, unique on its parent.
	ID int `yaml:"id"`
	// MTU is the link's MTU, 68-65535, at most the parent's when the
	// config sets both. Default: 0, the kernel's choice (the parent's).
	MTU int `yaml:"mtu"`
	// Up is whether the link is administratively up. Default: true.
	Up *bool `yaml:"up"`
	// Addresses are the link's addresses with their prefix lengths
	// (10.10.50.1/24, fd00:50::1/64), each unique in the config; IPv4 ones
	// are probed first (see dad). Default: none.
	Addresses []string `yaml:"addresses"`
	// Adopt takes over an existing link of this name that nodeagent did not
	// create (it is marked as nodeagent's from then on). Default: false,
	// and such a link is a conflict left alone.
	Adopt bool `yaml:"adopt"`
}

// Macvlan is a host shim so the host can reach its own macvlan pods. The
// pods' gateway belongs on the shim, not on its parent: a macvlan pod never
// reaches its parent link's addresses.
type Macvlan struct {
	// Name is the interface name (required): at most 15 bytes, no '/',
	// ':' or whitespace, unique among the links of the config.
	Name string `yaml:"name"`
	// Parent is the link the shim sits on (required): the trunk, a VLAN, or
	// another macvlan, which the kernel reads as that macvlan's own parent
	// (the shim is made beside it, and shows that parent); not a WireGuard
	// interface.
	Parent string `yaml:"parent"`
	// Mode is the macvlan mode: one of bridge, private, vepa, passthru (a
	// passthru macvlan must be the only one on its parent). Default:
	// bridge.
	Mode string `yaml:"mode"`
	// MTU is the link's MTU, 68-65535, at most the parent's when the
	// config sets both. Default: 0, the kernel's choice (the parent's).
	MTU int `yaml:"mtu"`
	// Up is whether the link is administratively up. Default: true.
	Up *bool `yaml:"up"`
	// Addresses are the link's addresses with their prefix lengths, each
	// unique in the config: the pods' gateway belongs here. Default: none.
	Addresses []string `yaml:"addresses"`
	// Adopt takes over an existing link of this name that nodeagent did not
	// create. Default: false, and such a link is a conflict left alone.
	Adopt bool `yaml:"adopt"`
	// MAC is the link's hardware address, like 02:00:5e:10:00:01: unicast,
	// not all zeros, unique among the macvlans. The link is made with it
	// and kept at it. Default: an address derived from the machine id, the
	// network namespace and the link's name (locally administered), the
	// same at every restart and re-create, given when the link is made
	// and then left as it is.
	MAC string `yaml:"mac"`
}

// WireGuard is one WireGuard interface.
type WireGuard struct {
	// Name is the interface name (required): at most 15 bytes, no '/',
	// ':' or whitespace, unique among the links of the config, such as
	// wg0.
	Name string `yaml:"name"`
	// PrivateKeyFile is the absolute path of the file holding the
	// device's private key, as wg genkey writes it: a regular file owned by
	// root, readable by root only (chmod 600). Required, except on a PIA
	// device: left out there, nodeagent generates a key and keeps it under
	// /var/lib/nodeagent/pia/.
	PrivateKeyFile string `yaml:"privateKeyFile"`
	// ListenPort is the UDP port the device listens on, 0-65535. Default:
	// 0, a port the kernel picks. Not allowed on a PIA device.
	ListenPort int `yaml:"listenPort"`
	// FwMark is the firewall mark put on the device's own encrypted
	// packets, 0-4294967295, for rules that route them. Default: 0, none.
	FwMark int `yaml:"fwMark"`
	// MTU is the device's MTU, 68-65535. Default: 1420.
	MTU int `yaml:"mtu"`
	// Addresses are the device's addresses with their prefix lengths
	// (10.90.0.1/24), each unique in the config. Default: none. Not allowed
	// on a PIA device, whose address PIA gives.
	Addresses []string `yaml:"addresses"`
	// Implementation is where the device runs: one of auto, kernel (a
	// kernel wireguard link), userspace (wireguard-go inside the daemon,
	// over TUN). Default: auto, the kernel's when it has WireGuard.
	Implementation string `yaml:"implementation"`
	// PeersDir is the absolute path of a directory of peer files, one per
	// peer: YAML (*.yaml, *.yml; the fields of peers) or a wg-quick [Peer]
	// stanza (*.conf), read again when a file changes, so adding, changing
	// or removing a file changes that one peer. A file that does not parse
	// is skipped and reported. Default: none. Not allowed on a PIA device.
	PeersDir string `yaml:"peersDir"`
	// Adopt takes over an existing WireGuard device of this name that
	// nodeagent did not create (wg-quick's, say): it is marked, and its
	// peers converge to the config's and the peersDir's from then on.
	// Default: false, and such a device is a conflict left alone.
	Adopt bool `yaml:"adopt"`
	// Peers are the device's peers written in the config, beside those of
	// peersDir. Default: none. Not allowed on a PIA device.
	Peers []WGPeer `yaml:"peers"`
	// PIA makes the device a Private Internet Access tunnel. Default: none.
	PIA *PIA `yaml:"pia"`
	// Clients is what `nodeagentctl peer add` writes into the clients'
	// wg-quick configs: where they dial, what they route
	// into the tunnel, their DNS, and the pools whose internet leaves by
	// another device. Needs addresses and peersDir. Default: none, and
	// peer add refuses the device.
	Clients *Clients `yaml:"clients"`
}

// Clients is a remote-access device's clients, as `nodeagentctl peer
// add` makes them.
type Clients struct {
	// Endpoint is the address clients dial (required): host:port, the
	// name or address the router forwards to this device's listenPort,
	// like vpn.example.org:51820.
	Endpoint string `yaml:"endpoint"`
	// AllowedIPs are the prefixes a client sends into the tunnel unless it
	// is added with --full-tunnel (0.0.0.0/0, ::/0): the LAN behind the
	// node, like [10.90.0.0/24, 192.168.2.0/24]. Default: the device's own
	// subnets.
	AllowedIPs []string `yaml:"allowedIPs"`
	// DNS are the resolvers a client uses while the tunnel is up (its
	// wg-quick DNS line), addresses. Default: none, the client keeps its
	// own.
	DNS []string `yaml:"dns"`
	// PersistentKeepalive is the client's keepalive towards the node in
	// seconds, 0-65535 (0: off), which keeps a phone behind NAT reachable.
	// Default: 25.
	PersistentKeepalive *int `yaml:"persistentKeepalive"`
	// Egress are pools of the device's subnet whose clients' internet
	// leaves by another device (a PIA tunnel) under its kill switch:
	// `peer add --full-tunnel --via DEVICE` takes an address from the
	// pool. The config must route the pool as it routes a VLAN through
	// the tunnel (a rule from it to a killSwitch table with a default
	// route by via, a firewall.killSwitch for it allowing out via, a
	// masquerade out via); other clients never get an address in a pool.
	// Default: none.
	Egress []ClientEgress `yaml:"egress"`
}

// ClientEgress is a pool of a remote-access device's clients whose
// internet leaves by another device.
type ClientEgress struct {
	// Via is the device the pool's internet leaves by (required): a PIA
	// device of this config.
	Via string `yaml:"via"`
	// Pool is the IPv4 prefix of the pool (required), host bits zero,
	// inside one of the device's subnets; pools do not overlap. Its
	// clients get no IPv6 address (PIA carries IPv4 only).
	Pool string `yaml:"pool"`
	// DNS, when set, replaces clients.dns for the pool's clients (PIA's
	// resolvers are reached through pia.dns.for). Default: clients.dns.
	DNS []string `yaml:"dns"`
}

// WGPeer is one WireGuard peer, listed in a device's peers or read from a
// file in its peersDir.
type WGPeer struct {
	// Name is the peer's name in status and logs. Default: in a peersDir,
	// the file's name without its extension (alice.yaml is alice); in
	// peers, the start of the public key.
	Name string `yaml:"name"`
	// Description is free text for the operator, such as whose device
	// this is; nodeagent does not use it. Default: empty.
	Description string `yaml:"description"`
	// PublicKey is the peer's public key (required), as wg pubkey prints
	// it: 44 characters of base64 ending in '='; unique on the device.
	PublicKey string `yaml:"publicKey"`
	// PresharedKeyFile is the absolute path of a file holding a preshared
	// key (wg genpsk), owned by root and readable by root only. Default:
	// none.
	PresharedKeyFile string `yaml:"presharedKeyFile"`
	// Endpoint is where the peer is reached, host:port with a port
	// 1-65535 ([addr]:port for IPv6); a host name is resolved when the peer
	// is configured. Default: none, the peer connects to this device.
	Endpoint string `yaml:"endpoint"`
	// AllowedIPs are the prefixes (10.90.0.2/32, host bits zero) routed to
	// the peer and accepted from it; a prefix belongs to one peer of the
	// device only. Default: none.
	AllowedIPs []string `yaml:"allowedIPs"`
	// PersistentKeepalive is the interval of keepalive packets in seconds,
	// 0-65535, for a peer behind NAT. Default: 0, off.
	PersistentKeepalive int `yaml:"persistentKeepalive"`
	// Disabled keeps the peer out of the device while it stays written
	// (`nodeagentctl peer disable`); status and `nodeagentctl peers` list
	// it as disabled. Default: false.
	Disabled bool `yaml:"disabled"`
	// Expires is when the peer leaves the device, RFC 3339
	// (2027-01-31T18:00:00Z): from then on it is kept out, as a disabled
	// peer is, through every resync and restart, and listed as expired
	// (`nodeagentctl peer add --expires 30d` writes it). Default: never.
	Expires string `yaml:"expires"`
}

// PIA configures the Private Internet Access provider for a tunnel: the
// device's peer, address, endpoint and keepalive come from PIA's addKey,
// so peers, peersDir, addresses and listenPort are not allowed beside it.
// Its state (the registration, the token, the cached server list and, when
// privateKeyFile is empty, the device's key) is kept under the state
// directory, /var/lib/nodeagent/pia/.
type PIA struct {
	// Region is a region id of PIA's server list (nl_amsterdam; lower-case
	// letters, digits, '_' and '-', at most 64) or auto (required): auto is
	// the region whose first meta server answers a TCP connect soonest
	// (among regions with port forwarding when portForward is set).
	Region string `yaml:"region"`
	// CredentialsFile is the absolute path of the file holding the account
	// (required), in the one format nodeagent reads every credentials file
	// in (the shipped port hooks' --credentials too): username=NAME and
	// password=SECRET lines, two bare lines (the username, then the
	// password), or YAML {username: ..., password: ...}. It must be owned
	// by root and readable by root only (chmod 600). Never logged.
	CredentialsFile string `yaml:"credentialsFile"`
	// PortForward asks PIA for a forwarded port (regions that have it),
	// keeps it bound and delivers it. "portForward: true" is short for
	// {enabled: true}. Default: no port.
	PortForward PortForward `yaml:"portForward"`
	// DNS sends the DNS of some sources to PIA's resolvers through the
	// tunnel. Default: none.
	DNS PIADNS `yaml:"dns"`
	// ServerList is the https URL of PIA's signed server list; default
	// https://serverlist.piaservers.net/vpninfo/servers/v6.
	ServerList string `yaml:"serverList"`
	// TokenURL is the https URL of PIA's token endpoint, used when no meta
	// server gives a token; default
	// https://www.privateinternetaccess.com/api/client/v2/token.
	TokenURL string `yaml:"tokenURL"`
	// CAFile is the absolute path of the root (PEM) that PIA's meta and
	// WireGuard servers' certificates must lead to; default PIA's own
	// RSA-4096 root, built in.
	CAFile string `yaml:"caFile"`
	// ServerListKeyFile is the absolute path of the RSA public key (PEM)
	// the server list must be signed with; default PIA's own, built in.
	ServerListKeyFile string `yaml:"serverListKeyFile"`
	// WebCAFile is the absolute path of the roots (PEM) for the token and
	// list hosts; default the system's roots (they use the public web PKI).
	WebCAFile string `yaml:"webCAFile"`
}

// PortForward is a PIA tunnel's forwarded port.
type PortForward struct {
	// Enabled asks for the port. Default: false.
	Enabled bool `yaml:"enabled"`
	// To, when set, DNATs the forwarded port (TCP and UDP) arriving on the
	// tunnel to this IPv4 address, which must sit in a subnet routed
	// through this tunnel's kill-switch table (a pod on the VLAN). Needs
	// enabled. Default: none, the port is only reported.
	To string `yaml:"to"`
	// ToPort is the port the forwarded traffic is sent to at the address
	// of to, 0-65535; it needs to. Default: 0, the forwarded port's own
	// number.
	ToPort int `yaml:"toPort"`
	// OnChange is a command (argv, no shell; the first word an absolute
	// path to a file root owns, executable and not writable by group or
	// others, outside /home, /root, /tmp and /var/tmp, which the unit's
	// sandbox hides) that delivers the port: run for each new bound port,
	// and when the port is lost (no good bind for 15 min), until it exits
	// 0, retried after 5 s doubling to 5 min, and again every every with
	// the current port. Exit 77 says the client refused its credentials
	// or banned the node: the next attempt is 15 min later at the
	// earliest, and after 3 in a row none until `nodeagentctl port
	// --retry` or a reload. Its environment is only PATH,
	// LC_ALL=C.UTF-8, NODEAGENT_PIA_DEVICE, NODEAGENT_PIA_PORT (the port;
	// 0 once lost), NODEAGENT_PIA_PREVIOUS_PORT and
	// NODEAGENT_PIA_PORT_LOST (1 or 0); it runs in its own process group,
	// killed whole at hookTimeout and when the daemon stops; the first 4
	// KiB of its output are logged. The PortDelivered condition says
	// whether it took the current port (False, which degrades the node,
	// while it fails). The package ships
	// qbittorrent-port and transmission-port. Default: none.
	OnChange []string `yaml:"onChange"`
	// Every is how often onChange runs again after a success, with the
	// current port, so a client that lost it is put right: 5s-24h, or 0
	// for never (only on a change). Needs onChange. Default: 5m.
	Every *time.Duration `yaml:"every"`
	// HookTimeout bounds one onChange run, 1s-10m; at it the hook's
	// whole process group is killed and the run counts as failed. Needs
	// onChange. Default: 30s.
	HookTimeout time.Duration `yaml:"hookTimeout"`
}

// shorthand lets "portForward: true" stand for {enabled: true}.
func (PortForward) shorthand() string { return "enabled" }

// PIADNS is DNS sent to PIA's resolvers.
type PIADNS struct {
	// For lists IPv4 sources whose DNS (UDP and TCP port 53, to any
	// address, the node's own included) is DNATed to the first answering
	// of PIA's resolvers (addKey's dns_servers), so it leaves only through
	// the tunnel, and is dropped while the tunnel is down. The node's own
	// DNS is left alone. Each prefix must lie within a source that
	// routing.rules send to this device's kill-switch table. IPv6 DNS to
	// the node from the links holding these sources is dropped. Default:
	// none.
	For []string `yaml:"for"`
}

// Routing is policy routing: tables with routes, and rules.
type Routing struct {
	// Tables are the routing tables nodeagent fills. Default: none.
	Tables []Table `yaml:"tables"`
	// Rules are the policy routing rules. Default: none.
	Rules []Rule `yaml:"rules"`
}

// Table is one routing table.
type Table struct {
	// ID is the table's number (required), 1-4294967295, unique; not 253,
	// 254 or 255 (default, main, local), which exist already.
	ID int `yaml:"id"`
	// Name is the table's name for ip(8), written to
	// /etc/iproute2/rt_tables.d/nodeagent.conf: letters, digits, '-' and
	// '_', not all digits, unique, not a reserved table's name. Default:
	// none, ip shows the number.
	Name string `yaml:"name"`
	// KillSwitch adds unreachable default routes (IPv4 and IPv6) at the
	// highest metric, 4294967295, so traffic this table routes never falls
	// through to another table while its own default route is gone (the
	// tunnel is down). Default: false.
	KillSwitch bool `yaml:"killSwitch"`
	// Routes are the table's routes. Default: none.
	Routes []Route `yaml:"routes"`
}

// Route is one route in a table.
type Route struct {
	// To is the destination (required): a prefix with its host bits zero
	// (10.10.50.0/24), or default (0.0.0.0/0, or ::/0 when via or src is
	// IPv6). Unique in the table with its metric.
	To string `yaml:"to"`
	// Via is the gateway's address, of the same family as to. Default:
	// none, the destination is on the link of dev.
	Via string `yaml:"via"`
	// Dev is the interface the route leaves by. A unicast route needs via,
	// dev or both; the other types take neither. Default: none.
	Dev string `yaml:"dev"`
	// Src is the preferred source address, of the same family as to.
	// Default: none, the kernel's choice.
	Src string `yaml:"src"`
	// Metric is the route's priority, 0-4294967295, lower first. Default:
	// 0 (for IPv6 the kernel's 1024).
	Metric int `yaml:"metric"`
	// Scope is one of global, link, host. Default: link for a unicast
	// route without via, global otherwise (and always for IPv6).
	Scope string `yaml:"scope"`
	// Type is one of unicast, unreachable, blackhole, prohibit. Default:
	// unicast.
	Type string `yaml:"type"`
	// OnLink takes the gateway as reachable on dev even when no prefix of
	// the link covers it. Default: false.
	OnLink bool `yaml:"onlink"`
	// Adopt takes over a route with this route's key (table, to, metric)
	// that nodeagent did not make (a script's, say): it is replaced in
	// place with nodeagent's protocol, never deleted first. Default:
	// false, and such a route is a conflict left alone.
	Adopt bool `yaml:"adopt"`
}

// Rule is one policy routing rule.
type Rule struct {
	// Priority is the rule's place (required), 1-4294967295, lower first,
	// unique; 0 is the kernel's rule for the local table.
	Priority int `yaml:"priority"`
	// From matches the source: a prefix with its host bits zero, or all
	// (also default). Default: all. A rule whose from and to are both all
	// is installed for IPv4 and IPv6.
	From string `yaml:"from"`
	// To matches the destination: a prefix of the same family as from, or
	// all (also default). Default: all.
	To string `yaml:"to"`
	// IIF matches the interface a packet came in by (lo for the node's own
	// traffic). Default: any.
	IIF string `yaml:"iif"`
	// OIF matches the interface a socket is bound to. Default: any.
	OIF string `yaml:"oif"`
	// FwMark matches the firewall mark: a number (16), hex (0x10), and an
	// optional mask (0x10/0xff). Default: any mark; without a mask,
	// 0xffffffff.
	FwMark string `yaml:"fwMark"`
	// Table is the table a matching packet is looked up in: one declared in
	// routing.tables, by its id or its name, or main (254), default (253) or
	// local (255), by number or name. Required for the action table; the
	// other actions take none.
	Table int `yaml:"table"`
	// SuppressPrefixLength is a prefix length, 0-128: a result of the
	// table whose prefix length is this or shorter is ignored (0 ignores
	// its default route), so that the next rule decides. Default: none.
	SuppressPrefixLength *int `yaml:"suppressPrefixLength"`
	// Action is what a match does: one of table (look up table),
	// unreachable, blackhole, prohibit. Default: table.
	Action string `yaml:"action"`
	// Invert makes the rule match what its selectors do not (ip rule
	// not). Default: false.
	Invert bool `yaml:"invert"`
	// Adopt takes over a rule just like this one that nodeagent did not
	// make: nodeagent's rule is added at the same priority before the
	// old one is deleted, so the match never lapses. Default: false, and
	// the old rule stays beside nodeagent's.
	Adopt bool `yaml:"adopt"`
}

// Firewall is nodeagent's own nftables ruleset.
type Firewall struct {
	// Masquerade rewrites the source of traffic leaving by an interface to
	// that interface's address. Default: none.
	Masquerade []Masquerade `yaml:"masquerade"`
	// SNAT rewrites the source of traffic leaving by an interface to a
	// fixed address. Default: none.
	SNAT []SNAT `yaml:"snat"`
	// Forward accepts forwarded traffic between two interfaces in
	// nodeagent's own chain, plus established and related traffic. An
	// accept there does not override a drop in another table. Default:
	// none.
	Forward []ForwardAccept `yaml:"forward"`
	// KillSwitch confines forwarded traffic from a prefix to the
	// interfaces it may leave by. Default: none.
	KillSwitch []KillSwitch `yaml:"killSwitch"`
	// MSSClamp lists interfaces whose forwarded TCP SYNs, in and out, get
	// their MSS lowered to what the route's MTU allows (a tunnel's, say);
	// each interface once. Default: none.
	MSSClamp []string `yaml:"mssClamp"`
}

// Masquerade is a masquerade rule: the source of traffic from the prefix
// from leaving by the interface out becomes out's address. Each pair of
// from and out once.
type Masquerade struct {
	// From is the source prefix (required), host bits zero.
	From string `yaml:"from"`
	// Out is the interface the traffic leaves by (required).
	Out string `yaml:"out"`
}

// SNAT is a source NAT rule: the source of traffic from the prefix from
// leaving by the interface out becomes the address to. Each pair of from
// and out once, and not also masqueraded.
type SNAT struct {
	// From is the source prefix (required), host bits zero.
	From string `yaml:"from"`
	// Out is the interface the traffic leaves by (required).
	Out string `yaml:"out"`
	// To is the new source address (required), of the same family as
	// from.
	To string `yaml:"to"`
}

// ForwardAccept is a forward accept: traffic coming in by the interface
// in and leaving by the interface out is accepted. Each pair once.
type ForwardAccept struct {
	// In is the interface the traffic comes in by (required).
	In string `yaml:"in"`
	// Out is the interface the traffic leaves by (required).
	Out string `yaml:"out"`
}

// KillSwitch is a kill switch: forwarded traffic from the prefix from
// leaves only by the interfaces of allowOut, and so do the ICMP errors the
// node itself sends about that traffic (they quote its headers): those may
// otherwise go back to the prefix only.
type KillSwitch struct {
	// From is the source prefix (required), host bits zero; one kill
	// switch per prefix.
	From string `yaml:"from"`
	// AllowOut are the interfaces the traffic may leave by (required, at
	// least one), such as the tunnel.
	AllowOut []string `yaml:"allowOut"`
	// AllowTo are destination prefixes the traffic may reach by any
	// interface: the LAN behind the node, for remote-access clients whose
	// internet leaves by the tunnel. Host bits zero. Default: none.
	AllowTo []string `yaml:"allowTo"`
}

// Kubernetes configures Node labelling.
type Kubernetes struct {
	// Kubeconfig is the credentials to label with. Default: the k3s
	// kubelet's, so nodeagent acts as system:node:<name> and the Node
	// authorizer and NodeRestriction confine it to its own Node; inside a
	// pod with no kubeconfig, the in-cluster service account. An absolute
	// path.
	Kubeconfig string `yaml:"kubeconfig"`
	// Labels are labels kept on the Node, key to value. A key is
	// [prefix/]name (a lowercase DNS subdomain, then at most 63
	// alphanumerics, '-', '_' or '.'), and must be one the node may set on
	// itself: not under kubernetes.io or k8s.io but for the kubelet's own
	// labels and node.kubernetes.io, never node-restriction.kubernetes.io
	// (use a prefix of your own, like homelab.example/). A value is at
	// most 63 characters of the same kind, or empty. Default: none.
	Labels map[string]string `yaml:"labels"`
	// ConditionalLabels are labels kept on the Node while a condition
	// holds. Default: none.
	ConditionalLabels []ConditionalLabel `yaml:"conditionalLabels"`
	// AdoptLabels are label keys nodeagent takes over when another field
	// manager (kubectl label, another controller) owns them on the Node:
	// each a key of labels or of conditionalLabels, each once. In one
	// write that never removes the label, the other managers' claims are
	// dropped and nodeagent becomes its only owner; then nodeagent's value
	// is set, and the label leaves the Node when it leaves the config.
	// Default: none, and a label another manager owns with another value is
	// left as it is (LabelsSynced says Conflict).
	AdoptLabels []string `yaml:"adoptLabels"`
	// Hold is how long a conditional label's condition must hold, or
	// fail, before the label follows it, 0s-1h (0 follows at once), so a
	// flapping tunnel does not churn the scheduler. Default: 30s.
	Hold time.Duration `yaml:"hold"`
}

// Enabled reports whether the config asks for Node labelling at all: a
// kubeconfig, a label or a conditional label. A node with nothing to
// label that still wants the status annotations names its kubeconfig.
func (k Kubernetes) Enabled() bool {
	return k.Kubeconfig != "" || len(k.Labels) > 0 || len(k.ConditionalLabels) > 0
}

// ConditionalLabel is a label present on the Node only while its
// condition, when, holds.
type ConditionalLabel struct {
	// Key is the label's key (required), as in labels, and not also a
	// static label; each key once.
	Key string `yaml:"key"`
	// Value is the label's value (required), as in labels.
	Value string `yaml:"value"`
	// When is the condition (required): wireguard/<interface>/healthy (the
	// device exists and has no peers or a live one), vlan/<name>/up,
	// checks/arp-reachable or converged; the interface or VLAN must be
	// declared, and arp-reachable needs checks.arpReachable.
	When string `yaml:"when"`
}

// Checks are probes the node must pass. The daemon runs them every resync
// and reports them as conditions, and safe apply runs them around every
// change that touches links, routes, rules, nftables or WireGuard devices:
// a probe that passed before a change and fails after it rolls the change
// back.
type Checks struct {
	// ARPReachable are IPv4 addresses the node must resolve by ARP (the
	// VIPs it announces, say), each once. Default: none.
	ARPReachable []string `yaml:"arpReachable"`
	// APIServer is host:port (port 1-65535) of the Kubernetes API server,
	// probed with a TCP connect. Default: the server of
	// kubernetes.kubeconfig, if it can be read.
	APIServer string `yaml:"apiServer"`
	// GatewayARP probes the main table's IPv4 default gateway by ARP.
	// Default: true.
	GatewayARP *bool `yaml:"gatewayARP"`
	// SafeApply turns the probe-and-roll-back around changes on or off.
	// Default: true.
	SafeApply *bool `yaml:"safeApply"`
	// ProbeDeadline is how long a probe may take to pass again after a
	// change before the change is rolled back, 100ms-5m. Default: 10s.
	ProbeDeadline time.Duration `yaml:"probeDeadline"`
}

// SafeApplyOn reports whether safe apply is on.
func (c Checks) SafeApplyOn() bool { return upOrDefault(c.SafeApply) }

// GatewayARPOn reports whether the default gateway is probed.
func (c Checks) GatewayARPOn() bool { return upOrDefault(c.GatewayARP) }

// UpOrDefault reports whether the link should be administratively up.
func upOrDefault(p *bool) bool { return p == nil || *p }

// IsUp reports whether the VLAN should be administratively up.
func (v VLAN) IsUp() bool { return upOrDefault(v.Up) }

// IsUp reports whether the macvlan should be administratively up.
func (m Macvlan) IsUp() bool { return upOrDefault(m.Up) }
