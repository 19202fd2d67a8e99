// Package api is the local API of the nodeagent daemon: the JSON types it
// serves on its unix socket (/run/nodeagent/nodeagent.sock) and a typed
// client for them. It is a leaf package, shared by the daemon, nodeagentctl
// and tests, and imports nothing of nodeagent's.
//
// Endpoints (HTTP over the unix socket; reads for root and the nodeagent
// group, writes for root only; requests carrying Origin or Referer are
// refused, so a browser cannot be made to call it):
//
//	GET  /v1/status   Status
//	GET  /v1/plan     Plan: what a sync would change now
//	POST /v1/reload   Reload: re-read the config (root only)
//	GET  /v1/peers    []WireGuardDevice, the figures read now
//	POST /v1/peers/add      PeerAdd -> PeerAdded (see peers.go)
//	POST /v1/peers/disable  PeerChange -> PeerChanged; also enable, remove
//	GET  /healthz     200 while the reconcile loop runs
//	GET  /readyz      200 once the first full convergence is done and the node is not degraded
package api

import (
	"slices"
	"time"
)

// DefaultSocket is where the daemon listens.
const DefaultSocket = "/run/nodeagent/nodeagent.sock"

// Condition status values, as in Kubernetes.
const (
	True    = "True"
	False   = "False"
	Unknown = "Unknown"
)

// Condition types the daemon reports.
const (
	// Ready: the first full convergence is done and nothing failed in the
	// last sync (pending objects do not count).
	CondReady = "Ready"
	// Converged: the last sync planned and applied without failures.
	CondConverged = "Converged"
	// ConfigLoaded: the running config is the file's current content; False
	// after a rejected reload (the previous config keeps running).
	CondConfigLoaded = "ConfigLoaded"
	// KillSwitchArmed: every configured kill switch is in the kernel.
	CondKillSwitchArmed = "KillSwitchArmed"
	// SafeApply: False after a change was rolled back because a probe that
	// passed before it failed after it.
	CondSafeApply = "SafeApply"
	// ARPReachable: every checks.arpReachable address answered ARP.
	CondARPReachable = "ARPReachable"
	// PeersConfigured: every WireGuard peer the config and the registers
	// name is in its device. False, with the file:line of each, while a
	// register entry (or a peer) is skipped: a peer file that does not
	// parse, a peer whose endpoint does not resolve. It degrades the node
	// but does not hold back Ready: the device and its other peers work.
	CondPeersConfigured = "PeersConfigured"
	// LabelsSynced: the Node carries the labels and annotations the config
	// and the conditions ask for (agent/kube). False with the reason while
	// the API server is unreachable, the identity is refused, or another
	// field manager owns a label.
	CondLabelsSynced = "LabelsSynced"
	// TunnelHealthy: every PIA tunnel is registered, has handshaken since
	// and its server answers. False, with the step it is at and why, while
	// one is not; it degrades the node but does not hold back Ready (the
	// kill switch holds meanwhile).
	CondTunnelHealthy = "TunnelHealthy"
	// Coexistence: nothing on this node is set to delete or take over
	// nodeagent's objects by design: a running systemd-networkd's
	// ManageForeignRoutingPolicyRules or ManageForeignRoutes left on where
	// the config has routing, or a .network file whose [Match] catches one
	// of nodeagent's links. False names each, with its fix. It neither
	// degrades the node nor holds back Ready: nodeagent repairs what such
	// a program deletes, and the kill switch holds meanwhile.
	CondCoexistence = "Coexistence"
	// PortDelivered: every PIA device's portForward.onChange exited 0 for
	// its current port (reason Delivered) and the port files were written.
	// Unknown with reason Pending while there is nothing to deliver yet:
	// no port bound (PIA still registering, binding), or the first run for
	// a new port due or running. False with reason HookFailed (the first
	// line of the error) while the hook fails or times out (it is retried
	// with backoff), CredentialsRefused when it exited 77, PortFileFailed
	// when a port file could not be written. Absent when no device has an
	// onChange and every port file was written. False degrades the node;
	// it never holds back Ready.
	CondPortDelivered = "PortDelivered"
	// Conflict: no object is in a fight with another program. False names
	// each object nodeagent backed off (repaired agent/fight's bound of
	// times within its window, and since then repaired once per resync
	// instead of at once), how often it was changed back and the program
	// most likely doing it. It degrades the node while it lasts; it does
	// not hold back Ready. The kill switch is never backed off.
	CondConflict = "Conflict"
	// GatewayRole: this node's part in the gateway role (agent/gateway),
	// reason Holder, Standby (the message names the holder), Claiming or
	// Fenced. True while Holder or Standby; False while Claiming or
	// Fenced, which degrades the node. Absent without a gateway role.
	CondGatewayRole = "GatewayRole"
)

