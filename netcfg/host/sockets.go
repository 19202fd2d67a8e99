package host

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Sockets in the handle's namespace. A socket belongs to the namespace of
// the thread that creates it, and net's own goroutines (an http.Transport's
// dialler, say) run on whatever thread they get: whoever opens a socket for
// another namespace must open it through these, not net directly.

// DialContext dials from the handle's namespace. It fits
// http.Transport.DialContext.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return h.dial(ctx, &net.Dialer{}, network, addr)
}

// DialDevice returns a dial function for the handle's namespace whose
// sockets are bound to device dev (SO_BINDTODEVICE): they leave by dev
// whatever the routing tables say, as traffic meant for the far end of a
// tunnel must.
func (h *Host) DialDevice(dev string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev)
		}); err != nil {
			return err
		}
		return serr
	}}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return h.dial(ctx, d, network, addr)
	}
}

func (h *Host) dial(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens in the handle's namespace.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := h.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket listens for datagrams in the handle's namespace.
func (h *Host) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := h.Do(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}
