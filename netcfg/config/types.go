package config

import "time"

// Config is the whole of /etc/nodeagent/nodeagent.yaml.
type Config struct {
	Node       Node              `yaml:"node"`
	DAD        DAD               `yaml:"dad"`
	Sysctls    map[string]string `yaml:"sysctls"`
	VLANs      []VLAN            `yaml:"vlans"`
	Macvlans   []Macvlan         `yaml:"macvlans"`
	WireGuard  []WireGuard       `yaml:"wireguard"`
	Routing    Routing           `yaml:"routing"`
	Firewall   Firewall          `yaml:"firewall"`
	Kubernetes Kubernetes        `yaml:"kubernetes"`
	Checks     Checks            `yaml:"checks"`

	// File is the path the config was read from; it prefixes every error.
	File string `yaml:"-"`
	// Lines maps each field path written in the file to its line, for
	// what reports on the config after parsing (netcfg/lint); nil for a
	// config built in code.
	Lines Lines `yaml:"-"`
}

// Node identifies this node.
type Node struct {
	// Name defaults to the hostname.
	Name string `yaml:"name"`
}

// DAD configures RFC 5227 duplicate-address detection before an IPv4
// address is claimed, and the gratuitous ARP announcements after it.
type DAD struct {
	// Disabled turns probing and announcing off.
	Disabled bool `yaml:"disabled"`
	// Probes is how many ARP probes are sent (RFC 5227 PROBE_NUM, default 3).
	Probes int `yaml:"probes"`
	// Interval is the gap between probes (default 1s; tests use a short one).
	Interval time.Duration `yaml:"interval"`
	// Wait is how long to listen for an answer after the last probe
	// (RFC 5227 ANNOUNCE_WAIT, default 2s).
	Wait time.Duration `yaml:"wait"`
	// Announcements is how many gratuitous ARPs follow a claim (default 2).
	Announcements int `yaml:"announcements"`
}

// VLAN is an 802.1Q sub-interface on a trunk.
type VLAN struct {
	Name      string   `yaml:"name"`
	Parent    string   `yaml:"parent"`
	ID        int      `yaml:"id"`
	MTU       int      `yaml:"mtu"` // 0: inherit the kernel default (the parent's)
	Up        *bool    `yaml:"up"`  // default true
	Addresses []string `yaml:"addresses"`
	// Adopt takes over an existing link of this name that nodeagent did not
	// create (it is marked as nodeagent's from then on).
	Adopt bool `yaml:"adopt"`
}

// Macvlan is a host shim so the host can reach its own macvlan pods. The
// pods' gateway belongs on the shim, not on its parent: a macvlan pod never
// reaches its parent link's addresses.
type Macvlan struct {
	Name string `yaml:"name"`
	// Parent is the link the shim sits on: the trunk, a VLAN, or another
	// macvlan, which the kernel reads as that macvlan's own parent (the
	// shim is made beside it, and shows that parent).
	Parent    string   `yaml:"parent"`
	Mode      string   `yaml:"mode"` // bridge (default), private, vepa, passthru
	MTU       int      `yaml:"mtu"`
	Up        *bool    `yaml:"up"`
	Addresses []string `yaml:"addresses"`
	Adopt     bool     `yaml:"adopt"`
}

// WireGuard is one WireGuard interface.
type WireGuard struct {
	Name string `yaml:"name"`
	// PrivateKeyFile holds the device's private key (wg genkey, chmod 600).
	// Optional on a PIA device: empty, nodeagent generates a key and keeps
	// it under /var/lib/nodeagent/pia/.
	PrivateKeyFile string   `yaml:"privateKeyFile"`
	ListenPort     int      `yaml:"listenPort"`
	FwMark         int      `yaml:"fwMark"`
	MTU            int      `yaml:"mtu"`
	Addresses      []string `yaml:"addresses"`
	// Implementation is auto (default), kernel or userspace.
	Implementation string `yaml:"implementation"`
	PeersDir       string `yaml:"peersDir"`
	// Adopt takes over an existing WireGuard device of this name that
	// nodeagent did not create (wg-quick's, say): it is marked, and its
	// peers converge to the config's and the register's from then on.
	Adopt bool     `yaml:"adopt"`
	Peers []WGPeer `yaml:"peers"`
	PIA   *PIA     `yaml:"pia"`
}

// WGPeer is one WireGuard peer, listed in WireGuard.Peers or read from a
// file in WireGuard.PeersDir (see package netcfg/register).
type WGPeer struct {
	Name string `yaml:"name"`
	// Description is free text for the operator, such as whose device
	// this is; nodeagent does not use it.
	Description         string   `yaml:"description"`
	PublicKey           string   `yaml:"publicKey"`
	PresharedKeyFile    string   `yaml:"presharedKeyFile"`
	Endpoint            string   `yaml:"endpoint"`
	AllowedIPs          []string `yaml:"allowedIPs"`
	PersistentKeepalive int      `yaml:"persistentKeepalive"`
}

