// Package sdbus asks systemd, over the system bus, what nodeagent's
// neighbour checks (netcfg/hazard) need to know and no file says: whether
// systemd-networkd runs, which systemd the node has, and the
// virtualization and architecture systemd detected, which the conditions
// of a .network or .link file's [Match] test.
//
// networkd is found by its bus name, org.freedesktop.network1, which it
// owns while it runs: a process list would miss it under hidepid, and a
// name like systemd-networkd's can be anyone's. PID 1's Manager gives its
// version, Virtualization and Architecture; networkd and udevd come with
// the same systemd and detect the same virtualization.
//
// Every call has a deadline (nmbus's); answers are checked and clipped.
package sdbus

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/godbus/dbus/v5"

	"github.com/nodeagent/nodeagent/netcfg/nmbus"
)

// Names on the bus.
const (
	// Networkd is systemd-networkd's bus name.
	Networkd    = "org.freedesktop.network1"
	systemd     = "org.freedesktop.systemd1"
	managerPath = dbus.ObjectPath("/org/freedesktop/systemd1")
	managerIf   = "org.freedesktop.systemd1.Manager"
)

// Facts are what systemd says.
type Facts struct {
	// Networkd reports whether org.freedesktop.network1 has an owner.
	Networkd bool
	// Version is systemd's major version (252 of "252.39-1~deb12u2"); 0
	// when PID 1 did not say.
	Version int
	// Virtualization is systemd's name for it ("" none); Known reports
	// that PID 1 answered.
	Virtualization string
	Known          bool
	// Architecture is systemd's name for the kernel's ("x86-64").
	Architecture string
}

// Read asks the bus. A PID 1 that does not answer leaves Version, the
// virtualization and the architecture unknown; only a bus that does not
// answer is an error.
func Read(ctx context.Context, c *nmbus.Conn) (Facts, error) {
	var f Facts
	owner, err := c.NameOwner(ctx, Networkd)
	if err != nil {
		return f, err
	}
	f.Networkd = owner != ""
	var version, virt, arch string
	if err := c.Property(ctx, systemd, managerPath, managerIf, "Version", &version); err == nil {
		f.Version = ParseVersion(version)
	}
	if err := c.Property(ctx, systemd, managerPath, managerIf, "Virtualization", &virt); err == nil && plain(virt) {
		f.Virtualization, f.Known = virt, true
	}
	if err := c.Property(ctx, systemd, managerPath, managerIf, "Architecture", &arch); err == nil && plain(arch) {
		f.Architecture = arch
	}
	return f, nil
}

// plain reports whether an answer is a short name of letters, digits and
// '-' or '_' ("" included): anything else is not systemd's.
func plain(s string) bool {
	if len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')) {
			return false
		}
	}
	return true
}

// ParseVersion is the major version at the start of systemd's version
// string ("252.39-1~deb12u2", "257", "255.4-1ubuntu8"); 0 for anything
// else.
func ParseVersion(s string) int {
	end := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(s)
	}
	v, err := strconv.Atoi(s[:end])
	if err != nil || v < 200 || v > 999 {
		return 0
	}
	return v
}

func (f Facts) String() string {
	return fmt.Sprintf("networkd %v, systemd %d, virtualization %q, architecture %q", f.Networkd, f.Version, f.Virtualization, f.Architecture)
}
