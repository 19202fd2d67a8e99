package arp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

// Watch reports, until ctx ends, every ARP packet on the link that shows
// another host using one of ips: a reply or an announcement from it, or a
// request it sends from one of them. A probe for one of them (sender
// 0.0.0.0) is not use: a standby asking who holds an address is not
// claiming it. Packets this link sent are skipped. seen is called from
// Watch's goroutine. Watch returns ctx's error, or the socket's.
func (c *Conn) Watch(ctx context.Context, ips []netip.Addr, seen func(ip netip.Addr, mac net.HardwareAddr)) error {
	want := make(map[netip.Addr]bool, len(ips))
	for _, ip := range ips {
		want[ip] = true
	}
	stop := context.AfterFunc(ctx, func() { c.pc.SetReadDeadline(time.Now()) })
	defer stop()
	if err := c.pc.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		n, _, err := c.pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		var f ethernet.Frame
		if f.UnmarshalBinary(buf[:n]) != nil || f.EtherType != etherTypeARP {
			continue
		}
		var p arp.Packet
		if p.UnmarshalBinary(f.Payload) != nil {
			continue
		}
		if p.SenderHardwareAddr.String() == c.mac.String() || !want[p.SenderIP] {
			continue
		}
		seen(p.SenderIP, p.SenderHardwareAddr)
	}
}

// Link is the name of the link the socket is on.
func (c *Conn) Link() string { return c.link }