// PIA configures the Private Internet Access provider for a tunnel: the
// device's peer, address, endpoint and keepalive come from PIA's addKey,
// so peers, peersDir, addresses and listenPort are not allowed beside it.
// Its state (the registration, the token, the cached server list and, when
// privateKeyFile is empty, the device's key) is kept under the state
// directory, /var/lib/nodeagent/pia/.
type PIA struct {
	// Region is a region id of PIA's server list (nl_amsterdam), or "auto":
	// the region whose first meta server answers a TCP connect soonest
	// (among regions with port forwarding when portForward is set).
	Region string `yaml:"region"`
	// CredentialsFile holds the account: two lines (username, then
	// password) or YAML {username: ..., password: ...}. It must be owned by
	// root and readable by root only (chmod 600). Never logged.
	CredentialsFile string `yaml:"credentialsFile"`
	// PortForward asks PIA for a forwarded port (regions that have it),
	// keeps it bound and delivers it. "portForward: true" is short for
	// {enabled: true}.
	PortForward PortForward `yaml:"portForward"`
	// DNS sends the DNS of some sources to PIA's resolvers through the
	// tunnel.
	DNS PIADNS `yaml:"dns"`
	// ServerList is the URL of PIA's signed server list; default
	// https://serverlist.piaservers.net/vpninfo/servers/v6.
	ServerList string `yaml:"serverList"`
	// TokenURL is the URL of PIA's token endpoint, used when no meta
	// server gives a token; default
	// https://www.privateinternetaccess.com/api/client/v2/token.
	TokenURL string `yaml:"tokenURL"`
	// CAFile is the root that PIA's meta and WireGuard servers' certificates
	// must lead to; default PIA's own RSA-4096 root, built in.
	CAFile string `yaml:"caFile"`
	// ServerListKeyFile is the RSA public key (PEM) the server list must be
	// signed with; default PIA's own, built in.
	ServerListKeyFile string `yaml:"serverListKeyFile"`
	// WebCAFile is the roots (PEM) for the token and list hosts; default
	// the system's roots (they use the public web PKI).
	WebCAFile string `yaml:"webCAFile"`
}

// PortForward is a PIA tunnel's forwarded port.
type PortForward struct {
	// Enabled asks for the port.
	Enabled bool `yaml:"enabled"`
	// To, when set, DNATs the forwarded port (TCP and UDP) arriving on the
	// tunnel to this IPv4 address, which must sit in a subnet routed
	// through this tunnel's kill-switch table (a pod on the VLAN).
	To string `yaml:"to"`
	// ToPort is the port at To; 0 is the forwarded port's own number.
	ToPort int `yaml:"toPort"`
	// OnChange is run (argv, no shell) once each time the port changes,
	// with NODEAGENT_PIA_PORT and NODEAGENT_PIA_DEVICE in its environment,
	// for at most 30 s; its output is logged. A failure is reported, not
	// retried.
	OnChange []string `yaml:"onChange"`
}

// shorthand lets "portForward: true" stand for {enabled: true}.
func (PortForward) shorthand() string { return "enabled" }

// PIADNS sends DNS to PIA's resolvers.
type PIADNS struct {
	// For lists IPv4 sources whose DNS (UDP and TCP port 53, to any
	// address, the node's own included) is DNATed to the first answering
	// of PIA's resolvers (addKey's dns_servers), so it leaves only through
	// the tunnel, and is dropped while the tunnel is down. The node's own
	// DNS is left alone. Each prefix must lie within a source that
	// routing.rules send to this device's kill-switch table. IPv6 DNS to
	// the node from the links holding these sources is dropped.
	For []string `yaml:"for"`
}

// Routing is policy routing: tables with routes, and rules.
type Routing struct {
	Tables []Table `yaml:"tables"`
	Rules  []Rule  `yaml:"rules"`
}

// Table is one routing table.
type Table struct {
	ID         int     `yaml:"id"`
	Name       string  `yaml:"name"`
	KillSwitch bool    `yaml:"killSwitch"`
	Routes     []Route `yaml:"routes"`
}

// Route is one route in a table.
type Route struct {
	To     string `yaml:"to"` // CIDR or "default"
	Via    string `yaml:"via"`
	Dev    string `yaml:"dev"`
	Src    string `yaml:"src"`
	Metric int    `yaml:"metric"`
	Scope  string `yaml:"scope"` // global, link, host
	Type   string `yaml:"type"`  // unicast (default), unreachable, blackhole, prohibit
	OnLink bool   `yaml:"onlink"`
}

