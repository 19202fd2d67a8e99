package wg

import (
	"bytes"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// usLogBuffer collects every log line, wireguard-go's verbose ones too, so
// a test can check what was (and was not) logged. Lines may arrive after
// the test ends (wireguard-go's goroutines wind down asynchronously), so it
// does not write to t.
type usLogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *usLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *usLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// usNew returns a Userspace whose devices are all stopped before the
// test's namespaces are removed, and its log.
func usNew(t *testing.T) (*Userspace, *usLogBuffer) {
	t.Helper()
	logs := &usLogBuffer{}
	u := NewUserspace(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: usLevelVerbose})))
	// Cleanups run last-registered first: callers create their namespaces
	// before calling usNew, so the devices go before the namespaces.
	t.Cleanup(func() {
		u.Close()
		if t.Failed() {
			t.Logf("userspace log:\n%s", logs)
		}
	})
	return u, logs
}

// usConfigure configures a device with wgctrl. The client is created inside
// the namespace because its genetlink half binds to the creating thread's
// namespace; the userspace half only uses the socket path.
func usConfigure(t *testing.T, h *host.Host, name string, cfg wgtypes.Config) {
	t.Helper()
	c := usClient(t, h)
	if err := c.ConfigureDevice(name, cfg); err != nil {
		t.Fatalf("configure %s: %v", name, err)
	}
}

