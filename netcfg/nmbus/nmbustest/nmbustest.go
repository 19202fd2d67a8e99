// Package nmbustest runs a private D-Bus daemon and a stand-in for
// NetworkManager on it, for tests of package nmbus and its users: the
// host's NetworkManager is never started by a test (it would take the
// host's network).
package nmbustest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

const (
	service     = "org.freedesktop.NetworkManager"
	managerPath = "/org/freedesktop/NetworkManager"
	deviceIface = service + ".Device"
	activeIface = service + ".Connection.Active"
	propsIface  = "org.freedesktop.DBus.Properties"
)

// StartBus runs a dbus-daemon of the test's own, stopped at the test's
// end, and returns its address. The test is skipped where dbus-daemon is
// not installed, and fails for it under CI, which installs it.
func StartBus(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("dbus-daemon")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("dbus-daemon is missing; testenv/deps.sh test installs it (Debian: dbus-daemon)")
		}
		t.Skip("dbus-daemon is not installed (Debian: dbus-daemon)")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "bus")
	conf := filepath.Join(dir, "bus.conf")
	err = os.WriteFile(conf, []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=`+sock+`</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config-file="+conf, "--nofork", "--nopidfile", "--print-address=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("dbus-daemon:\n%s", stderr.Bytes())
		}
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case addr := <-line:
		if addr == "" {
			t.Fatal("dbus-daemon printed no address")
		}
		return "unix:path=" + sock
	case <-time.After(10 * time.Second):
		t.Fatal("dbus-daemon did not start in 10 s")
	}
	return ""
}

// NM stands in for NetworkManager: it owns its name on the bus, answers
// GetDeviceByIpIface and the properties nmbus reads, takes Managed=false,
// and emits StateChanged when a device changes.
type NM struct {
	t    testing.TB
	addr string

	mu      sync.Mutex
	conn    *dbus.Conn
	devices map[string]*device // by name
	next    int
	// Hang makes every call wait this long before it is answered.
	hang time.Duration
	// RefuseManaged makes a Set of Managed fail with this D-Bus error.
	refuse *dbus.Error
	// KeepUnmanaged says whether a device keeps Managed=false across a
	// Restart (as NetworkManager does for a link that keeps its ifindex).
	KeepUnmanaged bool
	sets          int
}

type device struct {
	name     string
	path     dbus.ObjectPath
	managed  bool
	state    uint32
	conn     dbus.ObjectPath
	id, uuid string
	flags    uint32
}

// NewNM starts a stand-in NetworkManager on the bus at addr; it stops at
// the test's end.
func NewNM(t testing.TB, addr string) *NM {
	nm := &NM{t: t, addr: addr, devices: map[string]*device{}}
	nm.Start()
	t.Cleanup(nm.Stop)
	return nm
}

// Start connects to the bus and takes NetworkManager's name.
func (nm *NM) Start() {
	nm.t.Helper()
	c, err := dbus.Connect(nm.addr)
	if err != nil {
		nm.t.Fatal(err)
	}
	if err := c.Export(manager{nm}, managerPath, service); err != nil {
		nm.t.Fatal(err)
	}
	r, err := c.RequestName(service, dbus.NameFlagDoNotQueue)
	if err != nil || r != dbus.RequestNameReplyPrimaryOwner {
		nm.t.Fatalf("request %s: %v %v", service, r, err)
	}
	nm.mu.Lock()
	nm.conn = c
	for _, d := range nm.devices {
		nm.exportLocked(d)
	}
	nm.mu.Unlock()
}

// Stop leaves the bus, as a NetworkManager that stopped.
func (nm *NM) Stop() {
	nm.mu.Lock()
	c := nm.conn
	nm.conn = nil
	nm.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Restart stops and starts it: a new owner of the name, whose devices
// are new objects; a device is managed again unless KeepUnmanaged.
func (nm *NM) Restart() {
	nm.Stop()
	nm.mu.Lock()
	for _, d := range nm.devices {
		nm.next++
		d.path = dbus.ObjectPath(fmt.Sprintf("%s/Devices/%d", managerPath, nm.next))
		if !nm.KeepUnmanaged {
			d.managed = true
		}
		if d.managed {
			d.state = 100
		}
	}
	nm.mu.Unlock()
	nm.Start()
}

// AddDevice adds a managed, activated device for the link name, with an
// active connection id (external or not); id "" gives it none.
func (nm *NM) AddDevice(name, id string, external bool) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	nm.next++
	d := &device{name: name, managed: true, state: 100, id: id, uuid: fmt.Sprintf("00000000-0000-4000-8000-%012d", nm.next)}
	d.path = dbus.ObjectPath(fmt.Sprintf("%s/Devices/%d", managerPath, nm.next))
	if id != "" {
		d.conn = dbus.ObjectPath(fmt.Sprintf("%s/ActiveConnection/%d", managerPath, nm.next))
		d.flags = 0x1c
		if external {
			d.flags |= 0x80
		}
	}
	nm.devices[name] = d
	nm.exportLocked(d)
	nm.emitLocked(managerPath, service+".DeviceAdded", d.path)
}

