package testenv

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Monitor counts rtnetlink notifications (links, addresses, routes, rules)
// in a namespace, like `ip monitor`: a run that writes nothing to the kernel
// causes none.
type Monitor struct {
	sock  *nl.NetlinkSocket
	count atomic.Int64
	msgs  []string
	mu    sync.Mutex
	stop  atomic.Bool
	done  chan struct{}
}

// NewMonitor subscribes in n and counts until Stop.
func (n *NetNS) NewMonitor(t testing.TB) *Monitor {
	t.Helper()
	cur, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	sock, err := nl.SubscribeAt(n.Handle, cur, unix.NETLINK_ROUTE,
		unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
		unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE, unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE)
	if err != nil {
		t.Fatalf("subscribe in %s: %v", n.Name, err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	sock.SetReceiveTimeout(&tv)
	m := &Monitor{sock: sock, done: make(chan struct{})}
	n.WaitDAD(t)
	settle(sock)
	go func() {
		defer close(m.done)
		for !m.stop.Load() {
			msgs, _, err := sock.Receive()
			if err != nil {
				continue
			}
			m.mu.Lock()
			for _, msg := range msgs {
				if addrconf(msg) {
					continue
				}
				m.msgs = append(m.msgs, describe(msg))
				m.count.Add(1)
			}
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() { m.Stop() })
	return m
}

// WaitDAD waits (at most 10 s) until no IPv6 address in the namespace is
// still tentative: the kernel announces the end of IPv6 duplicate address
// detection by itself, seconds after the address was added.
func (n *NetNS) WaitDAD(t testing.TB) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		addrs, err := n.Host.AddrList()
		if err != nil {
			t.Fatalf("addresses in %s: %v", n.Name, err)
		}
		tentative := false
		for _, a := range addrs {
			tentative = tentative || a.Flags&unix.IFA_F_TENTATIVE != 0
		}
		if !tentative {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settle drains notifications until the namespace has been quiet for
// 1.2 s (at most 8 s): the kernel keeps announcing earlier changes for a
// while, and those are not writes of the run being measured. linkwatch
// batches carrier and operstate changes for up to a second (a NEWLINK with
// no flag changed), IPv6 DAD finishes later still, and TCG is slow.
func settle(sock *nl.NetlinkSocket) {
	deadline := time.Now().Add(8 * time.Second)
	quietSince := time.Now()
	for time.Now().Before(deadline) && time.Since(quietSince) < 1200*time.Millisecond {
		msgs, _, err := sock.Receive()
		if err == nil && len(msgs) > 0 {
			quietSince = time.Now()
		}
	}
}

// Stop waits for notifications still in flight, stops counting and returns
// the count and the message types seen.
func (m *Monitor) Stop() (int64, []string) {
	if !m.stop.Load() {
		time.Sleep(200 * time.Millisecond)
		m.stop.Store(true)
		<-m.done
		m.sock.Close()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.count.Load(), append([]string(nil), m.msgs...)
}

// addrconf reports whether msg is IPv6 autoconfiguration announcing its own
// per-link state (inet6_ifinfo_notify: RTM_NEWLINK with family AF_INET6,
// sent when router solicitation ends, seconds after a link comes up). The
// kernel sends it by itself; it is no link change.
func addrconf(msg syscall.NetlinkMessage) bool {
	return msg.Header.Type == unix.RTM_NEWLINK && len(msg.Data) > 0 && msg.Data[0] == unix.AF_INET6
}

// describe names a notification for failure messages: its type and, for
// links, the link, its flags and the flags that changed.
func describe(msg syscall.NetlinkMessage) string {
	s := msgType(msg.Header.Type)
	if (msg.Header.Type == unix.RTM_NEWLINK || msg.Header.Type == unix.RTM_DELLINK) && len(msg.Data) >= unix.SizeofIfInfomsg {
		info := nl.DeserializeIfInfomsg(msg.Data)
		name := ""
		if attrs, err := nl.ParseRouteAttr(msg.Data[unix.SizeofIfInfomsg:]); err == nil {
			for _, a := range attrs {
				if a.Attr.Type == unix.IFLA_IFNAME {
					name = unix.ByteSliceToString(a.Value)
				}
			}
		}
		s += fmt.Sprintf(" %s(%d) flags=%#x change=%#x", name, info.Index, info.Flags, info.Change)
	}
	return s
}

func msgType(t uint16) string {
	switch t {
	case unix.RTM_NEWLINK:
		return "NEWLINK"
	case unix.RTM_DELLINK:
		return "DELLINK"
	case unix.RTM_NEWADDR:
		return "NEWADDR"
	case unix.RTM_DELADDR:
		return "DELADDR"
	case unix.RTM_NEWROUTE:
		return "NEWROUTE"
	case unix.RTM_DELROUTE:
		return "DELROUTE"
	case unix.RTM_NEWRULE:
		return "NEWRULE"
	case unix.RTM_DELRULE:
		return "DELRULE"
	}
	return "other"
}
