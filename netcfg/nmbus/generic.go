package nmbus

import (
	"context"
	"fmt"

	"github.com/godbus/dbus/v5"
)

// The bus's own calls, for whoever else a neighbour check asks on the
// same connection (systemd: netcfg/sdbus). They keep this package's
// rules: a deadline on every call, errors clipped.

// NameOwner is the unique bus name that owns name, "" when none does.
func (c *Conn) NameOwner(ctx context.Context, name string) (string, error) {
	var owner string
	err := c.call(ctx, c.c.BusObject(), busName+".GetNameOwner", name).Store(&owner)
	if err != nil {
		if dbusErrorName(err) == errNoOwner {
			return "", nil
		}
		return "", fmt.Errorf("who owns %s: %w", clip(name), bound(err))
	}
	return clip(owner), nil
}

// WatchName asks the bus for NameOwnerChanged of name: its owner's start
// and stop then poke Events.
func (c *Conn) WatchName(ctx context.Context, name string) error {
	cctx, cancel := withDeadline(ctx)
	defer cancel()
	if err := c.c.AddMatchSignalContext(cctx, dbus.WithMatchSender(busName), dbus.WithMatchInterface(busName),
		dbus.WithMatchMember("NameOwnerChanged"), dbus.WithMatchArg(0, name)); err != nil {
		return fmt.Errorf("watch %s: %w", clip(name), bound(err))
	}
	return nil
}

// Property reads one property of an object of dest into v (a pointer to
// its Go type).
func (c *Conn) Property(ctx context.Context, dest string, path dbus.ObjectPath, iface, prop string, v any) error {
	return c.get(ctx, c.c.Object(dest, path), iface, prop, v)
}
