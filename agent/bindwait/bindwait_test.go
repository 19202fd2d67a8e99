package bindwait

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func TestBackoffDelay(t *testing.T) {
	s := time.Second
	for _, tt := range []struct {
		b    Backoff
		n    int
		want time.Duration
	}{
		{DefaultBackoff, 0, s}, {DefaultBackoff, 1, 2 * s}, {DefaultBackoff, 2, 4 * s},
		{DefaultBackoff, 3, 8 * s}, {DefaultBackoff, 4, 8 * s}, {DefaultBackoff, 1000, 8 * s},
		{Backoff{}, 0, s}, {Backoff{}, 5, 8 * s}, // zero: the default
		{Backoff{First: 3 * s, Max: s}, 4, 3 * s}, // Max below First: First
		{Backoff{First: 5 * s, Max: 12 * s}, 1, 10 * s},
		{Backoff{First: 5 * s, Max: 12 * s}, 2, 12 * s},
		{Backoff{First: 1, Max: math.MaxInt64}, 200, math.MaxInt64}, // no overflow
	} {
		if got := tt.b.Delay(tt.n); got != tt.want {
			t.Errorf("%+v.Delay(%d) = %s, want %s", tt.b, tt.n, got, tt.want)
		}
	}
}

// bindErr is the error net.Listen returns for a bind the kernel refused.
func bindErr(errno unix.Errno) error {
	return &net.OpError{Op: "listen", Net: "tcp", Err: os.NewSyscallError("bind", errno)}
}

// fakeListener is what a successful fake bind returns.
type fakeListener struct{ net.Listener }

// script is a waiter over a list of bind results and a clock that the
// test drives: each timer the waiter asks for is recorded, and fires at
// once when fire is set.
type script struct {
	results []error
	tries   int
	delays  []time.Duration
	fire    bool
	log     testenv.SyncBuffer
}

func (s *script) waiter(events <-chan struct{}) *waiter {
	now := time.Unix(0, 0)
	return &waiter{
		listen: func() (net.Listener, error) {
			s.tries++
			err := s.results[0]
			if len(s.results) > 1 {
				s.results = s.results[1:]
			}
			if err != nil {
				return nil, err
			}
			return fakeListener{}, nil
		},
		events: events,
		after: func(d time.Duration) <-chan time.Time {
			s.delays = append(s.delays, d)
			now = now.Add(d)
			c := make(chan time.Time, 1)
			if s.fire {
				c <- now
			}
			return c
		},
		now:  func() time.Time { return now },
		o:    Options{Name: "metrics listener", Log: slog.New(slog.NewTextHandler(&s.log, nil))},
		addr: "10.77.0.1:9477",
	}
}

// TestRetriesOnTheTimer: with no address event, the waiter retries on the
// backoff (1 s, 2 s, 4 s, then 8 s apart), says once that it waits, and
// once that it bound, with how long it waited.
func TestRetriesOnTheTimer(t *testing.T) {
	missing := bindErr(unix.EADDRNOTAVAIL)
	s := &script{results: []error{missing, missing, missing, missing, missing, missing, nil}, fire: true}
	l, err := s.waiter(nil).run(context.Background(), missing, false)
	if err != nil || l == nil {
		t.Fatalf("run = %v, %v; want a listener", l, err)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}
	if !slices.Equal(s.delays, want) {
		t.Errorf("timed retries after %v, want %v", s.delays, want)
	}
	if s.tries != 7 {
		t.Errorf("%d binds, want 7", s.tries)
	}
	log := s.log.String()
	if n := strings.Count(log, "is waiting for its address"); n != 1 {
		t.Errorf("the wait logged %d times, want once:\n%s", n, log)
	}
	if !strings.Contains(log, "at least every 8s") || !strings.Contains(log, "cannot assign requested address") {
		t.Errorf("the wait's line does not say how it retries and why:\n%s", log)
	}
	if !strings.Contains(log, "waited=31s") || !strings.Contains(log, "addr=10.77.0.1:9477") {
		t.Errorf("the bind's line does not say how long it waited (31s):\n%s", log)
	}
}

// TestRetriesOnTheEvent: an address event retries at once, without the
// timer firing.
func TestRetriesOnTheEvent(t *testing.T) {
	missing := bindErr(unix.EADDRNOTAVAIL)
	s := &script{results: []error{missing, nil}}
	ev := make(chan struct{}, 1)
	ev <- struct{}{}
	l, err := s.waiter(ev).run(context.Background(), missing, true)
	if err != nil || l == nil {
		t.Fatalf("run = %v, %v; want a listener", l, err)
	}
	if s.tries != 2 || len(s.delays) != 1 {
		t.Errorf("%d binds and %d timers; want 2 binds, the second on the event before its timer", s.tries, len(s.delays))
	}
	if !strings.Contains(s.log.String(), "when an address is added") {
		t.Errorf("the wait's line does not say it retries on the event:\n%s", s.log.String())
	}
}

