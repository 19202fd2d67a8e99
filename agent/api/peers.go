package api

import "time"

// The remote-access clients' endpoints (nodeagentctl peer ...). Anyone who
// can connect to the socket (root and the nodeagent group) may use them:
// they change the register only, and never see a private key.

// PeerAdd is the body of POST /v1/peers/add: a client to add to a
// device's register. The client's key pair is made by the caller, which
// keeps the private key; only the public key is sent.
type PeerAdd struct {
	// Device is the WireGuard device; "" is the only one with clients.
	Device    string `json:"device,omitempty"`
	Name      string `json:"name"`
	PublicKey string `json:"publicKey"`
	// IPs are the client's addresses (one per family); none: the next
	// free ones.
	IPs         []string `json:"ips,omitempty"`
	Description string   `json:"description,omitempty"`
	// Expires is when the client leaves the device: a time from now
	// (30d, 12h) or RFC 3339; "" never.
	Expires string `json:"expires,omitempty"`
	// FullTunnel sends all the client's traffic into the tunnel; Via (a
	// PIA device) has its internet leave by that tunnel, from the
	// device's egress pool.
	FullTunnel bool   `json:"fullTunnel,omitempty"`
	Via        string `json:"via,omitempty"`
}

// PeerAdded is the answer to POST /v1/peers/add, once the daemon has put
// the peer in its device: where it was written and what the client's
// wg-quick config needs besides its private key.
type PeerAdded struct {
	Device string `json:"device"`
	Name   string `json:"name"`
	File   string `json:"file"`
	// Addresses are the client's (10.90.0.2/32, fd00:90::2/128).
	Addresses []string `json:"addresses"`
	// ServerPublicKey and Endpoint are the device's, as the client dials
	// it.
	ServerPublicKey     string     `json:"serverPublicKey"`
	Endpoint            string     `json:"endpoint"`
	AllowedIPs          []string   `json:"allowedIPs"`
	DNS                 []string   `json:"dns,omitempty"`
	MTU                 int        `json:"mtu,omitempty"`
	PersistentKeepalive int        `json:"persistentKeepalive,omitempty"`
	Expires             *time.Time `json:"expires,omitempty"`
	Via                 string     `json:"via,omitempty"`
}

// PeerChange is the body of POST /v1/peers/disable, /v1/peers/enable and
// /v1/peers/remove.
type PeerChange struct {
	Device string `json:"device,omitempty"`
	Name   string `json:"name"`
}

// PeerChanged is their answer, once the device is as asked.
type PeerChanged struct {
	Device string `json:"device"`
	Name   string `json:"name"`
	File   string `json:"file"`
	// Changed is false when the peer was as asked already.
	Changed bool `json:"changed"`
	// State is the peer's now: active, disabled, expired or removed.
	State string `json:"state"`
}
