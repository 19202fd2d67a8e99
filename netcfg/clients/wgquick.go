package clients

import (
	"fmt"
	"strings"
)

// Config is a client's wg-quick config: what the WireGuard apps import
// (as a file or a QR code) and wg-quick(8) brings up.
type Config struct {
	// PrivateKey is the client's own key. It exists only in the process
	// that made it (nodeagentctl) and in what that prints or writes.
	PrivateKey string
	// Addresses are the client's tunnel addresses (10.90.0.2/32).
	Addresses []string
	DNS       []string
	MTU       int
	// ServerPublicKey, Endpoint: the node's device as the client dials it.
	ServerPublicKey string
	Endpoint        string
	// AllowedIPs are what the client sends into the tunnel.
	AllowedIPs []string
	Keepalive  int
	// Name, a comment on the first line.
	Name string
}

// String is the config in wg-quick's INI form. Values are checked by
// whoever filled them (the daemon's config validation, the key's
// generation); line breaks are dropped so that no value can add a line.
func (c Config) String() string {
	one := func(s string) string { return strings.NewReplacer("\n", "", "\r", "").Replace(s) }
	list := func(l []string) string { return one(strings.Join(l, ", ")) }
	var b strings.Builder
	if c.Name != "" {
		fmt.Fprintf(&b, "# %s\n", one(c.Name))
	}
	b.WriteString("[Interface]\n")
	fmt.Fprintf(&b, "PrivateKey = %s\n", one(c.PrivateKey))
	fmt.Fprintf(&b, "Address = %s\n", list(c.Addresses))
	if len(c.DNS) > 0 {
		fmt.Fprintf(&b, "DNS = %s\n", list(c.DNS))
	}
	if c.MTU > 0 {
		fmt.Fprintf(&b, "MTU = %d\n", c.MTU)
	}
	b.WriteString("\n[Peer]\n")
	fmt.Fprintf(&b, "PublicKey = %s\n", one(c.ServerPublicKey))
	fmt.Fprintf(&b, "Endpoint = %s\n", one(c.Endpoint))
	fmt.Fprintf(&b, "AllowedIPs = %s\n", list(c.AllowedIPs))
	if c.Keepalive > 0 {
		fmt.Fprintf(&b, "PersistentKeepalive = %d\n", c.Keepalive)
	}
	return b.String()
}

// FullTunnel is what a client sends into the tunnel with --full-tunnel.
var FullTunnel = []string{"0.0.0.0/0", "::/0"}
