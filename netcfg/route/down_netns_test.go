package route

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

// TestRouteOnDownDevicePends: a route on a device that exists but is down
// (a tun its program has made and not yet set up) is pending, not failed:
// the kernel refuses it with ENETDOWN, and the device's up event brings the
// sync that adds it. A failure would be retried with backoff and logged as
// a failed sync for what is a normal step of another program.
func TestRouteOnDownDevicePends(t *testing.T) {
	ns := testenv.NewNetNS(t)
	ns.Exec(t, "ip", "tuntap", "add", "dev", "tun9", "mode", "tun")
	r := Route{Table: 150, To: netip.MustParsePrefix("0.0.0.0/0"), Type: unix.RTN_UNICAST, Dev: "tun9", Scope: unix.RT_SCOPE_LINK}
	d := Desired{Routes: []Route{r}}
	ctx := context.Background()
	apply := func() error {
		o, err := Observe(ctx, ns.Host.Snapshot(), d)
		if err != nil {
			t.Fatal(err)
		}
		_, rep := Apply(ctx, ns.Host.Snapshot(), MakePlan(d, o))
		return rep.Err()
	}
	err := apply()
	var pe *host.PendingError
	if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "device tun9 is down") {
		t.Fatalf("apply with tun9 down: %v; want pending, device tun9 is down", err)
	}
	ns.Exec(t, "ip", "link", "set", "tun9", "up")
	if err := apply(); err != nil {
		t.Fatalf("apply with tun9 up: %v", err)
	}
	if out := ns.Exec(t, "ip", "route", "show", "table", "150"); !strings.Contains(out, "default dev tun9") {
		t.Errorf("table 150 once tun9 is up: %s", out)
	}
}
