package wg_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// client is a remote-access client: a kernel WireGuard device in its own
// namespace whose UDP socket stays in the underlay namespace it was made
// in (WireGuard keeps the socket where the device was born).
type client struct {
	ns   *testenv.NetNS
	pub  wgtypes.Key
	addr string // tunnel address, 10.90.0.x
}

// newClient makes a client with tunnel address addr that talks to the
// server (public key srv) at endpoint from underlay.
func newClient(t *testing.T, underlay *testenv.NetNS, name, addr string, srv wgtypes.Key, endpoint string) client {
	t.Helper()
	ns := testenv.NewNetNS(t)
	k, _ := wgtypes.GeneratePrivateKey()
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := underlay.NL.LinkAdd(&netlink.Wireguard{LinkAttrs: la}); err != nil {
		t.Fatalf("client %s: %v", name, err)
	}
	ep, _ := net.ResolveUDPAddr("udp", endpoint)
	_, all, _ := net.ParseCIDR("10.90.0.0/24")
	if err := withWgctrl(underlay.Host, func(c *wgctrl.Client) error {
		return c.ConfigureDevice(name, wgtypes.Config{PrivateKey: &k, Peers: []wgtypes.PeerConfig{{PublicKey: srv, Endpoint: ep, AllowedIPs: []net.IPNet{*all}}}})
	}); err != nil {
		t.Fatalf("client %s: %v", name, err)
	}
	l, err := underlay.NL.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := underlay.NL.LinkSetNsFd(l, int(ns.Handle)); err != nil {
		t.Fatalf("client %s to its netns: %v", name, err)
	}
	run(t, ns, "ip addr add "+addr+"/32 dev "+name, "ip link set "+name+" up", "ip route add 10.90.0.0/24 dev "+name)
	return client{ns: ns, pub: k.PublicKey(), addr: addr}
}

func withWgctrl(h *host.Host, fn func(*wgctrl.Client) error) error {
	return h.Do(func() error {
		c, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer c.Close()
		return fn(c)
	})
}

func run(t *testing.T, ns *testenv.NetNS, lines ...string) {
	t.Helper()
	for _, l := range lines {
		ns.Exec(t, strings.Fields(l)...)
	}
}

// peerDump is `wg show DEV dump` by public key: the kernel's own peer list,
// read with wg(8) rather than with the code under test.
func peerDump(t *testing.T, ns *testenv.NetNS, dev string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(ns.Exec(t, "wg", "show", dev, "dump")), "\n")
	out := map[string]string{}
	for _, l := range lines[1:] { // the first line is the interface
		f := strings.Split(l, "\t")
		out[f[0]] = strings.Join(f[2:], "\t") // endpoint, allowed ips, handshake, rx, tx, keepalive (not the psk)
	}
	return out
}