func usClient(t *testing.T, h *host.Host) *wgctrl.Client {
	t.Helper()
	var c *wgctrl.Client
	if err := h.Do(func() (err error) { c, err = wgctrl.New(); return err }); err != nil {
		t.Fatalf("wgctrl: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func usKeys(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func usAddr(t *testing.T, ns *testenv.NetNS, dev, cidr string) {
	t.Helper()
	l, err := ns.NL.LinkByName(dev)
	if err != nil {
		t.Fatalf("%s in %s: %v", dev, ns.Name, err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.NL.AddrAdd(l, a); err != nil {
		t.Fatalf("address %s on %s: %v", cidr, dev, err)
	}
}

// usEventually polls cond for up to 20 s (TCG in the VM tier is slow to
// notice a deleted TUN link).
func usEventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func usSockPath(name string) string { return filepath.Join(userspaceSocketDir, name+".sock") }

// usUDPListening reports whether `ss` in the given namespace (nil: the test
// process's own) shows a UDP socket bound to port.
func usUDPListening(t *testing.T, ns *testenv.NetNS, port int) bool {
	t.Helper()
	args := []string{"ss", "-Hlun", "sport = :" + strconv.Itoa(port)}
	var out []byte
	var err error
	if ns != nil {
		var s string
		s, err = ns.TryExec(args...)
		out = []byte(s)
	} else {
		out, err = exec.Command(args[0], args[1:]...).CombinedOutput()
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Contains(string(out), ":"+strconv.Itoa(port))
}

// usPair is two userspace devices with a tunnel between them (usTunnel).
type usPair struct {
	a, b       *testenv.NetNS
	u          *Userspace
	logs       *usLogBuffer
	keyA, keyB wgtypes.Key
}

// usTunnel runs userspace devices nameA in a new namespace a and nameB in
// b, joined by a veth, each with a key, its port and the other as its one
// peer (allowed IPs 10.99.0.2/32 and .1/32), and addresses 10.99.0.1/24
// and .2/24 on them. extraA's fwmark and peers go on A as well.
func usTunnel(t *testing.T, nameA, nameB string, portA, portB int, extraA wgtypes.Config) usPair {
	t.Helper()
	a, b := testenv.NewNetNS(t), testenv.NewNetNS(t)
	a.Veth(t, "veth-a", b, "veth-b")
	// TEST-NET-2, not TEST-NET-1: CI hosts use 192.0.2.0/24 themselves,
	// and there sockets wrongly opened in the host namespace reach each
	// other through the host's own address, so the ping would prove
	// nothing.
	usAddr(t, a, "veth-a", "198.51.100.1/24")
	usAddr(t, b, "veth-b", "198.51.100.2/24")
	u, logs := usNew(t)
	for _, x := range []struct {
		ns   *testenv.NetNS
		name string
	}{{a, nameA}, {b, nameB}} {
		if err := u.Start(x.ns.Host, x.name, 0); err != nil {
			t.Fatal(err)
		}
	}
	keyA, keyB := usKeys(t), usKeys(t)
	pA, pB := portA, portB
	usConfigure(t, a.Host, nameA, wgtypes.Config{
		PrivateKey:   &keyA,
		ListenPort:   &pA,
		FirewallMark: extraA.FirewallMark,
		Peers: append([]wgtypes.PeerConfig{{
			PublicKey:  keyB.PublicKey(),
			Endpoint:   &net.UDPAddr{IP: net.IPv4(198, 51, 100, 2), Port: portB},
			AllowedIPs: []net.IPNet{{IP: net.IPv4(10, 99, 0, 2), Mask: net.CIDRMask(32, 32)}},
		}}, extraA.Peers...),
	})
	usConfigure(t, b.Host, nameB, wgtypes.Config{
		PrivateKey: &keyB,
		ListenPort: &pB,
		Peers: []wgtypes.PeerConfig{{
			PublicKey:  keyA.PublicKey(),
			Endpoint:   &net.UDPAddr{IP: net.IPv4(198, 51, 100, 1), Port: portA},
			AllowedIPs: []net.IPNet{{IP: net.IPv4(10, 99, 0, 1), Mask: net.CIDRMask(32, 32)}},
		}},
	})
	usAddr(t, a, nameA, "10.99.0.1/24")
	usAddr(t, b, nameB, "10.99.0.2/24")
	return usPair{a, b, u, logs, keyA, keyB}
}

// TestUserspaceTunnel runs a userspace device in each of two namespaces
// joined by a veth, and proves the tunnel carries traffic, wg(8) sees the
// handshake, and every socket and MTU read happened in the device's own
// namespace rather than the test process's.
func TestUserspaceTunnel(t *testing.T) {
	testenv.RequireRoot(t)
	// The socket directory is global, so the names differ across the
	// namespaces. Ports that nothing on the host is likely to use, so that
	// their absence from the host namespace means something.
	const (
		nameA, nameB = "wgtA1", "wgtB1"
		portA, portB = 47111, 47112
	)
	tun := usTunnel(t, nameA, nameB, portA, portB, wgtypes.Config{})
	a, b, logs, keyA, keyB := tun.a, tun.b, tun.logs, tun.keyA, tun.keyB

	a.Exec(t, "ping", "-c", "3", "-W", "2", "10.99.0.2")

	show := a.Exec(t, "wg", "show", nameA)
	for _, want := range []string{keyB.PublicKey().String(), "latest handshake", "listening port: " + strconv.Itoa(portA)} {
		if !strings.Contains(show, want) {
			t.Errorf("wg show %s lacks %q:\n%s", nameA, want, show)
		}
	}

	// The UDP sockets live where their devices do, and only there.
	dev, err := usClient(t, a.Host).Device(nameA)
	if err != nil {
		t.Fatalf("wgctrl device %s: %v", nameA, err)
	}
	if dev.ListenPort != portA {
		t.Errorf("%s listen port = %d, want %d", nameA, dev.ListenPort, portA)
	}
	if len(dev.Peers) != 1 || dev.Peers[0].LastHandshakeTime.IsZero() {
		t.Errorf("%s peers = %+v, want one with a handshake", nameA, dev.Peers)
	}
	for _, x := range []struct {
		ns   *testenv.NetNS
		port int
		want bool
	}{{a, portA, true}, {b, portB, true}, {a, portB, false}, {b, portA, false}, {nil, portA, false}, {nil, portB, false}} {
		where := "the test's own netns"
		if x.ns != nil {
			where = x.ns.Name
		}
		if got := usUDPListening(t, x.ns, x.port); got != x.want {
			t.Errorf("udp :%d listening in %s = %v, want %v", x.port, where, got, x.want)
		}
	}

	// A listen_port change reopens the sockets from a UAPI handler
	// goroutine, not from Start; they must still land in the namespace.
	const portA2 = 47113
	pA2 := portA2
	usConfigure(t, a.Host, nameA, wgtypes.Config{ListenPort: &pA2})
	if !usUDPListening(t, a, portA2) || usUDPListening(t, nil, portA2) {
		t.Errorf("after a listen_port change, udp :%d is not (only) in %s", portA2, a.Name)
	}
	usConfigure(t, b.Host, nameB, wgtypes.Config{Peers: []wgtypes.PeerConfig{{
		PublicKey:  keyA.PublicKey(),
		UpdateOnly: true,
		Endpoint:   &net.UDPAddr{IP: net.IPv4(198, 51, 100, 1), Port: portA2},
	}}})
	a.Exec(t, "ping", "-c", "1", "-W", "2", "10.99.0.2")

	// wireguard-go reads the MTU on every link event from its own
	// goroutine; read from the wrong namespace it fails with ENODEV.
	l, err := a.NL.LinkByName(nameA)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.NL.LinkSetMTU(l, 1380); err != nil {
		t.Fatal(err)
	}
	usEventually(t, "wireguard-go to see MTU 1380", func() bool {
		return strings.Contains(logs.String(), "MTU updated: 1380")
	})
	if s := logs.String(); strings.Contains(s, "Failed to load updated MTU") || strings.Contains(s, "Trouble determining MTU") {
		t.Errorf("wireguard-go failed to read the MTU:\n%s", s)
	}

	// No key, in any encoding, reaches the log, not even through an
	// error that quotes the malformed line carrying it.
	c, err := net.Dial("unix", usSockPath(nameA))
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("set=1\n" + hex.EncodeToString(keyA[:]) + "\n\n"))
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	reply := make([]byte, 64)
	n, _ := c.Read(reply)
	c.Close()
	if !strings.HasPrefix(string(reply[:n]), "errno=") {
		t.Errorf("malformed set: reply %q, want errno=", reply[:n])
	}
	usEventually(t, "the malformed set to be logged", func() bool {
		return strings.Contains(logs.String(), "failed to parse line [redacted]")
	})
	s := logs.String()
	for _, k := range []wgtypes.Key{keyA, keyB} {
		for _, enc := range []string{k.String(), hex.EncodeToString(k[:])} {
			if strings.Contains(s, enc) {
				t.Errorf("log contains a private key:\n%s", s)
			}
		}
	}
	if !strings.Contains(s, "device="+nameA) {
		t.Errorf("log lines lack device=%s:\n%s", nameA, s)
	}
}

// TestUserspaceLifecycle covers Start, Stop and Running, the link and the
// socket they create and remove, and a device whose link is deleted by
// hand.
func TestUserspaceLifecycle(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetNS(t)
	u, _ := usNew(t)
	const name = "wgtL1"

	if u.Running(name) {
		t.Fatalf("Running(%s) before Start", name)
	}
	if err := u.Start(ns.Host, name, 1380); err != nil {
		t.Fatal(err)
	}
	if !u.Running(name) {
		t.Errorf("Running(%s) = false after Start", name)
	}
	l, err := ns.NL.LinkByName(name)
	if err != nil {
		t.Fatalf("tun link %s: %v", name, err)
	}
	if got := l.Attrs(); got.MTU != 1380 || got.Flags&net.FlagUp == 0 {
		t.Errorf("%s: mtu %d flags %v; want 1380 and up", name, got.MTU, got.Flags)
	}
	if _, err := net.InterfaceByName(name); err == nil {
		t.Errorf("%s also exists in the test's own netns", name)
	}
	fi, err := os.Stat(usSockPath(name))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("%s: mode %v, want a socket only root can use", usSockPath(name), fi.Mode())
	}
	if !strings.Contains(ns.Exec(t, "wg", "show", "interfaces"), name) {
		t.Errorf("wg show interfaces lacks %s", name)
	}

	if err := u.Start(ns.Host, name, 0); err == nil {
		t.Errorf("second Start(%s) succeeded", name)
	}

	if err := u.Stop(name); err != nil {
		t.Fatal(err)
	}
	if u.Running(name) {
		t.Errorf("Running(%s) after Stop", name)
	}
	if _, err := ns.NL.LinkByName(name); err == nil {
		t.Errorf("tun link %s outlived Stop", name)
	}
	if _, err := os.Lstat(usSockPath(name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s outlived Stop: %v", usSockPath(name), err)
	}
	if err := u.Stop(name); err != nil {
		t.Errorf("Stop of a stopped device: %v", err)
	}

	// The name is free again, and a device whose link is deleted by hand
	// is reaped, so the converger can start it again.
	if err := u.Start(ns.Host, name, 0); err != nil {
		t.Fatalf("Start after Stop: %v", err)
	}
	ns.Exec(t, "ip", "link", "del", name)
	usEventually(t, name+" to be reaped", func() bool { return !u.Running(name) })
	usEventually(t, "socket of "+name+" to go", func() bool {
		_, err := os.Lstat(usSockPath(name))
		return errors.Is(err, os.ErrNotExist)
	})
	if err := u.Start(ns.Host, name, 0); err != nil {
		t.Fatalf("Start after the link was deleted: %v", err)
	}
	u.Close()
	if u.Running(name) {
		t.Errorf("Running(%s) after Close", name)
	}
	if _, err := ns.NL.LinkByName(name); err == nil {
		t.Errorf("tun link %s outlived Close", name)
	}
}

// TestUserspaceSocketConflicts proves that a socket someone else serves is
// never taken over, a stale one is replaced, and a foreign link of the same
// name is left alone.
func TestUserspaceSocketConflicts(t *testing.T) {
	testenv.RequireRoot(t)
	ns := testenv.NewNetNS(t)
	u, _ := usNew(t)
	if err := os.MkdirAll(userspaceSocketDir, 0o755); err != nil {
		t.Fatal(err)
	}

	const live = "wgtC1"
	ln, err := net.Listen("unix", usSockPath(live))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := u.Start(ns.Host, live, 0); err == nil {
		t.Errorf("Start(%s) took over a live socket", live)
	}
	if _, err := os.Lstat(usSockPath(live)); err != nil {
		t.Errorf("live socket damaged: %v", err)
	}
	if _, err := ns.NL.LinkByName(live); err == nil {
		t.Errorf("failed Start(%s) left a link behind", live)
	}

	const stale = "wgtC2"
	sl, err := net.ListenUnix("unix", &net.UnixAddr{Name: usSockPath(stale), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	sl.SetUnlinkOnClose(false)
	sl.Close()
	if err := u.Start(ns.Host, stale, 0); err != nil {
		t.Errorf("Start(%s) over a stale socket: %v", stale, err)
	}

	const foreign = "wgtC3"
	la := netlink.NewLinkAttrs()
	la.Name = foreign
	if err := ns.NL.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "wgtC3p"}); err != nil {
		t.Fatal(err)
	}
	if err := u.Start(ns.Host, foreign, 0); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Start(%s) over a foreign link: %v, want an 'already exists' error", foreign, err)
	}
	if _, err := ns.NL.LinkByName(foreign); err != nil {
		t.Errorf("foreign link %s damaged: %v", foreign, err)
	}
	if _, err := os.Lstat(usSockPath(foreign)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed Start(%s) left its socket: %v", foreign, err)
	}

	for _, bad := range []string{"", "../x", "a/b", "waytoolongname16"} {
		if err := u.Start(ns.Host, bad, 0); err == nil {
			t.Errorf("Start(%q) succeeded", bad)
		}
	}
}

// TestUserspaceRedact checks the log filter on the shapes a key takes.
func TestUserspaceRedact(t *testing.T) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	h := hex.EncodeToString(k[:])
	for _, tc := range []struct{ in, want string }{
		{"peer(" + k.String() + ")", "peer([redacted])"},
		{"key " + h + " x", "key [redacted] x"},
		{`failed to parse line "` + h + `"`, "failed to parse line [redacted]"},
		{`failed to parse line "a \"q\" b"`, "failed to parse line [redacted]"},
		{"peer(aBcD…wXyZ) - Sending handshake initiation", "peer(aBcD…wXyZ) - Sending handshake initiation"},
		{"UDP bind has been updated", "UDP bind has been updated"},
	} {
		if got := usRedact(tc.in); got != tc.want {
			t.Errorf("usRedact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// usChildEnv marks the re-executed test binary of TestUserspaceCurrentNetns.
const usChildEnv = "NODEAGENT_TEST_USERSPACE_CHILD"

// TestUserspaceCurrentNetns runs the daemon's case: the whole process sits
// in one namespace and the Host is host.Current(), so Host.Do runs on the
// caller's thread. The test binary re-executes itself inside a fresh
// namespace (standing in for the host's) rather than create links in the
// real host namespace.
func TestUserspaceCurrentNetns(t *testing.T) {
	testenv.RequireRoot(t)
	if os.Getenv(usChildEnv) != "1" {
		ns := testenv.NewNetNS(t)
		out := ns.Exec(t, "env", usChildEnv+"=1", os.Args[0],
			"-test.run=^TestUserspaceCurrentNetns$", "-test.count=1", "-test.v")
		if !strings.Contains(out, "--- PASS: TestUserspaceCurrentNetns") {
			t.Fatalf("child did not pass:\n%s", out)
		}
		return
	}

	h, err := host.Current()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	u, logs := usNew(t)
	const (
		name = "wgtH1"
		port = 47121
	)
	if err := u.Start(h, name, 0); err != nil {
		t.Fatal(err)
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatalf("tun link %s: %v", name, err)
	}
	if ifc.MTU != 1420 || ifc.Flags&net.FlagUp == 0 {
		t.Errorf("%s: mtu %d flags %v, want 1420 and up", name, ifc.MTU, ifc.Flags)
	}
	k, p := usKeys(t), port
	usConfigure(t, h, name, wgtypes.Config{PrivateKey: &k, ListenPort: &p})
	if !usUDPListening(t, nil, port) {
		t.Errorf("udp :%d not listening", port)
	}
	if out, err := exec.Command("wg", "show", name, "listen-port").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(port) {
		t.Errorf("wg show %s listen-port = %q, %v; want %d", name, out, err, port)
	}
	l, err := h.NL().LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.NL().LinkSetMTU(l, 1380); err != nil {
		t.Fatal(err)
	}
	usEventually(t, "wireguard-go to see MTU 1380", func() bool {
		return strings.Contains(logs.String(), "MTU updated: 1380")
	})
	if err := u.Stop(name); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(name); err == nil {
		t.Errorf("tun link %s outlived Stop", name)
	}
}
