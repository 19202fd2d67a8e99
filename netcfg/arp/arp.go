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

// Conn is an AF_PACKET socket for ARP on one link.
type Conn struct {
	link string
	mac  net.HardwareAddr
	pc   *packet.Conn
}

// Open opens an ARP socket on each link, all in one pass inside the
// handle's namespace (a socket belongs to the namespace of the thread that
// creates it; once open it works from any thread). The interfaces are
// passed in rather than looked up by name: net.InterfaceByName dumps every
// link, which with a thousand links is a thousand dumps of a thousand.
func Open(h *host.Host, ifis []*net.Interface) ([]*Conn, error) {
	conns := make([]*Conn, 0, len(ifis))
	err := h.Do(func() error {
		for _, ifi := range ifis {
			if len(ifi.HardwareAddr) != 6 {
				return fmt.Errorf("arp on %s: link has no Ethernet address", ifi.Name)
			}
			pc, err := packet.Listen(ifi, packet.Raw, etherTypeARP, nil)
			if err != nil {
				return fmt.Errorf("arp socket on %s: %w", ifi.Name, err)
			}
			conns = append(conns, &Conn{link: ifi.Name, mac: ifi.HardwareAddr, pc: pc})
		}
		return nil
	})
	if err != nil {
		for _, c := range conns {
			c.Close()
		}
		return nil, err
	}
	return conns, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.pc.Close() }

func (c *Conn) send(op arp.Operation, sender, target netip.Addr) error {
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

// Probe runs duplicate-address detection for ips on the link and returns,
// per address that someone else uses, the MAC that answered. All addresses
// on the link are probed together, so the wait is paid once per link, not
// per address (and callers probe links in parallel).
func (c *Conn) Probe(ctx context.Context, ips []netip.Addr, cfg Config) (map[netip.Addr]net.HardwareAddr, error) {
	if len(ips) == 0 {
		return nil, nil
	}
	link := c.link
	want := make(map[netip.Addr]bool, len(ips))
	for _, ip := range ips {
		want[ip] = true
	}
	found := map[netip.Addr]net.HardwareAddr{}
	// A probe before this one on the socket ended with a deadline in the
	// past, to stop its listener; this one listens until it stops it.
	if err := c.pc.SetReadDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("arp on %s: %w", link, err)
	}
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
func (c *Conn) listen(want map[netip.Addr]bool, found map[netip.Addr]net.HardwareAddr, stop <-chan struct{}) error {
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

// Announce sends gratuitous ARP announcements for ips on the link, so
// neighbours update caches that still point at a previous owner.
func (c *Conn) Announce(ctx context.Context, ips []netip.Addr, cfg Config) error {
	if len(ips) == 0 || cfg.Announcements == 0 {
		return nil
	}
	link := c.link
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

// Resolve asks for target's hardware address from sender (an address of
// this link), up to attempts times, waiting wait for a reply after each,
// and returns the first answer.
func (c *Conn) Resolve(ctx context.Context, sender, target netip.Addr, attempts int, wait time.Duration) (net.HardwareAddr, error) {
	want := map[netip.Addr]bool{target: true}
	for i := 0; i < max(attempts, 1); i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := c.send(arp.OperationRequest, sender, target); err != nil {
			return nil, fmt.Errorf("arp request for %s on %s: %w", target, c.link, err)
		}
		found := map[netip.Addr]net.HardwareAddr{}
		c.pc.SetReadDeadline(time.Now().Add(wait))
		if err := c.listen(want, found, nil); err != nil {
			return nil, err
		}
		if mac, ok := found[target]; ok {
			return mac, nil
		}
	}
	return nil, fmt.Errorf("no ARP reply from %s on %s", target, c.link)
}
