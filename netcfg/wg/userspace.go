package wg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/wg/srcbind"
)

// userspaceSocketDir is where wg(8), wg-quick and wgctrl look for the UAPI
// sockets of userspace implementations. It is global, not per network
// namespace, so device names must be unique across namespaces.
const userspaceSocketDir = "/var/run/wireguard"

// usLevelVerbose is the slog level of wireguard-go's verbose lines. They are
// per packet and per timer, so they sit below Debug: a handler has to ask for
// them explicitly.
const usLevelVerbose = slog.LevelDebug - 4

// Userspace runs WireGuard devices in this process (wireguard-go over TUN).
// It is what nodeagent uses on kernels without the wireguard module; the
// devices look like any other to wg(8) and wgctrl, through the UAPI socket.
type Userspace struct {
	log *slog.Logger

	// mu is held for the whole of Start and Stop, so a name is never half
	// started or half stopped when another call looks at it (the socket of a
	// device being stopped is still live and would look foreign to Start).
	mu   sync.Mutex
	devs map[string]*usDevice

	// changed holds a signal once a device's Generation may have moved
	// (Changed).
	changed chan struct{}
}

// NewUserspace returns a Userspace that logs through log (nil discards).
func NewUserspace(log *slog.Logger) *Userspace {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Userspace{log: log, devs: make(map[string]*usDevice), changed: make(chan struct{}, 1)}
}

// Changed is signalled after a device's Generation may have moved: a UAPI
// connection from another process began or ended, or wireguard-go closed
// a device by itself. Those are the only ways a device this process runs
// can change without nodeagent writing it, so a watcher of its digests
// can wait here instead of polling them. Signals do not queue up: one
// stands for any number since the last receive.
func (u *Userspace) Changed() <-chan struct{} { return u.changed }

func (u *Userspace) signal() {
	select {
	case u.changed <- struct{}{}:
	default:
	}
}

// usDevice is one running wireguard-go device and its UAPI server.
type usDevice struct {
	name string
	log  *slog.Logger
	dev  *device.Device
	uapi *net.UnixListener
	once sync.Once
	done chan struct{} // closed when close has finished

	// serving counts the accept loop and the connection handlers; close
	// waits for them so no handler touches a closed device.
	serving sync.WaitGroup

	mu      sync.Mutex
	closing bool
	conns   map[net.Conn]struct{}

	// foreign counts UAPI connections from other processes, when each is
	// accepted and again when it ends: the only way to change the device
	// from outside nodeagent (wg(8), wg-quick), so an unchanged count is an
	// unchanged device (Digest). changed is called after each count.
	foreign atomic.Uint64
	changed func()
}

// Start creates the TUN device name inside h's network namespace with MTU
// mtu (0 means 1420), runs a wireguard-go device on it, brings it up, and
// serves the UAPI socket at /var/run/wireguard/<name>.sock, so that wg(8)
// and wgctrl both work against it. It fails if this process already runs a
// device of that name, a link of that name exists in the namespace, or the
// socket is served by someone else. Marking the link and counting the
// writes on h are the caller's, as for a kernel device.
func (u *Userspace) Start(h *host.Host, name string, mtu int) error {
	if err := usValidName(name); err != nil {
		return fmt.Errorf("wireguard %q: %w", name, err)
	}
	if mtu == 0 {
		mtu = device.DefaultMTU
	}
	if mtu < 0 {
		return fmt.Errorf("wireguard %s: invalid mtu %d", name, mtu)
	}

	u.mu.Lock()
	defer u.mu.Unlock()
	if d, ok := u.devs[name]; ok {
		if d.alive() {
			return fmt.Errorf("wireguard %s: already running", name)
		}
		// Its TUN link was deleted and the device closed itself; the
		// watcher has not reaped it yet. Do it here so a repair can start
		// the device again at once.
		delete(u.devs, name)
		d.close()
	}

	l, err := usListenUAPI(name)
	if err != nil {
		return fmt.Errorf("wireguard %s: uapi socket: %w", name, err)
	}
	// TUNSETIFF on a name that exists attaches to it (a persistent TUN) or
	// fails with an unhelpful EINVAL/EBUSY; say what is wrong instead.
	if _, err := h.NL().LinkByName(name); err == nil {
		l.Close()
		return fmt.Errorf("wireguard %s: create tun: a link of that name already exists", name)
	}

	// The TUN netdev appears in the namespace of the thread that issues
	// TUNSETIFF. CreateTUN also opens, on the same thread, the rtnetlink
	// socket that feeds link up/down/MTU events to the device and the
	// AF_INET socket for the MTU ioctls, so all of them must run in h's
	// namespace.
	var td tun.Device
	err = h.Do(func() error {
		var err error
		td, err = tun.CreateTUN(name, mtu)
		return err
	})
	if err != nil {
		l.Close()
		return fmt.Errorf("wireguard %s: create tun: %w", name, err)
	}

	d := &usDevice{
		name:    name,
		changed: u.signal,
		log:     u.log.With("device", name),
		uapi:    l,
		done:    make(chan struct{}),
		conns:   make(map[net.Conn]struct{}),
	}
	// Bring the link up before the device exists, so the TUN events queued
	// meanwhile end in EventUp and the device's event reader does not take
	// it down again after the Up below. (If the TUN status poll's "down"
	// still lands last, its next poll, a second later, brings it back up.)
	if err := usLinkUp(h, name); err != nil {
		td.Close()
		l.Close()
		return fmt.Errorf("wireguard %s: %w", name, err)
	}
	d.dev = device.NewDevice(
		&usTUN{Device: td, h: h},
		&usBind{Bind: srcbind.New(), h: h},
		usLogger(d.log),
	)
	// Up opens the UDP sockets now, so a later listen_port change fails
	// synchronously in IpcSet rather than only in a log line.
	if err := d.dev.Up(); err != nil {
		d.dev.Close()
		l.Close()
		return fmt.Errorf("wireguard %s: up: %w", name, err)
	}

	// Each device's count starts where no earlier device's reached, so a
	// device started again under the same name never matches a digest
	// taken of its predecessor.
	d.foreign.Store(usGenerations.Add(1 << 40))
	d.serving.Add(1)
	go d.serve()
	go u.watch(d)
	u.devs[name] = d
	d.log.Debug("userspace wireguard started", "mtu", mtu)
	return nil
}