// NotDegrading are the condition types that leave the node not degraded
// when False: Ready is readiness itself (a node not ready is "not
// ready"), LabelsSynced is about the Node object, which never gates
// networking, and Coexistence names hazards whose damage nodeagent
// repairs. Every other condition degrades the node while it is False:
// `nodeagentctl status` exits 1, /readyz answers 503, nodeagent_ready is 0,
// `nodeagentctl wait --for=healthy` waits on. This is the one place that
// says which; nodeagentctl(1)'s CONDITIONS names the same set, and a test
// holds the two together.
var NotDegrading = []string{CondReady, CondLabelsSynced, CondCoexistence}

// Degrades reports whether a condition of type typ degrades the node
// while it is False (Unknown never does).
func Degrades(typ string) bool { return !slices.Contains(NotDegrading, typ) }

// Degrading are the conditions of s that make it degraded: False, of a
// type that Degrades.
func (s *Status) Degrading() []Condition {
	var out []Condition
	for _, c := range s.Conditions {
		if c.Status == False && Degrades(c.Type) {
			out = append(out, c)
		}
	}
	return out
}

// Condition is one aspect of the node's state, Kubernetes-style.
type Condition struct {
	Type               string    `json:"type"`
	Status             string    `json:"status"`
	Reason             string    `json:"reason,omitempty"`
	Message            string    `json:"message,omitempty"`
	LastTransitionTime time.Time `json:"lastTransitionTime"`
}

// Object is one kernel object that is not converged.
type Object struct {
	Subsystem string `json:"subsystem"` // links, wireguard, routes, nftables, sysctls
	Message   string `json:"message"`
}

// Subsystem summarises one subsystem.
type Subsystem struct {
	Name string `json:"name"`
	// Changes is how many changes the last sync made.
	Changes int `json:"changes"`
	// Error is the subsystem's failure in the last sync, "" when none.
	Error string `json:"error,omitempty"`
	// Note is what the last sync had to do beyond the plan: "nft table
	// inet nodeagent: replaced whole in one transaction (the update
	// failed: …)" when the kernel refused the update in place.
	Note string `json:"note,omitempty"`
}

// Sync describes the last sync.
type Sync struct {
	Time       time.Time `json:"time"`
	DurationMS float64   `json:"durationMs"`
	Trigger    string    `json:"trigger"` // start, config, signal, event, resync, retry, api
	Changes    int       `json:"changes"`
	Count      int64     `json:"count"` // syncs since start
}

// Rejected is a config that failed validation and was not applied.
type Rejected struct {
	Time time.Time `json:"time"`
	File string    `json:"file"`
	// Errors are the validation errors, each "file:line: field: reason".
	Errors []string `json:"errors"`
}

// Rollback is a change that safe apply undid.
type Rollback struct {
	Time time.Time `json:"time"`
	// Probe names the probe that passed before the change and failed after.
	Probe string `json:"probe"`
	// Message says how it failed.
	Message string `json:"message"`
	// ConfigHash identifies the config that is not retried until it changes.
	ConfigHash string `json:"configHash"`
}

// Status is what GET /v1/status returns and `nodeagentctl status -o json`
// prints.
type Status struct {
	Version    string      `json:"version"`
	Node       string      `json:"node"`
	ConfigFile string      `json:"configFile"`
	ConfigHash string      `json:"configHash"`
	Started    time.Time   `json:"started"`
	Ready      bool        `json:"ready"`
	Degraded   bool        `json:"degraded"`
	Conditions []Condition `json:"conditions"`
	LastSync   *Sync       `json:"lastSync,omitempty"`
	Subsystems []Subsystem `json:"subsystems"`
	Pending    []Object    `json:"pending"`
	Failed     []Object    `json:"failed"`
	// Skipped are entries left out of an object converged without them
	// (a WireGuard peer whose register file does not parse).
	Skipped []Object `json:"skipped"`
	// WireGuard is every configured WireGuard device with its peers.
	WireGuard []WireGuardDevice `json:"wireguard"`
	// PIA is every PIA tunnel's provider state.
	PIA []PIATunnel `json:"pia,omitempty"`
	// LastRejected is the last config reload that failed validation.
	LastRejected *Rejected `json:"lastRejected,omitempty"`
	// LastRollback is the last change safe apply rolled back.
	LastRollback *Rollback `json:"lastRollback,omitempty"`
	// Warnings are what the running config gets wrong about the network
	// (netcfg/lint), each "file:line: field: reason; the fix".
	Warnings []string `json:"warnings,omitempty"`
	// Gateway is this node's part in the gateway role; absent without one.
	Gateway *GatewayRole `json:"gateway,omitempty"`
}

