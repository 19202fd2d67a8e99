package nmbus_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/nmbus"
	"github.com/nodeagent/nodeagent/netcfg/nmbus/nmbustest"
)

func TestDescribe(t *testing.T) {
	for _, c := range []struct {
		d          nmbus.Device
		holds      bool
		desc, want string
	}{
		{d: nmbus.Device{Name: "trunk1.50", Path: "/org/freedesktop/NetworkManager/Devices/7", Managed: true, State: nmbus.StateActivated,
			Connection: &nmbus.Active{ID: "trunk1.50", External: true}}, holds: true, want: `as its connection "trunk1.50" (external)`},
		{d: nmbus.Device{Name: "wg0", Path: "/org/freedesktop/NetworkManager/Devices/8", Managed: true, State: nmbus.StateActivated,
			Connection: &nmbus.Active{ID: "wired"}}, holds: true, want: `as its connection "wired"`},
		{d: nmbus.Device{Name: "shim0", Path: "/org/freedesktop/NetworkManager/Devices/9", Managed: true, State: nmbus.StateDisconnected},
			holds: true, want: "as managed (disconnected)"},
		{d: nmbus.Device{Name: "shim0", Path: "/org/freedesktop/NetworkManager/Devices/9", State: nmbus.StateUnmanaged}, want: "as managed (unmanaged)"},
		{d: nmbus.Device{Name: "absent"}, want: "as managed (unknown)"},
		{d: nmbus.Device{Name: "broken", Path: "/x", Managed: true, Err: errors.New("timeout")}, want: "as managed (unknown)"},
		{d: nmbus.Device{Name: "odd", Path: "/x", Managed: true, State: 77}, holds: true, want: "as managed (state 77)"},
	} {
		if got := c.d.Holds(); got != c.holds {
			t.Errorf("%s: Holds() = %v, want %v", c.d.Name, got, c.holds)
		}
		if got := c.d.Describe(); got != c.want {
			t.Errorf("%s: Describe() = %q, want %q", c.d.Name, got, c.want)
		}
	}
}

// A bus that accepts and says nothing: Dial gives up at its deadline.
func TestDialSilentBus(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "bus")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	c, err := nmbus.Dial(ctx, "unix:path="+sock)
	if err == nil {
		c.Close()
		t.Fatal("Dial to a silent bus succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Dial took %v, want about 300ms", d)
	}
	t.Logf("silent bus: %v", err)
}

func TestDialAddress(t *testing.T) {
	ctx := context.Background()
	for _, a := range []string{"tcp:host=localhost,port=1", "unix:tmpdir=/tmp", strings.Repeat("x", 5000)} {
		_, err := nmbus.Dial(ctx, a)
		if err == nil {
			t.Errorf("Dial(%.20q) succeeded", a)
			continue
		}
		if len(err.Error()) > 200 {
			t.Errorf("Dial(%.20q): an error of %d bytes", a, len(err.Error()))
		}
	}
	_, err := nmbus.Dial(ctx, "unix:path="+filepath.Join(t.TempDir(), "none"))
	if err == nil {
		t.Error("Dial to a missing socket succeeded")
	}
}

