// Package bindwait opens a TCP listener on an address that may not be on
// the node yet. At boot nodeagent starts before the network is online
// (Before=network-online.target), so the address an operator binds the
// metrics listener to (the node's address from DHCP, the VLAN shim's that
// nodeagent itself is about to add) is often not there on the first try,
// and the kernel refuses the bind with EADDRNOTAVAIL. Listen then waits for
// the address instead of giving up: it retries when the kernel announces an
// address (an RTM_NEWADDR on its own rtnetlink socket, open only while it
// waits) and on a timer besides (Backoff), so the listener comes up as soon
// as the address does, without a restart. It logs the wait once, and the
// bind when it comes. Every other bind error (the port held by another
// program, a port below 1024 without the capability) is returned at once:
// waiting cannot mend it.
//
// IP_FREEBIND (bind an address the node does not have) would have bound
// at once, but it would also bind a mistyped address for ever without a
// word; waiting for the address says what is missing until it comes.
package bindwait

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Backoff is the timer of the retries while the address is missing: the
// first retry First after the wait began, each next one twice as late, at
// most Max apart. The address's own netlink event retries sooner; the
// timer covers a missed event (the socket overflowing, or failing to open)
// and a name in place of an address.
type Backoff struct {
	First, Max time.Duration
}

// DefaultBackoff retries after 1 s, 2 s, 4 s, then every 8 s.
var DefaultBackoff = Backoff{First: time.Second, Max: 8 * time.Second}

// Delay is the wait before timed retry n (0 for the first).
func (b Backoff) Delay(n int) time.Duration {
	if b.First <= 0 {
		b = DefaultBackoff
	}
	if b.Max < b.First {
		b.Max = b.First
	}
	d := b.First
	for i := 0; i < n && d < b.Max; i++ {
		if d > b.Max/2 {
			return b.Max
		}
		d *= 2
	}
	return min(d, b.Max)
}

// longest is the delay the retries settle at.
func (b Backoff) longest() time.Duration { return b.Delay(64) }

// Options are Listen's.
type Options struct {
	// Host is the namespace to listen in (nil: the process's own).
	Host *host.Host
	// Backoff is the retry timer; zero: DefaultBackoff.
	Backoff Backoff
	// Log gets the wait, once, and the bind that ends it; nil: no log.
	Log *slog.Logger
	// Name names the listener in the log and in errors, like
	// "metrics listener".
	Name string
}

// Missing reports whether err is the kernel refusing a bind because the
// address is not on the node (yet).
func Missing(err error) bool { return errors.Is(err, unix.EADDRNOTAVAIL) }

