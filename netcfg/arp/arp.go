// Package arp does RFC 5227 duplicate-address detection before nodeagent
// claims an IPv4 address, gratuitous ARP announcements after, and plain
// neighbour probes for reachability checks.
package arp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/nodeagent/nodeagent/netcfg/host"
)

const etherTypeARP = 0x0806

// Config is how long and how hard to probe (RFC 5227 §1.1 names).
type Config struct {
	Probes        int           // PROBE_NUM
	Interval      time.Duration // gap between probes
	Wait          time.Duration // ANNOUNCE_WAIT: listen after the last probe
	Announcements int           // ANNOUNCE_NUM
}

// ConflictError says that another host answered for an address.
type ConflictError struct {
	Link string
	IP   netip.Addr
	MAC  net.HardwareAddr
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("address %s on %s is already in use by %s (ARP probe answered)", e.IP, e.Link, e.MAC)
}

// conn is an AF_PACKET socket for ARP on one link.
type conn struct {
	link string
	mac  net.HardwareAddr
	pc   *packet.Conn
}

func open(h *host.Host, link string) (*conn, error) {
	c := &conn{link: link}
	err := h.Do(func() error {
		// Both the interface lookup and the socket belong to the handle's
		// namespace; once open, the socket works from any thread.
		ifi, err := net.InterfaceByName(link)
		if err != nil {
			return err
		}
		c.mac = ifi.HardwareAddr
		c.pc, err = packet.Listen(ifi, packet.Raw, etherTypeARP, nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("arp socket on %s: %w", link, err)
	}
	if len(c.mac) != 6 {
		c.pc.Close()
		return nil, fmt.Errorf("arp on %s: link has no Ethernet address", link)
	}
	return c, nil
}

func (c *conn) send(op arp.Operation, sender, target netip.Addr) error {
	p, err := arp.NewPacket(op, c.mac, sender, ethernet.Broadcast, target)
	if err != nil {
		return err
	}
	// RFC 5227: probes and announcements carry an all-zero target hardware
	// address.
	p.TargetHardwareAddr = net.HardwareAddr{0, 0, 0, 0, 0, 0}
	pb, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	f := &ethernet.Frame{Destination: ethernet.Broadcast, Source: c.mac, EtherType: etherTypeARP, Payload: pb}
	fb, err := f.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = c.pc.WriteTo(fb, &packet.Addr{HardwareAddr: ethernet.Broadcast})
	return err
}

// Probe runs duplicate-address detection for ips on link and returns, per
// address that someone else uses, the MAC that answered. All addresses on
// the link are probed together, so the wait is paid once per link, not per
// address.
func Probe(ctx context.Context, h *host.Host, link string, ips []netip.Addr, cfg Config) (map[netip.Addr]net.HardwareAddr, error) {
	if len(ips) == 0 {
		return nil, nil
	}
	c, err := open(h, link)
	if err != nil {
		return nil, err
	}
	defer c.pc.Close()
	want := make(map[netip.Addr]bool, len(ips))
	for _, ip := range ips {
		want[ip] = true
	}
	found := map[netip.Addr]net.HardwareAddr{}
	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() { done <- c.listen(want, found, stop) }()

	probes := max(cfg.Probes, 1)
	var sendErr error
loop:
	for i := 0; i < probes; i++ {
		for _, ip := range ips {
			if err := c.send(arp.OperationRequest, netip.IPv4Unspecified(), ip); err != nil {
				sendErr = fmt.Errorf("arp probe %s on %s: %w", ip, link, err)
				break loop
			}
		}
		wait := cfg.Interval
		if i == probes-1 {
			wait = cfg.Wait
		}
		select {
		case <-ctx.Done():
			sendErr = ctx.Err()
			break loop
		case <-time.After(wait):
		}
	}
	close(stop)
	c.pc.SetReadDeadline(time.Now())
	lerr := <-done
	if sendErr != nil {
		return nil, sendErr
	}
	if lerr != nil {
		return nil, lerr
	}
	return found, nil
}

// listen records ARP packets that show another host using a wanted address
// until stop is closed. found is only read after listen returns.
func (c *conn) listen(want map[netip.Addr]bool, found map[netip.Addr]net.HardwareAddr, stop <-chan struct{}) error {
	buf := make([]byte, 1500)
	for {
		n, _, err := c.pc.ReadFrom(buf)
		if err != nil {
			select {
			case <-stop:
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			return fmt.Errorf("arp read on %s: %w", c.link, err)
		}
		var f ethernet.Frame
		if f.UnmarshalBinary(buf[:n]) != nil || f.EtherType != etherTypeARP {
			continue
		}
		var p arp.Packet
		if p.UnmarshalBinary(f.Payload) != nil {
			continue
		}
		if p.SenderHardwareAddr.String() == c.mac.String() {
			continue // our own probe, looped back to the packet socket
		}
		switch {
		case want[p.SenderIP]:
			// A reply, or anyone announcing or using the address.
			found[p.SenderIP] = p.SenderHardwareAddr
		case p.Operation == arp.OperationRequest && p.SenderIP.IsUnspecified() && want[p.TargetIP]:
			// Another host probing for the same address at the same time
			// (RFC 5227 §2.1.1): it is a conflict too.
			found[p.TargetIP] = p.SenderHardwareAddr
		}
	}
}

// Announce sends gratuitous ARP announcements for ips on link, so neighbours
// update caches that still point at a previous owner.
func Announce(ctx context.Context, h *host.Host, link string, ips []netip.Addr, cfg Config) error {
	if len(ips) == 0 || cfg.Announcements == 0 {
		return nil
	}
	c, err := open(h, link)
	if err != nil {
		return err
	}
	defer c.pc.Close()
	for i := 0; i < cfg.Announcements; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(cfg.Interval):
			}
		}
		for _, ip := range ips {
			if err := c.send(arp.OperationRequest, ip, ip); err != nil {
				return fmt.Errorf("gratuitous arp %s on %s: %w", ip, link, err)
			}
		}
	}
	return nil
}