func dial(t *testing.T, addr string) *nmbus.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := nmbus.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Subscribe(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func event(t *testing.T, c *nmbus.Conn, what string) {
	t.Helper()
	select {
	case <-c.Events():
	case <-time.After(5 * time.Second):
		t.Fatalf("no event after %s", what)
	}
}

func drain(c *nmbus.Conn) {
	for {
		select {
		case <-c.Events():
		case <-time.After(100 * time.Millisecond):
			return
		}
	}
}

// Against a stand-in NetworkManager on a private bus: not running, then a
// device it holds, Unmanage, a restart, a refusal.
func TestAgainstStandIn(t *testing.T) {
	addr := nmbustest.StartBus(t)
	c := dial(t, addr)
	ctx := context.Background()

	owner, err := c.Owner(ctx)
	if err != nil || owner != "" {
		t.Fatalf("Owner() with no NetworkManager = %q, %v", owner, err)
	}
	if _, err := c.Devices(ctx, []string{"trunk1.50"}); !errors.Is(err, nmbus.ErrNotRunning) {
		t.Fatalf("Devices() with no NetworkManager: %v, want ErrNotRunning", err)
	}

	nm := nmbustest.NewNM(t, addr)
	event(t, c, "NetworkManager's start")
	nm.AddDevice("trunk1.50", "trunk1.50", true)
	nm.AddDevice("wg0", "", false)
	owner, err = c.Owner(ctx)
	if err != nil || owner == "" {
		t.Fatalf("Owner() = %q, %v", owner, err)
	}
	devs, err := c.Devices(ctx, []string{"trunk1.50", "wg0", "shim0", "bad/name"})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 4 {
		t.Fatalf("%d devices, want 4", len(devs))
	}
	d := devs[0]
	if !d.Holds() || !d.Up || d.Connection == nil || !d.Connection.External || d.Connection.ID != "trunk1.50" || d.State != nmbus.StateActivated {
		t.Errorf("trunk1.50: %+v %+v", d, d.Connection)
	}
	if !devs[1].Holds() || devs[1].Connection != nil {
		t.Errorf("wg0: %+v", devs[1])
	}
	if devs[2].Holds() || devs[2].Path != "" || devs[2].Err != nil {
		t.Errorf("shim0 (unknown to it): %+v", devs[2])
	}
	if devs[3].Err == nil {
		t.Errorf("bad/name: %+v", devs[3])
	}

	drain(c)
	if err := c.Unmanage(ctx, d.Path); err != nil {
		t.Fatal(err)
	}
	event(t, c, "Unmanage")
	if nm.Managed("trunk1.50") {
		t.Error("trunk1.50 still managed after Unmanage")
	}
	d, _ = c.Device(ctx, "trunk1.50")
	if d.Holds() || d.State != nmbus.StateUnmanaged || d.Connection != nil {
		t.Errorf("after Unmanage: %+v", d)
	}

	drain(c)
	nm.Restart()
	event(t, c, "a restart")
	owner2, err := c.Owner(ctx)
	if err != nil || owner2 == "" || owner2 == owner {
		t.Errorf("Owner() after a restart = %q (was %q), %v", owner2, owner, err)
	}
	d2, _ := c.Device(ctx, "trunk1.50")
	if !d2.Holds() || d2.Path == d.Path {
		t.Errorf("after a restart: %+v, was %s", d2, d.Path)
	}

	// A refusal, with a long message: the error is short.
	nm.Refuse("org.freedesktop.NetworkManager.PermissionDenied", strings.Repeat("Not authorized \x1b[31m", 1000))
	err = c.Unmanage(ctx, d2.Path)
	if err == nil {
		t.Fatal("Unmanage succeeded against a refusal")
	}
	if !strings.Contains(err.Error(), "PermissionDenied") || len(err.Error()) > 250 || strings.ContainsRune(err.Error(), 0x1b) {
		t.Errorf("refusal: %q", err)
	}
	if err := c.Unmanage(ctx, "/not/nm"); err == nil {
		t.Error("Unmanage of a path not NetworkManager's succeeded")
	}

	// A long Id is clipped.
	nm.SetID("trunk1.50", strings.Repeat("n", 100000))
	d3, _ := c.Device(ctx, "trunk1.50")
	if d3.Connection == nil || len(d3.Connection.ID) > 100 {
		t.Errorf("long Id kept as %d bytes", len(d3.Connection.ID))
	}

	// A hung NetworkManager: each read gives up at its deadline.
	nm.Hang(10 * time.Second)
	hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	d4, err := c.Device(hctx, "trunk1.50")
	if err != nil || d4.Err == nil || d4.Holds() {
		t.Errorf("against a hung NetworkManager: %+v, %v", d4, err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("a hung call took %v", el)
	}
	nm.Hang(0)

	nm.Stop()
	event(t, c, "NetworkManager's stop")
	if owner, err := c.Owner(ctx); err != nil || owner != "" {
		t.Errorf("Owner() after a stop = %q, %v", owner, err)
	}
}

// MaxLinks caps how many links are asked about.
func TestDevicesCap(t *testing.T) {
	addr := nmbustest.StartBus(t)
	c := dial(t, addr)
	nmbustest.NewNM(t, addr)
	names := make([]string, nmbus.MaxLinks+10)
	for i := range names {
		names[i] = "l" + strings.Repeat("x", i%10)
	}
	devs, err := c.Devices(context.Background(), names)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != nmbus.MaxLinks {
		t.Errorf("%d devices read, want %d", len(devs), nmbus.MaxLinks)
	}
}
