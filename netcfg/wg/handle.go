package wg

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Resolver looks up host names; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Resolution cache lifetimes: a name that resolved is looked up again after
// ResolveEvery (so a changed DNS record is picked up), one that failed after
// RetryResolve; a peer whose handshake is stale forces a fresh look-up at
// most every RetryResolve.
const (
	ResolveEvery = 5 * time.Minute
	RetryResolve = 30 * time.Second
	// resolveTimeout bounds one look-up, so a dead DNS server cannot stall
	// a sync.
	resolveTimeout = 3 * time.Second
)

// Handle is what the WireGuard subsystem converges through: the namespace's
// host handle, a wgctrl client inside that namespace, the in-process
// userspace devices and a resolver with its cache. It is used by one
// goroutine at a time (the one that owns convergence).
type Handle struct {
	Host *host.Host
	// Userspace hosts in-process devices; nil where the process is not
	// long-running (a one-shot apply), which then cannot create them.
	Userspace *Userspace
	// Resolver resolves endpoint host names; nil means net.DefaultResolver.
	Resolver Resolver
	Log      *slog.Logger
	// Now is the clock; nil means time.Now. Tests move it.
	Now func() time.Time
	// StateDir is the daemon's state directory, where the record of the
	// peers kept from an adoption lives (kept.go); "" keeps that record
	// in memory only.
	StateDir string

	client       *wgctrl.Client
	kconn        *kernelConn // kernel devices' writes, packed as wg(8) packs them
	dg           *digester   // the drift poll's dumps (Digest)
	seed         maphash.Seed
	clientKernel bool      // whether client was made while the kernel had WireGuard
	kernel       bool      // the kernel has WireGuard (cached once seen)
	kernelAsked  time.Time // when a "no" was last asked
	cache        map[string]resolution
	// peersSeen is how many peers each kernel device had when last read,
	// so the next read's map is made that size rather than grown to it.
	peersSeen map[string]int
	// usBuf is the userspace devices' UAPI text buffer, kept from read to
	// read (readUserspace).
	usBuf []byte

	kept keptStore

	configWrites atomic.Int64
	peerWrites   atomic.Int64
	msgWrites    atomic.Int64 // netlink messages those writes took (kernel devices)
	configNanos  atomic.Int64 // time spent in wgctrl writes, for the benchmark's breakdown
}

type resolution struct {
	addr netip.Addr
	err  string
	at   time.Time
}

// ConfigWrites returns how many WireGuard configuration writes (one per
// device per sync, unless one fails and its ops are written one by one)
// went through the handle; PeerWrites how many peer entries they carried;
// MessageWrites how many netlink messages the kernel devices' writes took.
// A no-op sync leaves all three unchanged.
func (h *Handle) ConfigWrites() int64 { return h.configWrites.Load() }

// MessageWrites returns how many WG_CMD_SET_DEVICE messages were sent.
func (h *Handle) MessageWrites() int64 { return h.msgWrites.Load() }

// PeerWrites returns how many peer entries were written.
func (h *Handle) PeerWrites() int64 { return h.peerWrites.Load() }

// Close releases the wgctrl client and the kernel connection. It does not
// stop userspace devices.
func (h *Handle) Close() {
	if h.client != nil {
		h.client.Close()
		h.client = nil
	}
	if h.kconn != nil {
		h.kconn.Close()
		h.kconn = nil
	}
	if h.dg != nil {
		h.dg.close()
		h.dg = nil
	}
}