// SetManaged sets a device's Managed, as an operator's nmcli would, and
// signals it.
func (nm *NM) SetManaged(name string, managed bool) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	d := nm.devices[name]
	nm.setManagedLocked(d, managed)
}

// Managed says whether the device for name is managed.
func (nm *NM) Managed(name string) bool {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	return nm.devices[name].managed
}

// Sets counts the Sets of Managed it was sent.
func (nm *NM) Sets() int {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	return nm.sets
}

// Hang makes calls wait d before they are answered.
func (nm *NM) Hang(d time.Duration) {
	nm.mu.Lock()
	nm.hang = d
	nm.mu.Unlock()
}

// Refuse makes a Set of Managed fail with the error name and message.
func (nm *NM) Refuse(name, msg string) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	if name == "" {
		nm.refuse = nil
		return
	}
	nm.refuse = &dbus.Error{Name: name, Body: []any{msg}}
}

// SetID gives the device's active connection another Id.
func (nm *NM) SetID(name, id string) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	nm.devices[name].id = id
}

func (nm *NM) setManagedLocked(d *device, managed bool) {
	old := d.state
	d.managed = managed
	if managed {
		d.state = 100
	} else {
		d.state = 10
	}
	nm.emitLocked(d.path, deviceIface+".StateChanged", d.state, old, uint32(0))
}

func (nm *NM) exportLocked(d *device) {
	if nm.conn == nil {
		return
	}
	nm.conn.Export(props{nm, d.name, false}, d.path, propsIface)
	if d.conn != "" {
		nm.conn.Export(props{nm, d.name, true}, d.conn, propsIface)
	}
}

func (nm *NM) emitLocked(path dbus.ObjectPath, name string, args ...any) {
	if nm.conn != nil {
		nm.conn.Emit(path, name, args...)
	}
}

func (nm *NM) wait() {
	nm.mu.Lock()
	d := nm.hang
	nm.mu.Unlock()
	time.Sleep(d)
}

type manager struct{ nm *NM }

func (m manager) GetDeviceByIpIface(name string) (dbus.ObjectPath, *dbus.Error) {
	m.nm.wait()
	m.nm.mu.Lock()
	defer m.nm.mu.Unlock()
	d, ok := m.nm.devices[name]
	if !ok {
		return "", &dbus.Error{Name: service + ".UnknownDevice", Body: []any{"No device found for the requested iface."}}
	}
	return d.path, nil
}

// props is the Properties interface of a device (or of its active
// connection).
type props struct {
	nm     *NM
	name   string
	active bool
}

func (p props) Get(iface, prop string) (dbus.Variant, *dbus.Error) {
	p.nm.wait()
	p.nm.mu.Lock()
	defer p.nm.mu.Unlock()
	d := p.nm.devices[p.name]
	var v any
	switch {
	case p.active && iface == activeIface && prop == "Id":
		v = d.id
	case p.active && iface == activeIface && prop == "Uuid":
		v = d.uuid
	case p.active && iface == activeIface && prop == "StateFlags":
		v = d.flags
	case !p.active && iface == deviceIface && prop == "Managed":
		v = d.managed
	case !p.active && iface == deviceIface && prop == "State":
		v = d.state
	case !p.active && iface == deviceIface && prop == "InterfaceFlags":
		v = uint32(0x10003) // up, lower up, carrier
	case !p.active && iface == deviceIface && prop == "ActiveConnection":
		v = dbus.ObjectPath("/")
		if d.managed && d.conn != "" {
			v = d.conn
		}
	default:
		return dbus.Variant{}, &dbus.Error{Name: "org.freedesktop.DBus.Error.InvalidArgs", Body: []any{"no such property " + prop}}
	}
	return dbus.MakeVariant(v), nil
}

func (p props) Set(iface, prop string, v dbus.Variant) *dbus.Error {
	p.nm.wait()
	p.nm.mu.Lock()
	defer p.nm.mu.Unlock()
	if p.active || iface != deviceIface || prop != "Managed" {
		return &dbus.Error{Name: "org.freedesktop.DBus.Error.PropertyReadOnly", Body: []any{"read-only"}}
	}
	p.nm.sets++
	if p.nm.refuse != nil {
		return p.nm.refuse
	}
	b, ok := v.Value().(bool)
	if !ok {
		return &dbus.Error{Name: "org.freedesktop.DBus.Error.InvalidArgs", Body: []any{"not a boolean"}}
	}
	p.nm.setManagedLocked(p.nm.devices[p.name], b)
	return nil
}