func peerFile(t *testing.T, dir, name string, pub wgtypes.Key, allowed string) {
	t.Helper()
	s := fmt.Sprintf("publicKey: %s\nallowedIPs: [%s]\n", pub, allowed)
	if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRegisterOfFiftyPeers: 50 peers with live sessions; one peer file
// edited, one added, one deleted. The kernel's peer list shows only those
// three changed: the other 48 keep their handshake time and counters. The
// edited peer's traffic follows its new allowed IPs.
func TestRegisterOfFiftyPeers(t *testing.T) {
	testenv.RequireModule(t, "wireguard")
	l := newLab(t)
	node, wan := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "eth0", wan, "eth0")
	run(t, node, "ip addr add 198.18.0.1/24 dev eth0")
	run(t, wan, "ip addr add 198.18.0.2/24 dev eth0")
	key, srv := l.key("wg0")
	peers := filepath.Join(l.dir, "peers.d")
	os.Mkdir(peers, 0o755)
	const n = 50
	clients := make([]client, n+1)
	for i := range clients {
		clients[i] = newClient(t, wan, fmt.Sprintf("c%d", i), fmt.Sprintf("10.90.0.%d", 10+i), srv, "198.18.0.1:51820")
		if i < n {
			peerFile(t, peers, fmt.Sprintf("client%02d", i), clients[i].pub, clients[i].addr+"/32")
		}
	}
	yaml := fmt.Sprintf("wireguard:\n  - name: wg0\n    implementation: kernel\n    privateKeyFile: %s\n    listenPort: 51820\n    addresses: [10.90.0.1/24]\n    peersDir: %s\n", key, peers)
	h := l.handle(node)
	p, _ := l.sync(h, l.desired(yaml), false)
	if got := strings.Count(p.String(), "+ wireguard wg0 peer "); got != n {
		t.Fatalf("first sync added %d peers, want %d:\n%s", got, n, p)
	}
	pingAll(t, clients[:n], "10.90.0.1")
	before := peerDump(t, node, "wg0")
	for i := 0; i < n; i++ {
		if f := strings.Split(before[clients[i].pub.String()], "\t"); len(f) < 3 || f[2] == "0" {
			t.Fatalf("client %d has no session: %q", i, before[clients[i].pub.String()])
		}
	}

	// Edit client00 (new allowed IP), delete client01, add client50.
	peerFile(t, peers, "client00", clients[0].pub, "10.90.0.110/32")
	os.Remove(filepath.Join(peers, "client01.yaml"))
	peerFile(t, peers, "client50", clients[n].pub, clients[n].addr+"/32")
	pw := h.PeerWrites()
	p, _ = l.sync(h, l.desired(yaml), false)
	want := fmt.Sprintf("- wireguard wg0 peer %s\n~ wireguard wg0 peer %s (client00) allowed IPs 10.90.0.10/32 -> 10.90.0.110/32\n+ wireguard wg0 peer %s (client50) allowed IPs 10.90.0.60/32\n",
		clients[1].pub, clients[0].pub, clients[n].pub)
	if p.String() != want {
		t.Errorf("plan after the edits:\n%s\nwant:\n%s", p, want)
	}
	if got := h.PeerWrites() - pw; got != 3 {
		t.Errorf("%d peer entries written, want 3", got)
	}
	after := peerDump(t, node, "wg0")
	changed := 0
	for i := 2; i < n; i++ {
		k := clients[i].pub.String()
		if before[k] != after[k] {
			changed++
			t.Errorf("client %d changed though its file did not:\n before %q\n after  %q", i, before[k], after[k])
		}
	}
	if _, ok := after[clients[1].pub.String()]; ok {
		t.Error("deleted client01 is still a peer")
	}
	if got := after[clients[n].pub.String()]; !strings.Contains(got, "10.90.0.60/32") {
		t.Errorf("added client50: %q", got)
	}
	if len(after) != n {
		t.Errorf("kernel has %d peers, want %d", len(after), n)
	}
	t.Logf("48 untouched peers: %d changed", changed)

	// The edited peer's traffic follows its allowed IPs: from its new
	// address it gets through, from the old one the server drops it.
	run(t, clients[0].ns, "ip addr add 10.90.0.110/32 dev c0")
	clients[0].ns.Exec(t, "ping", "-c", "2", "-W", "3", "-I", "10.90.0.110", "10.90.0.1")
	if out, err := clients[0].ns.TryExec("ping", "-c", "2", "-W", "2", "-I", "10.90.0.10", "10.90.0.1"); err == nil {
		t.Errorf("the old address 10.90.0.10 still gets through:\n%s", out)
	}
	pingAll(t, clients[n:], "10.90.0.1")
	pingAll(t, clients[2:n], "10.90.0.1")

	// And nothing changed is nothing written.
	cw := h.ConfigWrites()
	if p, _ := l.sync(h, l.desired(yaml), false); !p.Empty() || h.ConfigWrites() != cw {
		t.Errorf("no-op sync: plan %q, %d writes", p, h.ConfigWrites()-cw)
	}
}

