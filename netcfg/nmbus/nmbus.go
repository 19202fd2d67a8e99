// Package nmbus asks NetworkManager, over the system D-Bus, what it holds
// of a list of links, and tells it to leave one alone (its Device's
// Managed property set to false). It never runs nmcli.
//
// The bus and NetworkManager are treated as servers that may misbehave:
// the connection is made before a deadline, every call carries one, the
// links asked about and the strings kept are capped in number and length,
// and an error names a D-Bus error and a short, printable part of its
// message, never an arbitrary long string.
//
// The API is NetworkManager's D-Bus API as of 1.42 (Debian 12): Manager
// GetDeviceByIpIface; Device Managed (read-write since 1.2, a runtime
// setting), State, InterfaceFlags and ActiveConnection; Connection.Active Id, Uuid and
// StateFlags (EXTERNAL, 0x80, since 1.26: a connection NetworkManager
// generated for a link it found configured).
package nmbus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/godbus/dbus/v5"
)

// NetworkManager's names on the bus.
const (
	Service      = "org.freedesktop.NetworkManager"
	managerPath  = "/org/freedesktop/NetworkManager"
	deviceIface  = Service + ".Device"
	activeIface  = Service + ".Connection.Active"
	propsIface   = "org.freedesktop.DBus.Properties"
	busName      = "org.freedesktop.DBus"
	errNoOwner   = "org.freedesktop.DBus.Error.NameHasNoOwner"
	errNoService = "org.freedesktop.DBus.Error.ServiceUnknown"
	errUnknown   = Service + ".UnknownDevice"
)

// Limits on what is asked and kept.
const (
	// CallTimeout bounds one call when the caller's context has no
	// earlier deadline.
	CallTimeout = 2 * time.Second
	// MaxLinks is how many link names Devices asks about; the rest are
	// left out.
	MaxLinks = 64
	// maxString is the longest string kept from the bus (a connection's
	// Id, an error's name or message), in bytes.
	maxString = 80
	// stateFlagExternal is NM_ACTIVATION_STATE_FLAG_EXTERNAL.
	stateFlagExternal = 0x80
	// interfaceFlagUp is NM_DEVICE_INTERFACE_FLAG_UP.
	interfaceFlagUp = 0x1
)

// ErrNotRunning is returned when NetworkManager has no owner on the bus.
var ErrNotRunning = errors.New("NetworkManager is not running")

// DefaultSystemBus is where the system bus listens when
// DBUS_SYSTEM_BUS_ADDRESS does not say.
const DefaultSystemBus = "unix:path=/run/dbus/system_bus_socket"

// State is a Device's NMDeviceState.
type State uint32

// The device states (NMDeviceState).
const (
	StateUnknown      State = 0
	StateUnmanaged    State = 10
	StateUnavailable  State = 20
	StateDisconnected State = 30
	StateActivated    State = 100
	StateFailed       State = 120
)

var stateNames = map[State]string{
	0: "unknown", 10: "unmanaged", 20: "unavailable", 30: "disconnected",
	40: "prepare", 50: "config", 60: "need-auth", 70: "ip-config",
	80: "ip-check", 90: "secondaries", 100: "activated", 110: "deactivating",
	120: "failed",
}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("state %d", uint32(s))
}

// Device is what NetworkManager says of one link.
type Device struct {
	// Name is the link's name as asked.
	Name string
	// Path is NetworkManager's object for it; "" when it has none (it
	// does not know the link).
	Path dbus.ObjectPath
	// Managed is the Device's Managed property.
	Managed bool
	State   State
	// Up is whether the link is up (InterfaceFlags, since 1.22): an up
	// link NetworkManager does not manage is one it was told to leave
	// alone, not one it waits to see configured.
	Up bool
	// Connection is its active connection, nil when it has none.
	Connection *Active
	// Err is why it could not be read; the other fields are then not
	// known.
	Err error
}