// Stop closes the device (its TUN link disappears), the UAPI listener, and
// removes the socket file. A device that is not running is not an error.
func (u *Userspace) Stop(name string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	d, ok := u.devs[name]
	if !ok {
		return nil
	}
	delete(u.devs, name)
	d.close()
	d.log.Debug("userspace wireguard stopped")
	return nil
}

// Running reports whether this process runs a device of that name.
func (u *Userspace) Running(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	d, ok := u.devs[name]
	return ok && d.alive()
}

// usGenerations spaces the devices' foreign counts apart (Generation).
var usGenerations atomic.Uint64

// Generation returns the count of UAPI connections other processes made
// to device name (bumped as each starts and as it ends), and whether this
// process runs it. Between two equal readings nobody outside nodeagent can
// have changed the device.
func (u *Userspace) Generation(name string) (uint64, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	d, ok := u.devs[name]
	if !ok || !d.alive() {
		return 0, false
	}
	return d.foreign.Load(), true
}

// Close stops every device.
func (u *Userspace) Close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for name, d := range u.devs {
		delete(u.devs, name)
		d.close()
	}
}

// watch reaps d when wireguard-go closes it by itself, which it does when
// reading the TUN fails: someone deleted the link (`ip link del`) or its
// namespace went away. Running then reports false, so the converger can
// start it again.
func (u *Userspace) watch(d *usDevice) {
	select {
	case <-d.done:
		return
	case <-d.dev.Wait():
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.devs[d.name] != d {
		return // Stop, Close or a restarting Start got there first
	}
	delete(u.devs, d.name)
	d.close()
	d.log.Warn("userspace wireguard exited: its tun link is gone")
	u.signal()
}

// alive reports whether wireguard-go has not closed the device.
func (d *usDevice) alive() bool {
	select {
	case <-d.dev.Wait():
		return false
	default:
		return true
	}
}

// close stops the UAPI server, then the device. It is idempotent.
func (d *usDevice) close() {
	d.once.Do(func() {
		d.mu.Lock()
		d.closing = true
		conns := d.conns
		d.conns = nil
		d.mu.Unlock()
		// Closing the listener unlinks the socket file, so no client can
		// reach a device that is going away.
		d.uapi.Close()
		// A client that keeps its connection open would hold up Stop.
		for c := range conns {
			c.Close()
		}
		d.serving.Wait()
		d.dev.Close()
		close(d.done)
	})
}

// serve accepts UAPI connections until the listener is closed.
func (d *usDevice) serve() {
	defer d.serving.Done()
	for {
		c, err := d.uapi.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// EMFILE and friends pass; do not spin on them.
			d.log.Debug("userspace wireguard: uapi accept", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		d.mu.Lock()
		if d.closing {
			d.mu.Unlock()
			c.Close()
			return
		}
		d.conns[c] = struct{}{}
		d.serving.Add(1)
		d.mu.Unlock()
		foreign := !ownConn(c)
		if foreign {
			d.foreign.Add(1)
			d.changed()
		}
		go func() {
			defer d.serving.Done()
			d.dev.IpcHandle(c) // closes c
			if foreign {
				d.foreign.Add(1)
				d.changed()
			}
			d.mu.Lock()
			delete(d.conns, c)
			d.mu.Unlock()
		}()
	}
}

// ownConn reports whether a UAPI connection comes from this process (the
// converger's own wgctrl reads and writes). One whose peer cannot be told
// counts as another's.
func ownConn(c net.Conn) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	own := false
	raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		own = err == nil && int(cred.Pid) == os.Getpid()
	})
	return own
}

