package bindwait

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

// TestListenWaitsForTheAddress, in a fresh namespace: a listener on an
// address the namespace does not have yet waits, logging it once; adding
// the address binds it on the kernel's event, long before the timer (a
// minute here) would have; the listener is the namespace's and accepts.
// For IPv6 the address is first tentative (duplicate address detection
// on a link with a carrier), which the kernel refuses to bind too: the
// event at the end of detection binds it.
func TestListenWaitsForTheAddress(t *testing.T) {
	for _, tt := range []struct{ name, addr, cidr string }{
		{"IPv4", "10.77.0.1:9477", "10.77.0.1/24"},
		{"IPv6 after DAD", "[fd00:77::1]:9477", "fd00:77::1/64"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
			ns.Veth(t, "eth0", peer, "eth0")
			var log testenv.SyncBuffer
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			type result struct {
				l   net.Listener
				err error
				at  time.Time
			}
			done := make(chan result, 1)
			go func() {
				l, err := Listen(ctx, tt.addr, Options{Host: ns.Host, Backoff: Backoff{First: time.Minute, Max: time.Minute},
					Name: "metrics listener", Log: slog.New(slog.NewTextHandler(&log, nil))})
				done <- result{l, err, time.Now()}
			}()
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(log.String(), "is waiting for its address") {
				if time.Now().After(deadline) {
					t.Fatalf("no wait logged within 10s:\n%s", log.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			select {
			case r := <-done:
				t.Fatalf("Listen returned before the address was there: %v, %v", r.l, r.err)
			case <-time.After(300 * time.Millisecond):
			}
			added := time.Now()
			ns.Exec(t, "ip", "addr", "add", tt.cidr, "dev", "eth0")
			var r result
			select {
			case r = <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("not bound 20s after the address was added (the timer is a minute away):\n%s", log.String())
			}
			if r.err != nil {
				t.Fatalf("Listen: %v", r.err)
			}
			defer r.l.Close()
			t.Logf("bound %s after the address was added", r.at.Sub(added).Round(time.Millisecond))
			if n := strings.Count(log.String(), "is waiting for its address"); n != 1 {
				t.Errorf("the wait logged %d times, want once:\n%s", n, log.String())
			}
			go func() {
				if c, err := r.l.Accept(); err == nil {
					c.Write([]byte("ok"))
					c.Close()
				}
			}()
			c, err := ns.Host.DialContext(ctx, "tcp", tt.addr)
			if err != nil {
				t.Fatalf("dial %s in the namespace: %v", tt.addr, err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 2)
			if _, err := c.Read(b); err != nil || string(b) != "ok" {
				t.Errorf("read from the listener: %q, %v", b, err)
			}
		})
	}
}

// TestListenPortInUse, in a fresh namespace: the port held by another
// listener is an error at once, not a wait.
func TestListenPortInUse(t *testing.T) {
	ns := testenv.NewNetNS(t)
	held, err := ns.Host.Listen("tcp", "127.0.0.1:9477")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	var log testenv.SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Listen(ctx, "127.0.0.1:9477", Options{Host: ns.Host, Name: "metrics listener", Log: slog.New(slog.NewTextHandler(&log, nil))})
	if !errors.Is(err, unix.EADDRINUSE) || !strings.Contains(err.Error(), "metrics listener 127.0.0.1:9477") {
		t.Errorf("err = %v, want EADDRINUSE naming the listener", err)
	}
	if log.String() != "" {
		t.Errorf("logged a wait for a port in use:\n%s", log.String())
	}
}