// Active is a Device's active connection.
type Active struct {
	ID, UUID string
	// External is set for a connection NetworkManager generated to
	// describe a link it found configured ("connected (externally)").
	External bool
}

// Holds says whether NetworkManager holds the link as its own: it knows
// it and manages it (whatever the state: a managed link without a
// connection may be given one).
func (d Device) Holds() bool { return d.Err == nil && d.Path != "" && d.Managed }

// Describe says, for a log line or a hazard, how NetworkManager holds the
// link: as its connection "X" (external), or as managed (state S).
func (d Device) Describe() string {
	if c := d.Connection; c != nil {
		s := fmt.Sprintf("as its connection %q", c.ID)
		if c.External {
			s += " (external)"
		}
		return s
	}
	return "as managed (" + d.State.String() + ")"
}

// Conn is a connection to the bus.
type Conn struct {
	c      *dbus.Conn
	events chan struct{}
}

// Dial connects to the bus at address ("" is the system bus:
// DBUS_SYSTEM_BUS_ADDRESS, else DefaultSystemBus) and authenticates,
// before ctx's deadline (CallTimeout when it has none). Only unix:path=
// and unix:abstract= addresses are taken.
func Dial(ctx context.Context, address string) (*Conn, error) {
	if address == "" {
		address = os.Getenv("DBUS_SYSTEM_BUS_ADDRESS")
	}
	if address == "" {
		address = DefaultSystemBus
	}
	path, err := unixPath(address)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to the bus: %w", bound(err))
	}
	// The handshake (auth, Hello) takes no context: the deadline is the
	// socket's, and a cancel closes it.
	dl, _ := ctx.Deadline()
	raw.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	h := &signals{events: make(chan struct{}, 1)}
	c, err := dbus.NewConn(raw, dbus.WithSignalHandler(h))
	if err != nil {
		stop()
		raw.Close()
		return nil, fmt.Errorf("bus: %w", bound(err))
	}
	if err := c.Auth(nil); err != nil {
		stop()
		c.Close()
		return nil, fmt.Errorf("bus authentication: %w", bound(err))
	}
	if err := c.Hello(); err != nil {
		stop()
		c.Close()
		return nil, fmt.Errorf("bus hello: %w", bound(err))
	}
	if !stop() {
		c.Close()
		return nil, fmt.Errorf("bus: %w", ctx.Err())
	}
	raw.SetDeadline(time.Time{})
	return &Conn{c: c, events: h.events}, nil
}

// unixPath is the socket of the first unix address in a D-Bus address
// list.
func unixPath(address string) (string, error) {
	for _, a := range strings.Split(address, ";") {
		kind, rest, ok := strings.Cut(a, ":")
		if !ok || kind != "unix" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			v, err := url.PathUnescape(v)
			if err != nil || v == "" {
				continue
			}
			switch k {
			case "path":
				return v, nil
			case "abstract":
				return "@" + v, nil
			}
		}
	}
	return "", fmt.Errorf("no unix socket in the bus address %q", clip(address))
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Done is closed when the connection is lost (or closed).
func (c *Conn) Done() <-chan struct{} { return c.c.Context().Done() }

// Events receives a value, coalesced, whenever a signal Subscribe asked
// for arrives: NetworkManager's start or stop, a device added or removed,
// a device's state or properties changed.
func (c *Conn) Events() <-chan struct{} { return c.events }