func pingAll(t *testing.T, cs []client, dst string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(cs))
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := c.ns.TryExec("ping", "-c", "1", "-W", "5", "-I", c.addr, dst); err != nil {
				errs[i] = fmt.Errorf("%s: %v\n%s", c.addr, err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("ping %s:\n%v", dst, err)
	}
}

// failingDNS is a real resolver whose DNS server cannot be reached, as on
// a node whose resolver is down: look-ups fail, /etc/hosts still answers.
var failingDNS = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
	return nil, errors.New("no DNS server in the test lab")
}}

// TestBrokenPeerFileAndUnresolvableEndpoint: a peer file that does not
// parse and a peer whose endpoint does not resolve are reported (plan,
// status) and skipped; the device and its other peers keep working.
func TestBrokenPeerFileAndUnresolvableEndpoint(t *testing.T) {
	for _, impl := range impls(t) {
		t.Run(impl, func(t *testing.T) {
			l := newLab(t)
			a, b := testenv.NewNetNS(t), testenv.NewNetNS(t)
			a.Veth(t, "eth0", b, "eth0")
			run(t, a, "ip addr add 198.18.0.1/24 dev eth0")
			run(t, b, "ip addr add 198.18.0.2/24 dev eth0")
			ka, pa := l.key("a")
			kb, pb := l.key("b")
			_, pc := l.key("c")
			na, nb := devName("wga"), devName("wgb")
			peers := filepath.Join(l.dir, "peers.d")
			os.Mkdir(peers, 0o755)
			os.WriteFile(filepath.Join(peers, "good.yaml"), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.99.0.2/32]\nendpoint: 198.18.0.2:51821\n", pb)), 0o644)
			os.WriteFile(filepath.Join(peers, "broken.yaml"), []byte("publicKey: [oops\n"), 0o644)
			os.WriteFile(filepath.Join(peers, "faraway.yaml"), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.99.0.3/32]\nendpoint: vpn.nosuch.invalid:51820\n", pc)), 0o644)
			ya := fmt.Sprintf("wireguard:\n  - name: %s\n    implementation: %s\n    privateKeyFile: %s\n    listenPort: 51820\n    addresses: [10.99.0.1/24]\n    peersDir: %s\n", na, impl, ka, peers)
			ha, hb := l.handle(a), l.handle(b)
			ha.Resolver = failingDNS
			p, err := l.sync(ha, l.desired(ya), true)
			for _, w := range []string{
				"! wireguard " + na + ": peer skipped: " + filepath.Join(peers, "broken.yaml") + ":1:",
				"! wireguard " + na + " peer " + pc.String() + " (faraway): endpoint vpn.nosuch.invalid:51820 does not resolve (",
				"+ wireguard " + na + " peer " + pb.String() + " (good)",
			} {
				if !strings.Contains(p.String(), w) {
					t.Errorf("plan lacks %q:\n%s", w, p)
				}
			}
			if err == nil || !strings.Contains(err.Error(), "broken.yaml") || !strings.Contains(err.Error(), "vpn.nosuch.invalid") {
				t.Errorf("sync error %v: want both problems named", err)
			}
			l.sync(hb, l.desired(tunnelYAML(nb, impl, kb, 51821, "10.99.0.2/24", pa, "10.99.0.1/32", "198.18.0.1:51820", "")), false)
			a.Exec(t, "ping", "-c", "2", "-W", "3", "10.99.0.2")
			dump := peerDump(t, a, na)
			if _, ok := dump[pc.String()]; ok || len(dump) != 1 {
				t.Errorf("kernel peers %v: want only the good peer", dump)
			}
			st := l.status(ha, l.desired(ya))
			if len(st) != 1 || len(st[0].Problems) != 2 || st[0].LivePeers() != 1 {
				t.Errorf("status: %+v", st)
			}
		})
	}
}