// kernelConn returns the generic netlink connection for kernel devices'
// writes, inside the namespace.
func (h *Handle) kernelConn() (*kernelConn, error) {
	if h.kconn != nil {
		return h.kconn, nil
	}
	var k kernelConn
	err := h.Host.Do(func() error {
		c, err := genetlink.Dial(nil)
		if err != nil {
			return err
		}
		f, err := c.GetFamily("wireguard")
		if err != nil {
			c.Close()
			return err
		}
		k.c, k.family = c, f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("wireguard generic netlink: %w", err)
	}
	h.kconn = &k
	return h.kconn, nil
}

// ConfigTime returns the time spent in wgctrl writes, for the benchmark's
// breakdown.
func (h *Handle) ConfigTime() time.Duration { return time.Duration(h.configNanos.Load()) }

func (h *Handle) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

func (h *Handle) log() *slog.Logger {
	if h.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Log
}

// kernelRecheck is how long a "no WireGuard in this kernel" answer is
// kept: asking costs a generic netlink socket, and a sync runs on every
// kernel event.
const kernelRecheck = 30 * time.Second

// kernelHasWireGuard reports whether the kernel has WireGuard, by asking for
// its generic netlink family inside the namespace (which also loads the
// module where it is one). A yes is kept; a no is asked again after
// kernelRecheck (a module may be installed meanwhile).
func (h *Handle) kernelHasWireGuard() bool {
	if h.kernel {
		return true
	}
	if !h.kernelAsked.IsZero() && h.now().Sub(h.kernelAsked) < kernelRecheck {
		return false
	}
	h.kernelAsked = h.now()
	err := h.Host.Do(func() error {
		c, err := genetlink.Dial(nil)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.GetFamily("wireguard")
		return err
	})
	h.kernel = err == nil
	return h.kernel
}

// wgClient returns a wgctrl client bound to the namespace. wgctrl decides
// once, when it is made, whether to talk to the kernel, so a client made
// before the kernel had WireGuard is replaced once it has.
func (h *Handle) wgClient() (*wgctrl.Client, error) {
	if h.client != nil && h.clientKernel == h.kernel {
		return h.client, nil
	}
	if h.client != nil {
		h.client.Close()
		h.client = nil
	}
	err := h.Host.Do(func() error {
		c, err := wgctrl.New()
		h.client = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("wgctrl: %w", err)
	}
	h.clientKernel = h.kernel
	return h.client, nil
}

// device reads one device, or reports os.ErrNotExist.
func (h *Handle) device(name string) (*wgtypes.Device, error) {
	c, err := h.wgClient()
	if err != nil {
		return nil, err
	}
	return c.Device(name)
}

// configure writes cfg to the device, counting the write.
// configure writes cfg to device name: a kernel device's through the
// packed generic netlink writer, a userspace device's through wgctrl (one
// UAPI set, whatever its size).
func (h *Handle) configure(name, impl string, cfg wgtypes.Config) error {
	h.configWrites.Add(1)
	h.peerWrites.Add(int64(len(cfg.Peers)))
	h.Host.Wrote(1)
	start := time.Now()
	defer func() { h.configNanos.Add(int64(time.Since(start))) }()
	if impl == ImplKernel {
		k, err := h.kernelConn()
		if err != nil {
			return err
		}
		before := k.msgs
		err = k.configure(name, cfg)
		h.msgWrites.Add(k.msgs - before)
		return err
	}
	c, err := h.wgClient()
	if err != nil {
		return err
	}
	return c.ConfigureDevice(name, cfg)
}

// resolve returns the address of an endpoint (host:port). Addresses are
// returned as they are; names go through the cache, and fresh skips a
// cached answer younger than RetryResolve.
func (h *Handle) resolve(ctx context.Context, endpoint string, fresh bool) Resolved {
	if ap, err := netip.ParseAddrPort(endpoint); err == nil {
		return Resolved{Addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
	}
	hostname, portText, err := net.SplitHostPort(endpoint)
	if err != nil {
		return Resolved{Err: err.Error()}
	}
	port, err := net.LookupPort("udp", portText)
	if err != nil {
		return Resolved{Err: err.Error()}
	}
	now := h.now()
	if h.cache == nil {
		h.cache = map[string]resolution{}
	}
	r, ok := h.cache[hostname]
	age := now.Sub(r.at)
	valid := ok && ((r.err == "" && age < ResolveEvery) || (r.err != "" && age < RetryResolve))
	if fresh && age >= RetryResolve {
		valid = false
	}
	if !valid {
		r = h.lookup(ctx, hostname)
		r.at = now
		h.cache[hostname] = r
	}
	if r.err != "" {
		return Resolved{Err: r.err}
	}
	return Resolved{Addr: netip.AddrPortFrom(r.addr, uint16(port))}
}

func (h *Handle) lookup(ctx context.Context, hostname string) resolution {
	var res Resolver = net.DefaultResolver
	if h.Resolver != nil {
		res = h.Resolver
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := res.LookupNetIP(ctx, "ip", hostname)
	if err == nil && len(addrs) == 0 {
		err = errors.New("no addresses")
	}
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return resolution{err: "no such host"}
		}
		return resolution{err: err.Error()}
	}
	// Prefer IPv4, as wg(8) does: an IPv6 endpoint on a host without v6
	// transit would never handshake.
	best := addrs[0].Unmap()
	for _, a := range addrs {
		if a.Unmap().Is4() {
			best = a.Unmap()
			break
		}
	}
	return resolution{addr: best}
}