// GatewayRole is this node's part in a gateway role (agent/gateway).
type GatewayRole struct {
	Role string `json:"role"`
	// State is Holder, Standby, Claiming or Fenced.
	State string `json:"state"`
	// Holder is the Lease's holder as last read ("" when none).
	Holder string    `json:"holder"`
	Since  time.Time `json:"since"`
	// Reason says why, in one line.
	Reason string `json:"reason"`
	// LeaseOK: the Lease was read or written within its duration.
	LeaseOK bool `json:"leaseOK"`
	// Transitions counts state changes since the daemon started;
	// TookOverSeconds is how long this node's last take-over took.
	Transitions     int     `json:"transitions"`
	TookOverSeconds float64 `json:"tookOverSeconds,omitempty"`
}

// PIATunnel is a PIA tunnel's provider state. It holds nothing secret (no
// token, no key, no credentials).
type PIATunnel struct {
	Device string `json:"device"`
	// Phase is the step the provider is at: token, list, server, addKey,
	// configuring, handshake or healthy.
	Phase   string `json:"phase"`
	Healthy bool   `json:"healthy"`
	Region  string `json:"region"`
	// ServerCN and ServerIP name the WireGuard server registered with;
	// ServerVIP is its address inside the tunnel, PeerIP the node's.
	ServerCN  string `json:"serverCN,omitempty"`
	ServerIP  string `json:"serverIP,omitempty"`
	ServerVIP string `json:"serverVIP,omitempty"`
	PeerIP    string `json:"peerIP,omitempty"`
	// RegisteredSince is when the running registration was made.
	RegisteredSince *time.Time `json:"registeredSince,omitempty"`
	// LastHandshake and HandshakeAgeSeconds (-1: none seen) are the
	// server peer's.
	LastHandshake       *time.Time `json:"lastHandshake,omitempty"`
	HandshakeAgeSeconds int64      `json:"handshakeAgeSeconds"`
	// NextTokenRefresh is when the token is replaced.
	NextTokenRefresh *time.Time `json:"nextTokenRefresh,omitempty"`
	// ServerList says where the server list in use came from: "fetched
	// TIME", or why the cached one is used.
	ServerList string `json:"serverList,omitempty"`
	// LastError is the last step that failed, and when; RetryAt when it
	// is tried again (absent when not waiting).
	LastError   string     `json:"lastError,omitempty"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
	RetryAt     *time.Time `json:"retryAt,omitempty"`
	// ProbeFailures counts unanswered probes of the server in a row.
	ProbeFailures int `json:"probeFailures,omitempty"`
	// ForwardedPort is the port PIA forwards, as published (DNAT, port
	// file, metric): 0 without one, or once it is lost; PortExpires when
	// its signature ends, LastBind the last good bind, PortError the last
	// port-forwarding failure.
	ForwardedPort int        `json:"forwardedPort,omitempty"`
	PortExpires   *time.Time `json:"portExpires,omitempty"`
	LastBind      *time.Time `json:"lastBind,omitempty"`
	PortError     string     `json:"portError,omitempty"`
	// PortTroubleSince is when the port stopped being kept bound (binds
	// failing, the tunnel down); absent while it is.
	PortTroubleSince *time.Time `json:"portTroubleSince,omitempty"`
	// PortLost is the port lost after 15 minutes of trouble, and since
	// when; absent while there is none.
	PortLost *PortLost `json:"portLost,omitempty"`
	// DNS is the resolver the VLAN's DNS is sent to (with pia.dns).
	DNS string `json:"dns,omitempty"`
	// PortHook is portForward.onChange's state; absent without one.
	PortHook *PortHook `json:"portHook,omitempty"`
}

// PortRetry is the answer to POST /v1/port/retry: the devices whose port
// hook was made to run now, or why none was.
type PortRetry struct {
	Devices []string `json:"devices"`
	Error   string   `json:"error,omitempty"`
}

// PortLost is a forwarded port that was lost: closed everywhere (no DNAT,
// no port file, the metric at 0) until a port is bound again.
type PortLost struct {
	Port  int       `json:"port"`
	Since time.Time `json:"since"`
}

// PortHook is the state of a PIA device's port hook (portForward.onChange).
type PortHook struct {
	// Port is the port the hook is to deliver (0: lost, or none yet);
	// Lost that the port was lost.
	Port int  `json:"port"`
	Lost bool `json:"lost,omitempty"`
	// LostPort is the port lost, when Lost.
	LostPort int `json:"lostPort,omitempty"`
	// Delivered: the hook exited 0 for Port at its last run.
	Delivered bool `json:"delivered"`
	Running   bool `json:"running,omitempty"`
	// LastRun is when the last run started, LastExit how it ended ("exit
	// 0", "exit 1", "timeout"), LastError the first line of why it failed.
	LastRun   *time.Time `json:"lastRun,omitempty"`
	LastExit  string     `json:"lastExit,omitempty"`
	LastError string     `json:"lastError,omitempty"`
	// LastTookSeconds is how long the last run took.
	LastTookSeconds *float64 `json:"lastTookSeconds,omitempty"`
	// Refused counts the runs in a row that exited 77 (credentials or key
	// refused, or the node banned); Held: so many that the hook is not
	// run again until `nodeagentctl port --retry` or a reload.
	Refused int  `json:"refused,omitempty"`
	Held    bool `json:"held,omitempty"`
	// Attempts counts the failed runs for Port since it was last
	// delivered; NextRun is when the hook runs next.
	Attempts int        `json:"attempts"`
	NextRun  *time.Time `json:"nextRun,omitempty"`
}

// Condition returns the condition of the given type, or nil.
func (s *Status) Condition(typ string) *Condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == typ {
			return &s.Conditions[i]
		}
	}
	return nil
}

// WireGuardDevice is one WireGuard interface. It carries public keys only.
type WireGuardDevice struct {
	Name string `json:"name"`
	// Implementation is kernel or userspace; "" when the device does not
	// exist (see Problems).
	Implementation string          `json:"implementation"`
	PublicKey      string          `json:"publicKey,omitempty"`
	ListenPort     int             `json:"listenPort,omitempty"`
	Peers          []WireGuardPeer `json:"peers"`
	// LivePeers counts peers with an endpoint and a handshake younger than
	// 3 minutes.
	LivePeers int      `json:"livePeers"`
	Problems  []string `json:"problems,omitempty"`
}

// WireGuardPeer is one peer of a device.
type WireGuardPeer struct {
	PublicKey     string     `json:"publicKey"`
	Name          string     `json:"name,omitempty"`
	Endpoint      string     `json:"endpoint,omitempty"`
	LastHandshake *time.Time `json:"lastHandshake,omitempty"`
	// HandshakeAgeSeconds is -1 for a peer that never completed one.
	HandshakeAgeSeconds int64    `json:"handshakeAgeSeconds"`
	RxBytes             int64    `json:"rxBytes"`
	TxBytes             int64    `json:"txBytes"`
	AllowedIPs          []string `json:"allowedIPs"`
	Live                bool     `json:"live"`
	// State is "" for a peer in the device, "disabled" or "expired" for
	// one its file keeps out of it (Reason says why); Expires is when a
	// peer with expires leaves the device.
	State   string     `json:"state,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Expires *time.Time `json:"expires,omitempty"`
}

// Plan is what GET /v1/plan returns: the dry run of a sync now.
type Plan struct {
	// Lines are the plan's lines (+ add, ~ change, - remove, ! cannot).
	Lines []string `json:"lines"`
	// Error is what could not be planned, "" when everything was.
	Error string `json:"error,omitempty"`
	// Warnings are the running config's, as in Status.
	Warnings []string `json:"warnings,omitempty"`
}

// Reload is what POST /v1/reload returns.
type Reload struct {
	// Applied reports whether the new config was accepted; a rejected one
	// leaves the running config in place.
	Applied bool `json:"applied"`
	// Errors are the validation errors of a rejected config.
	Errors []string `json:"errors,omitempty"`
	// ConfigHash is the running config's hash after the reload.
	ConfigHash string `json:"configHash"`
}

// Error is the body of every non-2xx reply.
type Error struct {
	Error string `json:"error"`
}
