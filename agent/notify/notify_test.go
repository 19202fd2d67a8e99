package notify

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// listen starts a unixgram socket at addr and points NOTIFY_SOCKET at it.
func listen(t *testing.T, addr string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", addr)
	return c
}

// recv reads one datagram, failing the test after a second.
func recv(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("read notify datagram: %v", err)
	}
	return string(buf[:n])
}

// expectNone checks nothing more arrives.
func expectNone(t *testing.T, c *net.UnixConn) {
	t.Helper()
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("unexpected datagram %q", buf[:n])
	}
}

func TestMessages(t *testing.T) {
	c := listen(t, filepath.Join(t.TempDir(), "notify"))
	t.Setenv("WATCHDOG_USEC", "30000000")
	t.Setenv("WATCHDOG_PID", "")
	n := New(nil)

	tests := []struct {
		name string
		call func()
		want string
	}{
		{"ready", func() { n.Ready("converged: 14 objects, 0 failed") }, "READY=1\nSTATUS=converged: 14 objects, 0 failed"},
		{"ready without status", func() { n.Ready("") }, "READY=1"},
		{"status", func() { n.Status("syncing") }, "STATUS=syncing"},
		{"status newlines folded", func() { n.Status("routes: failed\nREADY=1\r\nx\ry\n") }, "STATUS=routes: failed READY=1 x y"},
		{"stopping", n.Stopping, "STOPPING=1"},
		{"watchdog", n.Watchdog, "WATCHDOG=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.call()
			if diff := cmp.Diff(tt.want, recv(t, c)); diff != "" {
				t.Errorf("datagram (-want +got):\n%s", diff)
			}
		})
	}
	expectNone(t, c)
}

func TestReloadingCarriesMonotonicTime(t *testing.T) {
	c := listen(t, filepath.Join(t.TempDir(), "notify"))
	n := New(nil)

	before := monotonicUsec()
	n.Reloading()
	got := recv(t, c)
	after := monotonicUsec()

	first, usec, ok := strings.Cut(got, "\nMONOTONIC_USEC=")
	if !ok || first != "RELOADING=1" {
		t.Fatalf("datagram %q, want RELOADING=1\\nMONOTONIC_USEC=<n>", got)
	}
	v, err := strconv.ParseInt(usec, 10, 64)
	if err != nil {
		t.Fatalf("MONOTONIC_USEC %q: %v", usec, err)
	}
	if v < before || v > after {
		t.Errorf("MONOTONIC_USEC %d not within [%d, %d]", v, before, after)
	}
}

func TestAbstractSocket(t *testing.T) {
	// systemd may hand out an abstract socket ("@..."), e.g. in containers.
	b := make([]byte, 8)
	rand.Read(b)
	c := listen(t, "@nodeagent-notify-test-"+hex.EncodeToString(b))
	New(nil).Status("abstract")
	if got := recv(t, c); got != "STATUS=abstract" {
		t.Errorf("datagram %q, want STATUS=abstract", got)
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	tests := []struct {
		name     string
		usec     string
		pid      string
		want     time.Duration
		wantWarn bool
	}{
		{name: "unset", want: 0},
		{name: "30s", usec: "30000000", want: 30 * time.Second},
		{name: "for this pid", usec: "500000", pid: self, want: 500 * time.Millisecond},
		{name: "for another pid", usec: "500000", pid: "1", want: 0},
		{name: "garbage", usec: "soon", want: 0, wantWarn: true},
		{name: "zero", usec: "0", want: 0, wantWarn: true},
		{name: "bad pid", usec: "500000", pid: "me", want: 0, wantWarn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := listen(t, filepath.Join(t.TempDir(), "notify"))
			t.Setenv("WATCHDOG_USEC", tt.usec)
			t.Setenv("WATCHDOG_PID", tt.pid)
			var logs bytes.Buffer
			n := New(slog.New(slog.NewTextHandler(&logs, nil)))
			if got := n.WatchdogInterval(); got != tt.want {
				t.Errorf("WatchdogInterval() = %v, want %v", got, tt.want)
			}
			if gotWarn := strings.Contains(logs.String(), "level=WARN"); gotWarn != tt.wantWarn {
				t.Errorf("warned = %v, want %v; log:\n%s", gotWarn, tt.wantWarn, logs.String())
			}
			// Without a watchdog for us, pings are not sent at all.
			n.Watchdog()
			if tt.want == 0 {
				expectNone(t, c)
			} else if got := recv(t, c); got != "WATCHDOG=1" {
				t.Errorf("datagram %q, want WATCHDOG=1", got)
			}
		})
	}
}

func TestUnsetSocketIsNoop(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "1000000")
	var logs bytes.Buffer
	n := New(slog.New(slog.NewTextHandler(&logs, nil)))
	if n.Enabled() {
		t.Error("Enabled() = true without NOTIFY_SOCKET")
	}
	if got := n.WatchdogInterval(); got != 0 {
		t.Errorf("WatchdogInterval() = %v without NOTIFY_SOCKET, want 0", got)
	}
	calls(n)
	if logs.Len() != 0 {
		t.Errorf("no-op notifier logged:\n%s", logs.String())
	}

	// The nil and zero Notifiers are no-ops too, so callers need no guard.
	calls(nil)
	calls(&Notifier{})
}

func TestSocketReadOnce(t *testing.T) {
	// A notifier created without NOTIFY_SOCKET stays off even if it appears
	// later, and one created with it keeps its decision.
	t.Setenv("NOTIFY_SOCKET", "")
	off := New(nil)
	c := listen(t, filepath.Join(t.TempDir(), "notify"))
	off.Status("should not arrive")
	expectNone(t, c)
}

func TestSendFailureLoggedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	c := listen(t, path)
	var logs bytes.Buffer
	n := New(slog.New(slog.NewTextHandler(&logs, nil)))
	c.Close() // systemd went away: the socket file remains, nobody reads it

	for range 3 {
		n.Status("lost")
	}
	if got := strings.Count(logs.String(), "level=WARN"); got != 1 {
		t.Errorf("%d warnings for 3 failed sends, want 1; log:\n%s", got, logs.String())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	c2 := listen(t, path) // systemd is back (daemon-reexec re-creates it)
	n.Status("back")
	if got := recv(t, c2); got != "STATUS=back" {
		t.Errorf("datagram %q, want STATUS=back", got)
	}
	if !strings.Contains(logs.String(), "sd_notify works again") {
		t.Errorf("recovery not logged; log:\n%s", logs.String())
	}
}

func calls(n *Notifier) {
	n.Ready("x")
	n.Status("x")
	n.Reloading()
	n.Stopping()
	n.Watchdog()
	_ = n.WatchdogInterval()
}
