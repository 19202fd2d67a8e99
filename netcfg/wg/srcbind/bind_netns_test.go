package srcbind_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"

	"github.com/nodeagent/nodeagent/netcfg/wg/srcbind"
	"github.com/nodeagent/nodeagent/testenv"
)

// lab is a node and a client on one link. The node has a primary and a
// secondary address on it per family, and an address on a second link
// (to a third namespace) that the client routes to through the node.
type lab struct {
	node, client *testenv.NetNS
}

// The addresses of the lab. For IPv6 the kernel answers from the address
// added last, so the primary is added after the secondary; newLab checks
// that the kernel would pick the primary.
var (
	primary4   = netip.MustParseAddr("192.168.2.10")
	secondary4 = netip.MustParseAddr("192.168.2.11")
	other4     = netip.MustParseAddr("172.16.5.1")
	client4    = netip.MustParseAddr("192.168.2.20")
	primary6   = netip.MustParseAddr("fd00:2::10")
	secondary6 = netip.MustParseAddr("fd00:2::11")
	other6     = netip.MustParseAddr("fd00:5::1")
	client6    = netip.MustParseAddr("fd00:2::20")
)

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{node: testenv.NewNetNS(t), client: testenv.NewNetNS(t)}
	side := testenv.NewNetNS(t)
	l.node.Veth(t, "eth0", l.client, "eth0")
	l.node.Veth(t, "eth1", side, "eth0")
	for _, c := range [][]string{
		{"addr", "add", "192.168.2.10/24", "dev", "eth0"},
		{"addr", "add", "192.168.2.11/24", "dev", "eth0"},
		{"addr", "add", "fd00:2::11/64", "dev", "eth0", "nodad"},
		{"addr", "add", "fd00:2::10/64", "dev", "eth0", "nodad"},
		{"addr", "add", "172.16.5.1/24", "dev", "eth1"},
		{"addr", "add", "fd00:5::1/64", "dev", "eth1", "nodad"},
	} {
		l.node.Exec(t, append([]string{"ip"}, c...)...)
	}
	for _, c := range [][]string{
		{"addr", "add", "192.168.2.20/24", "dev", "eth0"},
		{"addr", "add", "fd00:2::20/64", "dev", "eth0", "nodad"},
		{"route", "add", "172.16.5.0/24", "via", "192.168.2.10"},
		{"route", "add", "fd00:5::/64", "via", "fd00:2::10"},
	} {
		l.client.Exec(t, append([]string{"ip"}, c...)...)
	}
	for dst, want := range map[netip.Addr]netip.Addr{client4: primary4, client6: primary6} {
		out := l.node.Exec(t, "ip", "route", "get", dst.String())
		if !strings.Contains(out, " src "+want.String()+" ") {
			t.Fatalf("the node's kernel would not answer %s from %s, so the test proves nothing:\n%s", dst, want, out)
		}
	}
	return l
}

// open opens b in the node's namespace and closes it when the test ends.
func (l *lab) open(t *testing.T, b conn.Bind) ([]conn.ReceiveFunc, uint16) {
	t.Helper()
	var (
		fns  []conn.ReceiveFunc
		port uint16
	)
	if err := l.node.Host.Do(func() error {
		var err error
		fns, port, err = b.Open(0)
		return err
	}); err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	if len(fns) != 2 {
		t.Fatalf("open: %d receive functions; want 2 (IPv4 and IPv6)", len(fns))
	}
	return fns, port
}

