package sdbus_test

import (
	"context"
	"testing"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"

	"github.com/nodeagent/nodeagent/netcfg/nmbus"
	"github.com/nodeagent/nodeagent/netcfg/nmbus/nmbustest"
	"github.com/nodeagent/nodeagent/netcfg/sdbus"
)

// standIn takes name on the bus at addr and, for PID 1's, serves the
// Manager's properties; it leaves the bus at the test's end or at stop.
func standIn(t *testing.T, addr, name string, props map[string]any) (stop func()) {
	t.Helper()
	c, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	if props != nil {
		m := map[string]*prop.Prop{}
		for k, v := range props {
			m[k] = &prop.Prop{Value: v}
		}
		if _, err := prop.Export(c, "/org/freedesktop/systemd1", prop.Map{"org.freedesktop.systemd1.Manager": m}); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := c.RequestName(name, dbus.NameFlagDoNotQueue); err != nil || r != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("request %s: %v %v", name, r, err)
	}
	t.Cleanup(func() { c.Close() })
	return func() { c.Close() }
}

func TestRead(t *testing.T) {
	addr := nmbustest.StartBus(t)
	ctx := context.Background()
	c, err := nmbus.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// No PID 1 on the bus, no networkd: nothing known, no error.
	f, err := sdbus.Read(ctx, c)
	if err != nil || f != (sdbus.Facts{}) {
		t.Fatalf("empty bus: %v %v", f, err)
	}
	standIn(t, addr, "org.freedesktop.systemd1", map[string]any{"Version": "252.39-1~deb12u2", "Virtualization": "qemu", "Architecture": "x86-64"})
	stop := standIn(t, addr, sdbus.Networkd, nil)
	f, err = sdbus.Read(ctx, c)
	want := sdbus.Facts{Networkd: true, Version: 252, Virtualization: "qemu", Known: true, Architecture: "x86-64"}
	if err != nil || f != want {
		t.Fatalf("got %v %v, want %v", f, err, want)
	}
	// networkd stops: its name has no owner.
	stop()
	if f, _ = sdbus.Read(ctx, c); f.Networkd {
		t.Errorf("networkd stopped but read as running: %v", f)
	}
}

// A hostile answer is not taken.
func TestReadRefusesOddAnswers(t *testing.T) {
	addr := nmbustest.StartBus(t)
	ctx := context.Background()
	c, err := nmbus.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	standIn(t, addr, "org.freedesktop.systemd1", map[string]any{"Version": "banana", "Virtualization": "qemu; rm -rf /", "Architecture": uint32(7)})
	f, err := sdbus.Read(ctx, c)
	if err != nil || f.Version != 0 || f.Known || f.Architecture != "" {
		t.Errorf("odd answers taken: %v %v", f, err)
	}
}

func TestParseVersion(t *testing.T) {
	for s, want := range map[string]int{"252.39-1~deb12u2": 252, "257": 257, "255.4-1ubuntu8": 255, "": 0, "v252": 0, "99999": 0} {
		if got := sdbus.ParseVersion(s); got != want {
			t.Errorf("%q: %d, want %d", s, got, want)
		}
	}
}
