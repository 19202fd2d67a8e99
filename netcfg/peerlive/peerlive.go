// Package peerlive says when a WireGuard peer counts as live: the one rule
// that the WireGuard subsystem (which re-resolves and re-points a peer that
// is not), the status and the Node annotations (which count live peers)
// must agree on. It imports nothing.
package peerlive

import "time"

// Stale is how old a peer's last handshake may be before the peer counts
// as not talking: WireGuard rekeys every 2 minutes and gives up on a
// session after 3 (REJECT_AFTER_TIME).
const Stale = 180 * time.Second

// Live reports whether a peer with an endpoint (hasEndpoint) whose last
// handshake was at last (zero: never) is live at now.
func Live(hasEndpoint bool, last, now time.Time) bool {
	return hasEndpoint && !last.IsZero() && now.Sub(last) < Stale
}

// IsStale reports whether a peer whose last handshake was at last (zero:
// never) has not talked for Stale at now.
func IsStale(last, now time.Time) bool {
	return last.IsZero() || now.Sub(last) > Stale
}
