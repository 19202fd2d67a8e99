// Package clients is a remote-access device's clients as an operator
// handles them (`nodeagentctl peer add|disable|enable|remove`): whether a
// peer is in the device at a time (disabled, expired), the next free
// address of the device's subnets, the peer file created atomically in
// the register and edited in place, and the client's wg-quick config.
//
// It reads and writes register files (netcfg/register reads them for the
// daemon) and imports nothing above netcfg.
package clients

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// A peer's states.
const (
	// StateActive: the peer is in the device.
	StateActive = "active"
	// StateDisabled: the file says disabled: true; the peer is kept out.
	StateDisabled = "disabled"
	// StateExpired: the file's expires has passed; the peer is kept out.
	StateExpired = "expired"
)

// Life is a peer's state at a time.
type Life struct {
	State string
	// Reason says why a peer is kept out ("" while it is active).
	Reason string
	// Expires is when the peer expires (zero: never).
	Expires time.Time
}

// Held reports whether the peer is kept out of the device.
func (l Life) Held() bool { return l.State != StateActive }

// LifeOf is p's state at now. An expires that does not parse counts as
// none (validation reports it).
func LifeOf(p config.WGPeer, now time.Time) Life {
	var l Life
	if p.Expires != "" {
		if t, err := time.Parse(time.RFC3339, p.Expires); err == nil {
			l.Expires = t
		}
	}
	switch {
	case p.Disabled:
		l.State, l.Reason = StateDisabled, "disabled: true in its file"
	case !l.Expires.IsZero() && !now.Before(l.Expires):
		l.State, l.Reason = StateExpired, "expired at "+l.Expires.UTC().Format(time.RFC3339)
	default:
		l.State = StateActive
	}
	return l
}

// maxExpiry bounds how far ahead --expires may go: past it the number is
// a typo, not a plan.
const maxExpiry = 10 * 366 * 24 * time.Hour

// ParseExpiry reads an expiry as `peer add --expires` takes it: a time
// from now (30d, 2w, 12h, 90m, or a Go duration like 1h30m; d is 24 hours
// and w 7 days) or a moment, RFC 3339 (2027-01-31T18:00:00Z) or a date
// (2027-01-31, the start of that day in UTC). It must be in the future and
// within ten years.
func ParseExpiry(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, fmt.Errorf("empty; give a time from now like 30d or 12h, or a moment like 2027-01-31T18:00:00Z")
	}
	var t time.Time
	if d, ok := parseSpan(s); ok {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q is not in the future", s)
		}
		if d > maxExpiry {
			return time.Time{}, fmt.Errorf("%q is more than ten years ahead", s)
		}
		t = now.Add(d)
	} else if x, err := time.Parse(time.RFC3339, s); err == nil {
		t = x
	} else if x, err := time.Parse(time.DateOnly, s); err == nil {
		t = x
	} else {
		return time.Time{}, fmt.Errorf("%q is neither a time from now (30d, 2w, 12h, 90m) nor a moment (2027-01-31T18:00:00Z, 2027-01-31)", s)
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("%s is not in the future", t.UTC().Format(time.RFC3339))
	}
	if t.Sub(now) > maxExpiry {
		return time.Time{}, fmt.Errorf("%s is more than ten years ahead", t.UTC().Format(time.RFC3339))
	}
	// Whole seconds: the file says RFC 3339 without fractions.
	return t.Truncate(time.Second).UTC(), nil
}

// parseSpan reads 30d, 2w or a Go duration.
func parseSpan(s string) (time.Duration, bool) {
	for suffix, unit := range map[string]time.Duration{"d": 24 * time.Hour, "w": 7 * 24 * time.Hour} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseUint(n, 10, 32)
			if err != nil {
				return 0, false
			}
			if v > uint64(maxExpiry/unit)+1 {
				return maxExpiry + 1, true
			}
			return time.Duration(v) * unit, true
		}
	}
	d, err := time.ParseDuration(s)
	return d, err == nil
}