// dial opens a UDP socket in the client's namespace.
func (l *lab) dial(t *testing.T, network string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := l.client.Host.Do(func() error {
		var err error
		c, err = net.ListenUDP(network, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// recv reads from fn until it has n datagrams and returns their endpoints.
func recv(t *testing.T, b conn.Bind, fn conn.ReceiveFunc, n int) []conn.Endpoint {
	t.Helper()
	bs := b.BatchSize()
	bufs := make([][]byte, bs)
	for i := range bufs {
		bufs[i] = make([]byte, 1500)
	}
	sizes := make([]int, bs)
	eps := make([]conn.Endpoint, bs)
	var out []conn.Endpoint
	for len(out) < n {
		got, err := fn(bufs, sizes, eps)
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		for i := range got {
			if sizes[i] > 0 {
				out = append(out, eps[i])
			}
		}
	}
	return out
}

// answers reads n datagrams on c and returns the addresses they came from.
func answers(t *testing.T, c *net.UDPConn, n int) []netip.Addr {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	var from []netip.Addr
	for range n {
		_, ap, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("client: read answer %d of %d: %v", len(from)+1, n, err)
		}
		from = append(from, ap.Addr().Unmap())
	}
	return from
}

type srcCase struct {
	name    string
	network string
	fn      int // index of the family's receive function
	dialled netip.Addr
	client  netip.Addr
	dev     string // the node's link with dialled, and its prefix length
	bits    int
}

var srcCases = []srcCase{
	{"v4 secondary", "udp4", 0, secondary4, client4, "eth0", 24},
	{"v4 other interface", "udp4", 0, other4, client4, "eth1", 24},
	{"v6 secondary", "udp6", 1, secondary6, client6, "eth0", 64},
	{"v6 other interface", "udp6", 1, other6, client6, "eth1", 64},
}

// TestAnswersFromDialledAddress: the client sends a batch to an address
// that is not the one the kernel would pick; every received endpoint
// remembers that address, and a batch sent back to the endpoint arrives
// from it.
func TestAnswersFromDialledAddress(t *testing.T) {
	for _, tc := range srcCases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t)
			b := srcbind.New()
			fns, port := l.open(t, b)
			c := l.dial(t, tc.network)
			to := netip.AddrPortFrom(tc.dialled, port)
			const n = 16
			for i := range n {
				if _, err := c.WriteToUDPAddrPort([]byte{byte(i)}, to); err != nil {
					t.Fatal(err)
				}
			}
			eps := recv(t, b, fns[tc.fn], n)
			for i, ep := range eps {
				if ep.SrcIP() != tc.dialled || ep.DstIP() != tc.client {
					t.Errorf("endpoint %d: src %v dst %v; want src %v (the dialled address) dst %v", i, ep.SrcIP(), ep.DstIP(), tc.dialled, tc.client)
				}
			}
			bufs := make([][]byte, 5)
			for i := range bufs {
				bufs[i] = []byte("answer")
			}
			if err := b.Send(bufs, eps[len(eps)-1]); err != nil {
				t.Fatalf("send: %v", err)
			}
			for i, from := range answers(t, c, len(bufs)) {
				if from != tc.dialled {
					t.Errorf("answer %d came from %v; want %v, the address the client dialled", i, from, tc.dialled)
				}
			}
		})
	}
}

// TestDefaultBindAnswersFromPrimary is the control for the test above: the
// same exchange through wireguard-go's own bind answers from the address
// the kernel picks, on kernels where it turns UDP GRO on. If this fails
// after a wireguard-go upgrade, upstream has fixed the defect and srcbind
// may be dropped (srcbind's package doc).
func TestDefaultBindAnswersFromPrimary(t *testing.T) {
	testenv.RequireRoot(t)
	if !udpGRO(t) {
		t.Skip("this kernel cannot read UDP_GRO back (< 5.12): wireguard-go's bind keeps GRO off and the source with it")
	}
	for _, tc := range srcCases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t)
			b := conn.NewDefaultBind()
			fns, port := l.open(t, b)
			c := l.dial(t, tc.network)
			if _, err := c.WriteToUDPAddrPort([]byte{1}, netip.AddrPortFrom(tc.dialled, port)); err != nil {
				t.Fatal(err)
			}
			ep := recv(t, b, fns[tc.fn], 1)[0]
			if err := b.Send([][]byte{[]byte("answer")}, ep); err != nil {
				t.Fatalf("send: %v", err)
			}
			want := primary4
			if tc.client.Is6() {
				want = primary6
			}
			if from := answers(t, c, 1)[0]; from != want || ep.SrcIP().IsValid() {
				t.Errorf("default bind: answer from %v, endpoint src %v; want %v (the kernel's pick) and none: the defect srcbind works around is gone", from, ep.SrcIP(), want)
			}
		})
	}
}

// udpGRO reports whether UDP_GRO can be set and read back, the condition
// under which wireguard-go's bind reads through its split path.
func udpGRO(t *testing.T) bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1) != nil {
		return false
	}
	v, err := unix.GetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_GRO)
	return err == nil && v == 1
}

// TestSourceGone: once the address a peer dialled is removed from the
// node, Send does not fail: it forgets the address at once and the answer
// comes from the one the kernel picks.
func TestSourceGone(t *testing.T) {
	for _, tc := range srcCases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t)
			b := srcbind.New()
			fns, port := l.open(t, b)
			c := l.dial(t, tc.network)
			if _, err := c.WriteToUDPAddrPort([]byte{1}, netip.AddrPortFrom(tc.dialled, port)); err != nil {
				t.Fatal(err)
			}
			ep := recv(t, b, fns[tc.fn], 1)[0]
			if ep.SrcIP() != tc.dialled {
				t.Fatalf("endpoint src %v; want %v", ep.SrcIP(), tc.dialled)
			}
			l.node.Exec(t, "ip", "addr", "del", netip.PrefixFrom(tc.dialled, tc.bits).String(), "dev", tc.dev)
			if err := b.Send([][]byte{[]byte("a"), []byte("b")}, ep); err != nil {
				t.Fatalf("send after the source address was removed: %v", err)
			}
			want := primary4
			if tc.client.Is6() {
				want = primary6
			}
			for i, from := range answers(t, c, 2) {
				if from != want {
					t.Errorf("answer %d from %v; want %v", i, from, want)
				}
			}
			if ep.SrcIP().IsValid() {
				t.Errorf("endpoint still sends from %v after it failed", ep.SrcIP())
			}
		})
	}
}

