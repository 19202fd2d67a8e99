package testenv

import (
	"sync"
	"sync/atomic"
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
	go func() {
		defer close(m.done)
		for !m.stop.Load() {
			msgs, _, err := sock.Receive()
			if err != nil {
				continue
			}
			m.mu.Lock()
			for _, msg := range msgs {
				m.msgs = append(m.msgs, msgType(msg.Header.Type))
			}
			m.mu.Unlock()
			m.count.Add(int64(len(msgs)))
		}
	}()
	t.Cleanup(func() { m.Stop() })
	return m
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
