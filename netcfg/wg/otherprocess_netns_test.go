package wg_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestObserveAnotherProcessUserspaceDevice (issue 29 §5): a one-shot
// `nodeagent plan` beside the daemon sees the daemon's userspace device as
// a WireGuard device read through its UAPI socket, not as "a tun link,
// not a WireGuard device", and a converged device plans nothing. A tun
// link with a socket file nobody serves is still not WireGuard.
func TestObserveAnotherProcessUserspaceDevice(t *testing.T) {
	l := newLab(t)
	a, b := testenv.NewNetNS(t), testenv.NewNetNS(t)
	a.Veth(t, "eth0", b, "eth0")
	a.Exec(t, "ip", "addr", "add", "198.18.0.1/24", "dev", "eth0")
	ka, _ := l.key("a")
	_, pb := l.key("b")
	na := devName("wga")
	da := l.desired(tunnelYAML(na, wg.ImplUserspace, ka, 51820, "10.99.0.1/24", pb, "10.99.0.2/32", "198.18.0.2:51821", l.psk("ab")))
	l.sync(l.handle(a), da, false) // the "daemon": this test's Userspace runs the device

	// The one-shot: no Userspace of its own.
	other := &wg.Handle{Host: a.Host, Log: l.log}
	t.Cleanup(other.Close)
	o, err := wg.Observe(context.Background(), other, a.Host.Snapshot(), da)
	if err != nil {
		t.Fatal(err)
	}
	od := o.Devices[na]
	if od.Impl != wg.ImplUserspace || len(od.Peers) != 1 {
		t.Fatalf("observed %s as impl %q with %d peer(s); want userspace with 1", na, od.Impl, len(od.Peers))
	}
	p := wg.MakePlan(da, o)
	l.record(p.String())
	if !p.Empty() {
		t.Fatalf("the daemon's converged device, seen by another process, plans:\n%s", p)
	}

	// A tun of another name with a stale socket file: not WireGuard.
	nt := devName("tun")
	a.Exec(t, "ip", "tuntap", "add", "dev", nt, "mode", "tun")
	path := "/var/run/wireguard/" + nt + ".sock"
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	ul.Close() // the file stays, served by nobody
	t.Cleanup(func() { os.Remove(path) })
	o, err = wg.Observe(context.Background(), other, a.Host.Snapshot(), wg.Desired{Devices: []wg.Device{{Name: nt}}})
	if err != nil {
		t.Fatalf("observe with a stale socket: %v", err)
	}
	if od := o.Devices[nt]; od.Impl != "" {
		t.Fatalf("a tun with a stale socket file observed as %q", od.Impl)
	}
	if p := wg.MakePlan(wg.Desired{Devices: []wg.Device{{Name: nt}}}, o); !strings.Contains(p.String(), "not a WireGuard device") {
		t.Fatalf("plan for a tun with a stale socket:\n%s", p)
	}
}