// Subscribe asks the bus for the signals Events reports.
func (c *Conn) Subscribe(ctx context.Context) error {
	rules := [][]dbus.MatchOption{
		{dbus.WithMatchSender(busName), dbus.WithMatchInterface(busName), dbus.WithMatchMember("NameOwnerChanged"), dbus.WithMatchArg(0, Service)},
		{dbus.WithMatchSender(Service), dbus.WithMatchInterface(Service)},
		{dbus.WithMatchSender(Service), dbus.WithMatchInterface(deviceIface), dbus.WithMatchMember("StateChanged")},
		{dbus.WithMatchSender(Service), dbus.WithMatchInterface(propsIface), dbus.WithMatchMember("PropertiesChanged"), dbus.WithMatchArg(0, deviceIface)},
		{dbus.WithMatchSender(Service), dbus.WithMatchInterface(propsIface), dbus.WithMatchMember("PropertiesChanged"), dbus.WithMatchArg(0, activeIface)},
	}
	for _, r := range rules {
		cctx, cancel := withDeadline(ctx)
		err := c.c.AddMatchSignalContext(cctx, r...)
		cancel()
		if err != nil {
			return fmt.Errorf("subscribe to NetworkManager's signals: %w", bound(err))
		}
	}
	return nil
}

// Owner is the unique bus name of the running NetworkManager, which
// changes when it restarts; "" when it is not running.
func (c *Conn) Owner(ctx context.Context) (string, error) {
	return c.NameOwner(ctx, Service)
}

// Devices reads what NetworkManager holds of each of names (at most
// MaxLinks of them). It fails whole only when NetworkManager is not
// running (ErrNotRunning); a device that cannot be read has Err set.
func (c *Conn) Devices(ctx context.Context, names []string) ([]Device, error) {
	if len(names) > MaxLinks {
		names = names[:MaxLinks]
	}
	out := make([]Device, 0, len(names))
	for _, name := range names {
		d, err := c.Device(ctx, name)
		if errors.Is(err, ErrNotRunning) {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Device reads what NetworkManager holds of the link name; its Path is ""
// when it does not know it.
func (c *Conn) Device(ctx context.Context, name string) (Device, error) {
	d := Device{Name: name}
	if !validLinkName(name) {
		d.Err = fmt.Errorf("not a link name: %q", clip(name))
		return d, nil
	}
	var path dbus.ObjectPath
	err := c.call(ctx, c.c.Object(Service, managerPath), Service+".GetDeviceByIpIface", name).Store(&path)
	switch n := dbusErrorName(err); {
	case err == nil:
	case n == errUnknown:
		return d, nil
	case n == errNoService || n == errNoOwner:
		return d, ErrNotRunning
	default:
		d.Err = fmt.Errorf("GetDeviceByIpIface(%s): %w", name, bound(err))
		return d, nil
	}
	if !path.IsValid() || !strings.HasPrefix(string(path), managerPath+"/") {
		d.Err = fmt.Errorf("GetDeviceByIpIface(%s) gave the object %q", name, clip(string(path)))
		return d, nil
	}
	d.Path = path
	dev := c.c.Object(Service, path)
	var managed bool
	var state uint32
	var active dbus.ObjectPath
	if err := c.get(ctx, dev, deviceIface, "Managed", &managed); err != nil {
		d.Err = err
		return d, nil
	}
	if err := c.get(ctx, dev, deviceIface, "State", &state); err != nil {
		d.Err = err
		return d, nil
	}
	if err := c.get(ctx, dev, deviceIface, "ActiveConnection", &active); err != nil {
		d.Err = err
		return d, nil
	}
	d.Managed, d.State = managed, State(state)
	// Older than 1.22 it is not there, and Up stays unknown (false).
	var ifFlags uint32
	if c.get(ctx, dev, deviceIface, "InterfaceFlags", &ifFlags) == nil {
		d.Up = ifFlags&interfaceFlagUp != 0
	}
	if active == "/" || active == "" {
		return d, nil
	}
	ac := c.c.Object(Service, active)
	var id, uuid string
	var flags uint32
	// An active connection may go away between the reads: it is then
	// left out, as if it had none.
	if c.get(ctx, ac, activeIface, "Id", &id) != nil || c.get(ctx, ac, activeIface, "Uuid", &uuid) != nil {
		return d, nil
	}
	// StateFlags is newer than Id (1.10); without it External is unknown.
	c.get(ctx, ac, activeIface, "StateFlags", &flags)
	d.Connection = &Active{ID: clip(id), UUID: clip(uuid), External: flags&stateFlagExternal != 0}
	return d, nil
}

// Unmanage sets the Managed property of NetworkManager's device at path
// (Device.Path) to false: NetworkManager then leaves the link and its
// addresses alone. It is a runtime setting: a restarted NetworkManager
// reads it back from its state in /run, which a re-created link (a new
// ifindex) does not have.
func (c *Conn) Unmanage(ctx context.Context, path dbus.ObjectPath) error {
	if !path.IsValid() || !strings.HasPrefix(string(path), managerPath+"/") {
		return fmt.Errorf("not a NetworkManager object: %q", clip(string(path)))
	}
	err := c.call(ctx, c.c.Object(Service, path), propsIface+".Set", deviceIface, "Managed", dbus.MakeVariant(false)).Err
	if err != nil {
		return fmt.Errorf("set Managed=false: %w", bound(err))
	}
	return nil
}

// call is one method call, before ctx's deadline or CallTimeout.
func (c *Conn) call(ctx context.Context, obj dbus.BusObject, method string, args ...any) *dbus.Call {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	return obj.CallWithContext(ctx, method, 0, args...)
}

// get reads one property into v (a pointer to its Go type).
func (c *Conn) get(ctx context.Context, obj dbus.BusObject, iface, prop string, v any) error {
	var val dbus.Variant
	if err := c.call(ctx, obj, propsIface+".Get", iface, prop).Store(&val); err != nil {
		return fmt.Errorf("%s: %w", prop, bound(err))
	}
	if err := dbus.Store([]any{val.Value()}, v); err != nil {
		return fmt.Errorf("%s: of type %s", prop, clip(val.Signature().String()))
	}
	return nil
}

// withDeadline gives ctx a deadline of CallTimeout unless it has an
// earlier one.
func withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= CallTimeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, CallTimeout)
}

// signals turns the signals the connection receives into a coalesced
// poke; it never blocks the connection's reader.
type signals struct{ events chan struct{} }

func (s *signals) DeliverSignal(iface, name string, sig *dbus.Signal) {
	select {
	case s.events <- struct{}{}:
	default:
	}
}

// validLinkName is a name the kernel could give a link (IFNAMSIZ).
func validLinkName(s string) bool {
	if s == "" || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool { return r == '/' || r == ':' || unicode.IsSpace(r) || !unicode.IsPrint(r) })
}

