package wg_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestAdoptKernelDeviceKeepsItsSession: a kernel WireGuard device made the
// old way (`ip link add type wireguard`, `wg set`, `ip addr`, as wg-quick
// does) with 20 peers, one of them in a live session with a peer in
// another namespace, is adopted by a config declaring exactly what it has.
// The sync marks it and writes nothing else: the same ifindex, no
// WireGuard message at all, so the live peer's last handshake stays the
// one it was and its counters go on from where they were (no new
// handshake forced). The next plan is empty. Kernel WireGuard: VM tier.
func TestAdoptKernelDeviceKeepsItsSession(t *testing.T) {
	testenv.RequireModule(t, "wireguard")
	l := newLab(t)
	a, b := testenv.NewNetNS(t), testenv.NewNetNS(t)
	a.Veth(t, "eth0", b, "eth0")
	a.Exec(t, "ip", "addr", "add", "198.18.0.1/24", "dev", "eth0")
	b.Exec(t, "ip", "addr", "add", "198.18.0.2/24", "dev", "eth0")
	ka, pa := l.key("a")
	kb, pb := l.key("b")

	b.Exec(t, "ip", "link", "add", "wg0", "type", "wireguard")
	b.Exec(t, "wg", "set", "wg0", "private-key", kb, "listen-port", "51821",
		"peer", pa.String(), "allowed-ips", "10.99.0.1/32", "endpoint", "198.18.0.1:51820")
	b.Exec(t, "ip", "addr", "add", "10.99.0.2/24", "dev", "wg0")
	b.Exec(t, "ip", "link", "set", "wg0", "up")

	// The node's device, with the live peer and 19 clients.
	a.Exec(t, "ip", "link", "add", "wg0", "type", "wireguard")
	a.Exec(t, "wg", "set", "wg0", "private-key", ka, "listen-port", "51820",
		"peer", pb.String(), "allowed-ips", "10.99.0.2/32", "endpoint", "198.18.0.2:51821")
	yaml := fmt.Sprintf("wireguard:\n  - name: wg0\n    privateKeyFile: %s\n    listenPort: 51820\n    addresses: [10.99.0.1/24]\n    adopt: true\n    peers:\n"+
		"      - {name: far, publicKey: %q, allowedIPs: [10.99.0.2/32], endpoint: \"198.18.0.2:51821\"}\n", ka, pb)
	for i := 1; i < 20; i++ {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		ip := fmt.Sprintf("10.99.1.%d/32", i)
		a.Exec(t, "wg", "set", "wg0", "peer", k.PublicKey().String(), "allowed-ips", ip)
		yaml += fmt.Sprintf("      - {name: client%d, publicKey: %q, allowedIPs: [%s]}\n", i, k.PublicKey(), ip)
	}
	a.Exec(t, "ip", "addr", "add", "10.99.0.1/24", "dev", "wg0")
	a.Exec(t, "ip", "link", "set", "wg0", "up")
	a.Exec(t, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.99.0.2")

	index := func() int {
		f := strings.SplitN(a.Exec(t, "ip", "-o", "link", "show", "wg0"), ":", 2)
		n, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatalf("ip -o link show wg0: %q", f)
		}
		return n
	}
	// session reads the live peer's line of `wg show wg0 dump`: latest
	// handshake (unix seconds), bytes received and sent.
	session := func() (hs, rx, tx int64) {
		for _, line := range strings.Split(a.Exec(t, "wg", "show", "wg0", "dump"), "\n") {
			f := strings.Split(line, "\t")
			if len(f) == 8 && f[0] == pb.String() {
				hs, _ = strconv.ParseInt(f[4], 10, 64)
				rx, _ = strconv.ParseInt(f[5], 10, 64)
				tx, _ = strconv.ParseInt(f[6], 10, 64)
				return
			}
		}
		t.Fatalf("no peer %s in wg show wg0 dump", pb)
		return
	}
	idx := index()
	hs0, rx0, tx0 := session()
	if hs0 == 0 {
		t.Fatal("the live peer has no handshake before the adoption")
	}
	peers := strings.Count(a.Exec(t, "wg", "show", "wg0", "peers"), "\n")

	d := l.desired(yaml)
	h := l.handle(a)
	writes, cfg, msgs, pw := h.Host.Writes(), h.ConfigWrites(), h.MessageWrites(), h.PeerWrites()
	p, _ := l.sync(h, d, false)
	if want := "~ wireguard wg0 adopt (mark as nodeagent's)\n"; p.String() != want || !p.Report().OnlyAdoptions() {
		t.Errorf("adopting wg0 as it is plans:\n%swant only:\n%s", p, want)
	}
	nl, wgw := h.Host.Writes()-writes, h.ConfigWrites()-cfg+h.MessageWrites()-msgs+h.PeerWrites()-pw
	hs1, rx1, tx1 := session()
	t.Logf("%d peers; the adopting sync: %d netlink writes, %d WireGuard writes; ifindex %d -> %d; live peer handshake %d -> %d, rx %d -> %d, tx %d -> %d",
		peers, nl, wgw, idx, index(), hs0, hs1, rx0, rx1, tx0, tx1)
	if peers != 20 || nl > 1 || wgw != 0 {
		t.Errorf("the adoption wrote more than the mark: %d netlink writes, %d WireGuard writes (%d peers)", nl, wgw, peers)
	}
	if index() != idx {
		t.Errorf("wg0 was recreated: ifindex %d -> %d", idx, index())
	}
	if alias := strings.TrimSpace(a.Exec(t, "cat", "/sys/class/net/wg0/ifalias")); alias != host.LinkAlias {
		t.Errorf("wg0 not marked: ifalias %q", alias)
	}
	if hs1 != hs0 || rx1 < rx0 || tx1 < tx0 {
		t.Errorf("the live session was disturbed: handshake %d -> %d, rx %d -> %d, tx %d -> %d", hs0, hs1, rx0, rx1, tx0, tx1)
	}

	// The session goes on: traffic flows, counted on from where it was,
	// without a new handshake.
	time.Sleep(1100 * time.Millisecond) // a new handshake would show a later second
	a.Exec(t, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.99.0.2")
	hs2, rx2, tx2 := session()
	t.Logf("after 3 more pings: handshake %d, rx %d, tx %d", hs2, rx2, tx2)
	if hs2 != hs0 || rx2 <= rx1 || tx2 <= tx1 {
		t.Errorf("after the adoption: handshake %d -> %d, rx %d -> %d, tx %d -> %d; want the same handshake and counters going on", hs0, hs2, rx1, rx2, tx1, tx2)
	}

	writes = h.Host.Writes()
	if p, _ := l.sync(h, d, false); !p.Empty() || h.Host.Writes() != writes {
		t.Errorf("plan after the adoption:\n%s(%d writes)", p, h.Host.Writes()-writes)
	}
}