// Listen listens on TCP addr. While addr's IP is not on the node it waits
// for it (see the package comment) until ctx ends, which returns ctx's
// error; any other bind error it returns at once, with a hint where one
// helps. It never blocks longer than ctx allows.
func Listen(ctx context.Context, addr string, o Options) (net.Listener, error) {
	listen := func() (net.Listener, error) {
		if o.Host != nil {
			return o.Host.Listen("tcp", addr)
		}
		return net.Listen("tcp", addr)
	}
	l, err := listen()
	if err == nil {
		return l, nil
	}
	if !Missing(err) {
		return nil, o.fail(addr, err)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	// The event socket lives while Listen waits.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, serr := subscribe(wctx, o.Host, wantedIP(addr))
	if serr != nil {
		// The timer alone still gets there, later.
		o.Log.Debug(o.name()+": no address events; retrying on the timer only", "err", serr)
	}
	w := &waiter{listen: listen, events: events, after: time.After, now: time.Now, o: o, addr: addr}
	return w.run(ctx, err, serr == nil)
}

func (o Options) name() string {
	if o.Name == "" {
		return "listener"
	}
	return o.Name
}

// fail is err as Listen returns it: named, with what to do about the
// errors an operator can mend.
func (o Options) fail(addr string, err error) error {
	switch {
	case errors.Is(err, unix.EADDRINUSE):
		_, port, _ := net.SplitHostPort(addr)
		return fmt.Errorf("%s %s: %w (another program listens on the port: `ss -ltnp 'sport = :%s'` names it)", o.name(), addr, err, port)
	case errors.Is(err, unix.EACCES):
		return fmt.Errorf("%s %s: %w (a port below 1024 needs CAP_NET_BIND_SERVICE, which the unit does not grant: pick another, like 9477)", o.name(), addr, err)
	}
	return fmt.Errorf("%s %s: %w", o.name(), addr, err)
}

// waiter is Listen's retry loop, with the clock and the socket calls
// apart so that the policy can be tested without a kernel.
type waiter struct {
	listen func() (net.Listener, error)
	// events has a value when an address appeared (nil: never).
	events <-chan struct{}
	after  func(time.Duration) <-chan time.Time
	now    func() time.Time
	o      Options
	addr   string
}

// run waits after a first bind failed with first; events says whether
// address events come.
func (w *waiter) run(ctx context.Context, first error, events bool) (net.Listener, error) {
	start := w.now()
	retry := fmt.Sprintf("when an address is added, and at least every %s", w.o.Backoff.longest())
	if !events {
		retry = fmt.Sprintf("at least every %s", w.o.Backoff.longest())
	}
	w.o.Log.Warn(w.o.name()+" is waiting for its address to be on the node: not serving until it is", "addr", w.addr, "err", first, "retry", retry)
	timed := 0
	for {
		// The first try is at once: the address may have come between
		// the failed bind and the event socket's opening.
		l, err := w.listen()
		if err == nil {
			w.o.Log.Info(w.o.name()+": its address is on the node; listening", "addr", w.addr, "waited", w.now().Sub(start).Round(time.Millisecond).String())
			return l, nil
		}
		if !Missing(err) {
			return nil, w.o.fail(w.addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.after(w.o.Backoff.Delay(timed)):
			timed++
		case <-w.events:
		}
	}
}

// wantedIP is addr's IP, or the zero Addr for a name (any address event
// then retries).
func wantedIP(addr string) netip.Addr {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.Addr{}
	}
	ip, err := netip.ParseAddr(h)
	if err != nil {
		return netip.Addr{}
	}
	return ip.WithZone("").Unmap()
}

// subscribe opens an rtnetlink socket in h's namespace for address events
// and sends on the channel it returns (without blocking; one pending is
// enough) for every new or changed address that is want (any address when
// want is zero), and for lost events. The socket closes when ctx ends.
// The caller ends ctx when it stops waiting.
func subscribe(ctx context.Context, h *host.Host, want netip.Addr) (<-chan struct{}, error) {
	// NetNS 0 for the process's own namespace: no setns, which would
	// need CAP_SYS_ADMIN.
	cfg := &netlink.Config{}
	if h != nil && h.NS().IsOpen() {
		cfg.NetNS = int(h.NS())
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, cfg)
	if err != nil {
		return nil, err
	}
	for _, g := range []uint32{unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR} {
		if err := c.JoinGroup(g); err != nil {
			c.Close()
			return nil, err
		}
	}
	ch := make(chan struct{}, 1)
	kick := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	go func() {
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		defer c.Close()
		for ctx.Err() == nil {
			msgs, err := c.Receive()
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return
				}
				// Lost events (ENOBUFS) may have held ours.
				kick()
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for _, m := range msgs {
				if m.Header.Type == unix.RTM_NEWADDR && addrIs(m.Data, want) {
					kick()
					break
				}
			}
		}
	}()
	return ch, nil
}

// addrIs reports whether an RTM_NEWADDR's payload (struct ifaddrmsg, then
// attributes) is about want: its IFA_LOCAL or IFA_ADDRESS. A zero want
// matches any address.
func addrIs(data []byte, want netip.Addr) bool {
	if !want.IsValid() {
		return true
	}
	if len(data) < unix.SizeofIfAddrmsg {
		return false
	}
	attrs, err := nl.ParseRouteAttr(data[unix.SizeofIfAddrmsg:])
	if err != nil {
		return false
	}
	for _, a := range attrs {
		if a.Attr.Type != unix.IFA_LOCAL && a.Attr.Type != unix.IFA_ADDRESS {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.Value); ok && ip.Unmap() == want {
			return true
		}
	}
	return false
}