// asDBusError is err's D-Bus error, if it is one.
func asDBusError(err error) (dbus.Error, bool) {
	var de dbus.Error
	if errors.As(err, &de) {
		return de, true
	}
	var dp *dbus.Error
	if errors.As(err, &dp) && dp != nil {
		return *dp, true
	}
	return dbus.Error{}, false
}

func dbusErrorName(err error) string {
	de, _ := asDBusError(err)
	return de.Name
}

// boundedError is an error from the bus, clipped.
type boundedError struct {
	msg   string
	cause error
}

func (e *boundedError) Error() string { return e.msg }
func (e *boundedError) Unwrap() error { return e.cause }

// bound makes err's text short and printable: a D-Bus error's name and
// the start of its first string; a context's error unchanged.
func bound(err error) error {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	if de, ok := asDBusError(err); ok {
		msg := clip(de.Name)
		if len(de.Body) > 0 {
			if s, ok := de.Body[0].(string); ok && s != "" {
				msg += ": " + clip(s)
			}
		}
		return &boundedError{msg, err}
	}
	return &boundedError{clip(err.Error()), err}
}

// clip keeps the start of s, at most maxString bytes of it, with
// anything unprintable replaced.
func clip(s string) string {
	cut := len(s) > maxString
	if cut {
		s = s[:maxString]
	}
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
	if cut {
		s += "..."
	}
	return s
}