// TestClose: Close ends the receive functions with net.ErrClosed, and the
// Bind opens again, on the port asked for.
func TestClose(t *testing.T) {
	l := newLab(t)
	b := srcbind.New()
	fns, port := l.open(t, b)
	errc := make(chan error, len(fns))
	for _, fn := range fns {
		go func() {
			bufs, sizes, eps := [][]byte{make([]byte, 1500)}, make([]int, 1), make([]conn.Endpoint, 1)
			_, err := fn(bufs, sizes, eps)
			errc <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for range fns {
		select {
		case err := <-errc:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("receive after Close: %v; want net.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a receive function did not return after Close")
		}
	}
	if err := l.node.Host.Do(func() error {
		_, got, err := b.Open(port)
		if err == nil && got != port {
			t.Errorf("reopen on %d got port %d", port, got)
		}
		return err
	}); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if err := l.node.Host.Do(func() error { _, _, err := b.Open(port); return err }); !errors.Is(err, conn.ErrBindAlreadyOpen) {
		t.Errorf("second Open: %v; want ErrBindAlreadyOpen", err)
	}
}

// TestConfiguredEndpoint: an endpoint from the config has no source until
// the peer's packets arrive, and is sent to from the kernel's pick.
func TestConfiguredEndpoint(t *testing.T) {
	l := newLab(t)
	b := srcbind.New()
	_, _ = l.open(t, b)
	for _, tc := range []struct {
		network string
		client  netip.Addr
		want    netip.Addr
	}{{"udp4", client4, primary4}, {"udp6", client6, primary6}} {
		c := l.dial(t, tc.network)
		port := c.LocalAddr().(*net.UDPAddr).Port
		ep, err := b.ParseEndpoint(netip.AddrPortFrom(tc.client, uint16(port)).String())
		if err != nil {
			t.Fatal(err)
		}
		if ep.SrcIP().IsValid() || ep.DstToString() != netip.AddrPortFrom(tc.client, uint16(port)).String() {
			t.Errorf("parsed endpoint: src %v, dst %s", ep.SrcIP(), ep.DstToString())
		}
		if err := b.Send([][]byte{[]byte("hello")}, ep); err != nil {
			t.Fatalf("send: %v", err)
		}
		if from := answers(t, c, 1)[0]; from != tc.want {
			t.Errorf("from %v; want %v", from, tc.want)
		}
	}
	if _, err := b.ParseEndpoint("not an endpoint"); err == nil {
		t.Error("ParseEndpoint accepted garbage")
	}
}

// TestSetMark: datagrams carry the firewall mark the device sets (policy
// routing keeps a tunnel's own traffic out of the tunnel with it), both
// families, from a remembered source too.
func TestSetMark(t *testing.T) {
	l := newLab(t)
	b := srcbind.New()
	fns, port := l.open(t, b)
	if err := b.SetMark(0x42); err != nil {
		t.Fatalf("SetMark: %v", err)
	}
	rules := fmt.Sprintf(`table inet marks {
	counter marked {}
	counter unmarked {}
	chain out {
		type filter hook output priority filter; policy accept;
		udp sport %[1]d meta mark 0x42 counter name "marked"
		udp sport %[1]d meta mark != 0x42 counter name "unmarked"
	}
}
`, port)
	f := filepath.Join(t.TempDir(), "marks.nft")
	if err := os.WriteFile(f, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	l.node.Exec(t, "nft", "-f", f)
	for _, tc := range []srcCase{srcCases[0], srcCases[2]} {
		c := l.dial(t, tc.network)
		if _, err := c.WriteToUDPAddrPort([]byte{1}, netip.AddrPortFrom(tc.dialled, port)); err != nil {
			t.Fatal(err)
		}
		ep := recv(t, b, fns[tc.fn], 1)[0]
		if err := b.Send([][]byte{[]byte("a"), []byte("b")}, ep); err != nil {
			t.Fatalf("%s: send: %v", tc.name, err)
		}
		if from := answers(t, c, 2); from[0] != tc.dialled || from[1] != tc.dialled {
			t.Errorf("%s: answers from %v; want %v", tc.name, from, tc.dialled)
		}
	}
	for name, want := range map[string]string{"marked": "packets 4 ", "unmarked": "packets 0 "} {
		if out := l.node.Exec(t, "nft", "list", "counter", "inet", "marks", name); !strings.Contains(out, want) {
			t.Errorf("counter %s: want %q:\n%s", name, want, out)
		}
	}
}