// TestOtherErrorsEndTheWait: a bind refused for another reason than the
// address ends the wait with that error and what to do about it.
func TestOtherErrorsEndTheWait(t *testing.T) {
	missing := bindErr(unix.EADDRNOTAVAIL)
	s := &script{results: []error{missing, bindErr(unix.EADDRINUSE)}, fire: true}
	_, err := s.waiter(nil).run(context.Background(), missing, false)
	if !errors.Is(err, unix.EADDRINUSE) || !strings.Contains(err.Error(), "metrics listener 10.77.0.1:9477") || !strings.Contains(err.Error(), "ss -ltnp 'sport = :9477'") {
		t.Errorf("err = %v; want EADDRINUSE naming the listener and how to find the port's holder", err)
	}
	if s.tries != 2 {
		t.Errorf("%d binds, want 2 (none after the error)", s.tries)
	}
}

func TestContextEndsTheWait(t *testing.T) {
	missing := bindErr(unix.EADDRNOTAVAIL)
	s := &script{results: []error{missing}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.waiter(nil).run(ctx, missing, true); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

// TestKernelErrors: the kernel's own answers are classified as Listen
// needs them: an address not on the node waits, a port in use does not.
func TestKernelErrors(t *testing.T) {
	// 192.0.2.1 (TEST-NET-1) is on no machine's interface.
	if _, err := net.Listen("tcp", "192.0.2.1:0"); !Missing(err) {
		t.Errorf("bind of an address not on the node: %v, want EADDRNOTAVAIL", err)
	}
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var log testenv.SyncBuffer
	_, err = Listen(ctx, held.Addr().String(), Options{Name: "metrics listener", Log: slog.New(slog.NewTextHandler(&log, nil))})
	if Missing(err) || !errors.Is(err, unix.EADDRINUSE) || !strings.Contains(err.Error(), "another program listens on the port") {
		t.Errorf("a port in use: %v, want EADDRINUSE at once, with a hint", err)
	}
	if log.String() != "" {
		t.Errorf("a port in use was logged as a wait:\n%s", log.String())
	}
}

func TestWantedIP(t *testing.T) {
	for in, want := range map[string]string{
		"10.77.0.1:9477":         "10.77.0.1",
		"[fd00::1]:9477":         "fd00::1",
		"[fe80::1%eth0]:9477":    "fe80::1",
		"[::ffff:10.0.0.1]:9477": "10.0.0.1",
		"node-a:9477":            "invalid IP",
		"10.77.0.1":              "invalid IP", // no port: net.Listen refuses it anyway
	} {
		if got := wantedIP(in).String(); got != want {
			t.Errorf("wantedIP(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestAddrIs: an RTM_NEWADDR is ours by its IFA_LOCAL or IFA_ADDRESS.
func TestAddrIs(t *testing.T) {
	msg := func(family int, attrs ...*nl.RtAttr) []byte {
		b := nl.NewIfAddrmsg(family).Serialize()
		for _, a := range attrs {
			b = append(b, a.Serialize()...)
		}
		return b
	}
	v4 := msg(unix.AF_INET, nl.NewRtAttr(unix.IFA_ADDRESS, []byte{10, 77, 0, 1}), nl.NewRtAttr(unix.IFA_LOCAL, []byte{10, 77, 0, 1}))
	ptp := msg(unix.AF_INET, nl.NewRtAttr(unix.IFA_ADDRESS, []byte{10, 9, 9, 9}), nl.NewRtAttr(unix.IFA_LOCAL, []byte{10, 77, 0, 1}))
	v6 := msg(unix.AF_INET6, nl.NewRtAttr(unix.IFA_ADDRESS, netip.MustParseAddr("fd00::1").AsSlice()))
	for _, tt := range []struct {
		name string
		data []byte
		want string
		is   bool
	}{
		{"v4", v4, "10.77.0.1", true},
		{"v4 other", v4, "10.77.0.2", false},
		{"point-to-point local", ptp, "10.77.0.1", true},
		{"v6", v6, "fd00::1", true},
		{"v6 other", v6, "fd00::2", false},
		{"short", v4[:4], "10.77.0.1", false},
	} {
		if got := addrIs(tt.data, netip.MustParseAddr(tt.want)); got != tt.is {
			t.Errorf("%s: addrIs(%s) = %v, want %v", tt.name, tt.want, got, tt.is)
		}
	}
	if !addrIs(v6, netip.Addr{}) {
		t.Error("a name's wait (zero address) does not retry on every address")
	}
}