// usTUN runs the MTU query inside the device's namespace. NativeTun.MTU
// opens an AF_INET socket on the calling thread and asks SIOCGIFMTU by
// name, and wireguard-go calls it from its event goroutine on every link
// change: from the host namespace it would read another link's MTU or fail
// with ENODEV.
type usTUN struct {
	tun.Device
	h *host.Host
}

func (t *usTUN) MTU() (int, error) {
	var mtu int
	err := t.h.Do(func() error {
		var err error
		mtu, err = t.Device.MTU()
		return err
	})
	return mtu, err
}

// usBind opens wireguard-go's UDP sockets inside the device's namespace.
// Open runs on whatever goroutine calls it (device.Up from the TUN event
// reader, IpcSet on a listen_port change from a UAPI handler), and a socket
// belongs to the namespace of the thread that creates it. The other Bind
// methods only use the sockets Open made.
//
// The Bind inside is srcbind's, not conn.NewDefaultBind: on kernels with
// UDP GRO the default one forgets the address each peer dialled and
// answers from the primary one, which a NAT in front of the peer drops
// (srcbind's package doc).
//
// wireguard-go starts its sticky-source route listener only for a bare
// *conn.StdNetBind, so it does not run here. That listener would have
// opened its rtnetlink socket on the caller's thread, in the wrong
// namespace. A source address that is no longer the node's is dropped by
// srcbind on the first send the kernel refuses, and a peer's source is
// cleared when a handshake retry times out (timers.go).
type usBind struct {
	conn.Bind
	h *host.Host
}

func (b *usBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	var (
		fns    []conn.ReceiveFunc
		actual uint16
	)
	err := b.h.Do(func() error {
		var err error
		fns, actual, err = b.Bind.Open(port)
		return err
	})
	return fns, actual, err
}

// usLinkUp sets the new TUN link up.
func usLinkUp(h *host.Host, name string) error {
	link, err := h.NL().LinkByName(name)
	if err != nil {
		return fmt.Errorf("find tun link: %w", err)
	}
	if err := h.NL().LinkSetUp(link); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	return nil
}

// usListenUAPI listens on the device's UAPI socket, replacing a stale
// socket file left by a process that died, but never one that is served.
//
// This is ipc.UAPIOpen without its process-wide umask change, which would
// race with every other goroutine of the daemon creating files; the mode is
// set on the socket before bind instead. It also skips ipc.UAPIListen's
// inotify watch: that stops serving on any attribute change of the socket,
// and its two goroutines cannot both be drained after Close.
func usListenUAPI(name string) (*net.UnixListener, error) {
	if err := os.MkdirAll(userspaceSocketDir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(userspaceSocketDir, name+".sock")
	l, err := usListenUnix(path)
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		return l, err
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s is served by another process", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale %s: %w", path, err)
	}
	return usListenUnix(path)
}

// usListenUnix listens on path with mode 0600 (before the umask). On Linux
// a unix socket's file takes the mode of the socket inode at bind, so
// fchmod before bind gives the file its mode without a window.
func usListenUnix(path string) (*net.UnixListener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var ferr error
		if err := c.Control(func(fd uintptr) { ferr = unix.Fchmod(int(fd), 0o600) }); err != nil {
			return err
		}
		return ferr
	}}
	l, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	return l.(*net.UnixListener), nil
}

// usValidName rejects names the kernel would refuse, and any that would
// make the socket path leave the socket directory.
func usValidName(name string) error {
	if name == "" || len(name) >= unix.IFNAMSIZ || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n\r\v\f") {
		return errors.New("invalid interface name")
	}
	return nil
}

// usLogger routes wireguard-go's log lines to log: its errors at Debug
// (they are mostly transient send failures; the converger reports what
// matters), its verbose lines below Debug. Every line is redacted.
func usLogger(log *slog.Logger) *device.Logger {
	logf := func(level slog.Level, kind string) func(string, ...any) {
		return func(format string, args ...any) {
			ctx := context.Background()
			if !log.Enabled(ctx, level) {
				return
			}
			log.Log(ctx, level, usRedact(fmt.Sprintf(format, args...)), "wireguard", kind)
		}
	}
	return &device.Logger{
		Verbosef: logf(usLevelVerbose, "verbose"),
		Errorf:   logf(slog.LevelDebug, "error"),
	}
}

var (
	// usParseLine matches wireguard-go's "failed to parse line %q", which
	// quotes a whole UAPI line as sent, and that may be a key.
	usParseLine = regexp.MustCompile(`(failed to parse line )"(?:[^"\\]|\\.)*"`)
	// usKey matches a WireGuard key in base64 (wg(8), wgctrl) or hex
	// (UAPI). wireguard-go prints only public keys, shortened, but a key
	// can reach a log line through an error that quotes its input.
	usKey = regexp.MustCompile(`[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=|[0-9a-fA-F]{64}`)
)

// usRedact removes anything that may be a key from a log line.
func usRedact(s string) string {
	s = usParseLine.ReplaceAllString(s, `${1}[redacted]`)
	return usKey.ReplaceAllString(s, "[redacted]")
}