// Rule is one policy routing rule.
type Rule struct {
	Priority             int    `yaml:"priority"`
	From                 string `yaml:"from"`
	To                   string `yaml:"to"`
	IIF                  string `yaml:"iif"`
	OIF                  string `yaml:"oif"`
	FwMark               string `yaml:"fwmark"` // "0x10" or "0x10/0xff"
	Table                int    `yaml:"table"`
	SuppressPrefixLength *int   `yaml:"suppressPrefixLength"`
	Action               string `yaml:"action"` // table (default), unreachable, blackhole, prohibit
	Invert               bool   `yaml:"invert"`
}

// Firewall is nodeagent's own nftables ruleset.
type Firewall struct {
	Masquerade []Masquerade `yaml:"masquerade"`
	SNAT       []SNAT       `yaml:"snat"`
	// Forward accepts forwarded traffic between two interfaces in
	// nodeagent's own chain, plus established and related traffic. An
	// accept there does not override a drop in another table.
	Forward    []ForwardAccept `yaml:"forward"`
	KillSwitch []KillSwitch    `yaml:"killSwitch"`
	MSSClamp   []string        `yaml:"mssClamp"`
}

// Masquerade rewrites the source of traffic from From leaving by Out.
type Masquerade struct {
	From string `yaml:"from"`
	Out  string `yaml:"out"`
}

// SNAT rewrites the source of traffic from From leaving by Out to the
// fixed address To, of the same family as From.
type SNAT struct {
	From string `yaml:"from"`
	Out  string `yaml:"out"`
	To   string `yaml:"to"`
}

// ForwardAccept accepts forwarded traffic coming in by In and leaving by
// Out.
type ForwardAccept struct {
	In  string `yaml:"in"`
	Out string `yaml:"out"`
}

// KillSwitch lets forwarded traffic from From leave only by AllowOut, and
// so the ICMP errors the node itself sends about that traffic (they quote
// its headers): those may otherwise go back to From only.
type KillSwitch struct {
	From     string   `yaml:"from"`
	AllowOut []string `yaml:"allowOut"`
}

// Kubernetes configures Node labelling.
type Kubernetes struct {
	// Kubeconfig is the credentials to label with. Default: the k3s
	// kubelet's, so nodeagent acts as system:node:<name> and the Node
	// authorizer and NodeRestriction confine it to its own Node; inside a
	// pod with no kubeconfig, the in-cluster service account.
	Kubeconfig        string             `yaml:"kubeconfig"`
	Labels            map[string]string  `yaml:"labels"`
	ConditionalLabels []ConditionalLabel `yaml:"conditionalLabels"`
	// Hold is how long a conditional label's condition must hold, or
	// fail, before the label follows it (default 30s; 0 follows at
	// once), so a flapping tunnel does not churn the scheduler.
	Hold time.Duration `yaml:"hold"`
}

// Enabled reports whether the config asks for Node labelling at all: a
// kubeconfig, a label or a conditional label. A node with nothing to
// label that still wants the status annotations names its kubeconfig.
func (k Kubernetes) Enabled() bool {
	return k.Kubeconfig != "" || len(k.Labels) > 0 || len(k.ConditionalLabels) > 0
}

// ConditionalLabel is present on the Node only while When holds.
type ConditionalLabel struct {
	Key   string `yaml:"key"`
	Value string `yaml:"value"`
	// When is the condition: wireguard/<interface>/healthy (the device
	// exists and has no peers or a live one), vlan/<name>/up,
	// checks/arp-reachable or converged.
	When string `yaml:"when"`
}

// Checks are probes the node must pass. The daemon runs them every resync
// and reports them as conditions, and safe apply runs them around every
// change that touches links, routes, rules, nftables or WireGuard devices:
// a probe that passed before a change and fails after it rolls the change
// back.
type Checks struct {
	// ARPReachable are IPv4 addresses the node must resolve by ARP (the
	// VIPs it announces, say).
	ARPReachable []string `yaml:"arpReachable"`
	// APIServer is host:port of the Kubernetes API server, probed with a
	// TCP connect. Default: the server of kubernetes.kubeconfig, if it can
	// be read.
	APIServer string `yaml:"apiServer"`
	// GatewayARP probes the main table's IPv4 default gateway by ARP
	// (default true).
	GatewayARP *bool `yaml:"gatewayARP"`
	// SafeApply turns the probe-and-roll-back around changes on or off
	// (default true).
	SafeApply *bool `yaml:"safeApply"`
	// ProbeDeadline is how long a probe may take to pass again after a
	// change before the change is rolled back (default 10s).
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
