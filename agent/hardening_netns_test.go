package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// regLab is a WireGuard server on node whose peers come from a register,
// and clients, each in a namespace of its own with a veth to node and a
// WireGuard device converged by nodeagent (netcfg, in this process).
type regLab struct {
	t         *testing.T
	node      *testenv.NetNS
	dir       string
	peers     string
	cfg       string
	wg        string
	serverPub wgtypes.Key
	us        *wg.Userspace
	clients   []*regClient
}

type regClient struct {
	ns   *testenv.NetNS
	key  string // private key file
	pub  wgtypes.Key
	addr string // in the tunnel, 10.90.0.N
	dev  string
}

func newRegLab(t *testing.T, clients int) *regLab {
	t.Helper()
	l := &regLab{t: t, node: testenv.NewNetNS(t), dir: t.TempDir(), wg: uniqueName("wgr")}
	l.peers = filepath.Join(l.dir, "peers.d")
	os.Mkdir(l.peers, 0o755)
	var serverKey string
	serverKey, l.serverPub = l.key("server")
	l.us = wg.NewUserspace(nil)
	t.Cleanup(l.us.Close)
	for i := range clients {
		c := &regClient{ns: testenv.NewNetNS(t), addr: fmt.Sprintf("10.90.0.%d", 11+i), dev: uniqueName("wgc")}
		c.key, c.pub = l.key(fmt.Sprintf("client%d", i))
		up := fmt.Sprintf("u%d", i)
		l.node.Veth(t, up, c.ns, "eth0")
		l.node.Exec(t, "ip", "addr", "add", fmt.Sprintf("198.18.%d.1/24", i), "dev", up)
		c.ns.Exec(t, "ip", "addr", "add", fmt.Sprintf("198.18.%d.2/24", i), "dev", "eth0")
		l.clients = append(l.clients, c)
	}
	l.cfg = filepath.Join(l.dir, "nodeagent.yaml")
	os.WriteFile(l.cfg, []byte(fmt.Sprintf(`dad: {disabled: true}
wireguard:
  - name: %s
    privateKeyFile: %s
    listenPort: 51820
    addresses: [10.90.0.1/24]
    peersDir: %s
routing:
  tables:
    - {id: 150, killSwitch: true, routes: [{to: 10.70.0.0/24, dev: %s}]}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
checks: {gatewayARP: false}
`, l.wg, serverKey, l.peers, l.wg)), 0o600)
	return l
}

func (l *regLab) key(name string) (string, wgtypes.Key) {
	k, _ := wgtypes.GeneratePrivateKey()
	p := filepath.Join(l.dir, name+".key")
	if err := os.WriteFile(p, []byte(k.String()+"\n"), 0o600); err != nil {
		l.t.Fatal(err)
	}
	return p, k.PublicKey()
}

// peerFile is client i's register entry in YAML.
func (l *regLab) peerFile(i int) string {
	return fmt.Sprintf("publicKey: %s\nallowedIPs: [%s/32]\n", l.clients[i].pub, l.clients[i].addr)
}

// dial converges client i's end of the tunnel and pings node through it.
func (l *regLab) dial(i int) error {
	l.t.Helper()
	c := l.clients[i]
	yaml := fmt.Sprintf(`wireguard:
  - name: %s
    privateKeyFile: %s
    addresses: [%s/24]
    peers:
      - {publicKey: %s, endpoint: "198.18.%d.1:51820", allowedIPs: [10.90.0.0/24], persistentKeepalive: 1}
`, c.dev, c.key, c.addr, l.serverPub, i)
	cfg, err := config.Parse(filepath.Join(l.dir, c.ns.Name+".yaml"), []byte(yaml))
	if err != nil {
		l.t.Fatalf("client config: %v", err)
	}
	d, err := netcfg.FromConfig(cfg, "")
	if err != nil {
		l.t.Fatal(err)
	}
	cv := &netcfg.Converger{Host: c.ns.Host, Userspace: l.us}
	defer cv.Close()
	if _, err := cv.Sync(context.Background(), d); err != nil {
		l.t.Fatalf("client %d: %v", i, err)
	}
	out, err := c.ns.TryExec("ping", "-c", "2", "-i", "0.3", "-W", "3", "10.90.0.1")
	if err != nil {
		return fmt.Errorf("client %d ping 10.90.0.1: %v\n%s", i, err, out)
	}
	return nil
}

// statusJSON, planJSON and peersJSON are what the API serves, as text.
func apiTexts(t *testing.T, socket string) map[string]string {
	t.Helper()
	c := api.NewClient(socket)
	defer c.CloseIdleConnections()
	ctx := context.Background()
	out := map[string]string{}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	b, _ := json.Marshal(st)
	out["status"] = string(b)
	p, err := c.Plan(ctx)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	b, _ = json.Marshal(p)
	out["plan"] = string(b)
	peers, err := c.Peers(ctx)
	if err != nil {
		t.Fatalf("peers: %v", err)
	}
	b, _ = json.Marshal(peers)
	out["peers"] = string(b)
	return out
}

// TestHostileRegisterInTheDaemon: the daemon with hostile register entries
// (a link to a secret outside, a FIFO, a world-writable file, a 10 MiB
// file) reports each in one line that quotes none of their content, in
// the log, status, plan and peers; a link to a peer file inside the
// register works, and the node is ready (degraded).
func TestHostileRegisterInTheDaemon(t *testing.T) {
	const marker = "MARKER-7f3a-must-not-appear"
	l := newRegLab(t, 1)
	outside := t.TempDir()
	secret := filepath.Join(outside, "shadow")
	os.WriteFile(secret, []byte("root:$y$"+marker+":19000:0:99999:7:::\n"+marker+": x\n"), 0o600)
	os.Symlink(secret, filepath.Join(l.peers, "shadow.yaml"))
	syscall.Mkfifo(filepath.Join(l.peers, "fifo.yaml"), 0o600)
	open := filepath.Join(l.peers, "open.yaml")
	os.WriteFile(open, []byte("# "+marker+"\npublicKey: "+marker+"\n"), 0o666)
	os.Chmod(open, 0o666)
	big := "# " + marker + "\n" + strings.Repeat("#", 10<<20) + "\n"
	os.WriteFile(filepath.Join(l.peers, "big.yaml"), []byte(big), 0o600)
	os.Mkdir(filepath.Join(l.peers, "keep"), 0o755)
	os.WriteFile(filepath.Join(l.peers, "keep", "client0.yaml"), []byte(l.peerFile(0)), 0o600)
	os.Symlink("keep/client0.yaml", filepath.Join(l.peers, "client0.yaml"))

	r := startDaemon(t, l.node, l.cfg, nil)
	if err := l.dial(0); err != nil {
		t.Errorf("the peer behind a link inside the register: %v", err)
	}
	s := r.d.Status()
	if !s.Ready || !s.Degraded {
		t.Errorf("ready %v degraded %v; want ready and degraded", s.Ready, s.Degraded)
	}
	var skipped []string
	for _, o := range s.Skipped {
		skipped = append(skipped, o.Message)
	}
	for _, want := range []string{
		"shadow.yaml: is a symbolic link that leads out of " + l.peers,
		"fifo.yaml: is not a regular file (a FIFO)",
		"open.yaml: is writable by others (mode 0666); chmod o-w it",
		"big.yaml: is too big (",
	} {
		if !slices.ContainsFunc(skipped, func(m string) bool { return has(m, want) }) {
			t.Errorf("skipped %q lacks %q", skipped, want)
		}
	}
	texts := apiTexts(t, r.socket)
	texts["log"] = r.log.String()
	for what, text := range texts {
		if has(text, marker) || has(text, "root:$y$") {
			t.Errorf("the %s quotes a hostile entry's content", what)
		}
	}
	if !has(texts["peers"], l.clients[0].pub.String()) {
		t.Errorf("peers lacks the good peer:\n%s", texts["peers"])
	}
}

// TestBadPeerFileStillReady: one peer file with a typo and two good ones.
// The daemon sends READY=1, is Degraded naming the file and line, the two
// good peers pass traffic, and the bad file is logged once, not on every
// sync.
func TestBadPeerFileStillReady(t *testing.T) {
	l := newRegLab(t, 2)
	n := listenNotify(t)
	os.WriteFile(filepath.Join(l.peers, "good0.yaml"), []byte(l.peerFile(0)), 0o600)
	os.WriteFile(filepath.Join(l.peers, "good1.conf"), []byte(fmt.Sprintf("[Peer]\nPublicKey = %s\nAllowedIPs = %s/32\n", l.clients[1].pub, l.clients[1].addr)), 0o600)
	bad := filepath.Join(l.peers, "bad.yaml")
	k, _ := wgtypes.GeneratePrivateKey()
	os.WriteFile(bad, []byte("publicKey: "+k.PublicKey().String()+"\nallowedIPs: [10.90.0.300/32]\n"), 0o600)
	r := startDaemon(t, l.node, l.cfg, nil)
	waitFor(t, "READY=1", 10*time.Second, func() bool {
		return slices.ContainsFunc(n.all(), func(m notifyMsg) bool { return has(m.text, "READY=1") })
	})
	for i := range l.clients {
		if err := l.dial(i); err != nil {
			t.Error(err)
		}
	}
	s := r.d.Status()
	c := s.Condition(api.CondPeersConfigured)
	if !s.Ready || !s.Degraded || c == nil || c.Status != api.False || !has(c.Message, bad+":2:") {
		t.Errorf("ready %v degraded %v PeersConfigured %+v; want ready, degraded, False naming %s:2", s.Ready, s.Degraded, c, bad)
	}
	if len(s.Skipped) != 1 || !has(s.Skipped[0].Message, bad+":2: allowedIPs[0]:") || s.Skipped[0].Subsystem != "wireguard" {
		t.Errorf("skipped %+v", s.Skipped)
	}
	if len(s.Failed) != 0 {
		t.Errorf("failed %+v; a skipped peer file is not a failed object", s.Failed)
	}
	// More syncs: the bad file is news once.
	before := s.LastSync.Count
	for range 3 {
		r.d.kickNow(trigResync)
		time.Sleep(300 * time.Millisecond)
	}
	waitFor(t, "three more syncs", 10*time.Second, func() bool { return r.d.Status().LastSync.Count >= before+3 })
	// Counted at the levels the daemon logs at by default (the test's
	// logger also keeps debug lines, where every sync's plan goes).
	got := 0
	for _, line := range strings.Split(r.log.String(), "\n") {
		if has(line, "bad.yaml:2") && !has(line, "level=DEBUG") {
			got++
		}
	}
	if got != 1 {
		t.Errorf("the bad file is logged %d times over %d syncs; want once", got, r.d.Status().LastSync.Count)
	}
	// Fixed: no longer degraded.
	os.WriteFile(bad, []byte("publicKey: "+k.PublicKey().String()+"\nallowedIPs: [10.90.0.30/32]\n"), 0o600)
	waitFor(t, "not degraded after the fix", 10*time.Second, func() bool { s := r.d.Status(); return s.Ready && !s.Degraded })
}

// TestFIFOKeyFileAndWedgedLoop: a FIFO swapped in for a preshared key file
// does not wedge the loop (a drift repair still lands within a second,
// plan still answers) and the peer is reported; a loop wedged by the test
// hook makes /healthz fail within the stall bound.
func TestFIFOKeyFileAndWedgedLoop(t *testing.T) {
	l := newRegLab(t, 1)
	psk := filepath.Join(l.dir, "client0.psk")
	k, _ := wgtypes.GenerateKey()
	os.WriteFile(psk, []byte(k.String()+"\n"), 0o600)
	file := filepath.Join(l.peers, "client0.yaml")
	os.WriteFile(file, []byte(l.peerFile(0)+"presharedKeyFile: "+psk+"\n"), 0o600)
	const bound = time.Second
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = time.Hour; o.StallBound = bound })
	if out := l.node.Exec(t, "wg", "show", l.wg, "preshared-keys"); !has(out, l.clients[0].pub.String()) || has(out, "(none)") {
		t.Fatalf("the peer has no preshared key:\n%s", out)
	}

	// Control: opening a FIFO the ordinary way blocks until a writer comes.
	fifo := filepath.Join(t.TempDir(), "fifo")
	syscall.Mkfifo(fifo, 0o600)
	opened := make(chan struct{})
	go func() {
		if f, err := os.Open(fifo); err == nil {
			f.Close()
		}
		close(opened)
	}()
	select {
	case <-opened:
		t.Fatal("control: open(2) of a FIFO returned without a writer")
	case <-time.After(300 * time.Millisecond):
	}
	w, _ := os.OpenFile(fifo, os.O_WRONLY, 0)
	<-opened
	w.Close()

	os.Remove(psk)
	if err := syscall.Mkfifo(psk, 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(file, []byte(l.peerFile(0)+"presharedKeyFile: "+psk+"\n# touched\n"), 0o600)
	waitFor(t, "the peer reported", 10*time.Second, func() bool {
		return slices.ContainsFunc(r.d.Status().Skipped, func(o api.Object) bool { return has(o.Message, psk+" is not a regular file (a FIFO)") })
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := api.NewClient(r.socket).Plan(ctx); err != nil {
		t.Errorf("plan with a FIFO for a key file: %v", err)
	}
	// The loop still repairs drift, from kernel events.
	l.node.Exec(t, "ip", "rule", "del", "priority", "1000")
	took := waitFor(t, "the rule back", 5*time.Second, func() bool {
		out, _ := l.node.TryExec("ip", "rule", "show", "priority", "1000")
		return has(out, "lookup 150")
	})
	t.Logf("rule restored %.0f ms after deletion, with a FIFO for a key file", ms(took))
	if took > time.Second {
		t.Errorf("rule restored after %s; want < 1s", took)
	}

	// Wedged: /healthz fails within the bound, and recovers.
	c := api.NewClient(r.socket)
	healthy := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Healthz(ctx) == nil
	}
	if !healthy() {
		t.Fatal("/healthz fails before the wedge")
	}
	start := time.Now()
	r.d.stall <- 4 * time.Second
	failedAfter := waitFor(t, "/healthz to fail", 4*time.Second, func() bool { return !healthy() })
	t.Logf("/healthz failed %.0f ms into the wedge (bound %s)", ms(failedAfter), bound)
	if failedAfter > bound+500*time.Millisecond {
		t.Errorf("/healthz failed only after %s; bound %s", failedAfter, bound)
	}
	waitFor(t, "/healthz back", 10*time.Second, healthy)
	if time.Since(start) < 4*time.Second {
		t.Errorf("/healthz recovered during the wedge")
	}
}

// TestEventStormDoesNotStarveRepairs: a harmless change to a watched link
// every 30 ms (and every 10 ms) does not delay the repair of a deleted nft
// table or rule past a second.
func TestEventStormDoesNotStarveRepairs(t *testing.T) {
	l := newLab(t)
	// 20 deletions of one object in a row are timed, not a fight.
	r := startDaemon(t, l.node, l.cfg, func(o *RunOptions) { o.Resync = time.Hour; o.FightBound = 1000 })
	n := l.node
	shim, err := n.NL.LinkByName("shim0")
	if err != nil {
		t.Fatal(err)
	}
	kinds := []struct {
		name    string
		del     func()
		present func() bool
	}{
		{"nft table", func() { n.Exec(t, "nft", "delete", "table", "inet", "nodeagent") },
			func() bool {
				_, err := n.TryExec("nft", "list", "chain", "inet", "nodeagent", "postrouting")
				return err == nil
			}},
		{"rule", func() { n.Exec(t, "ip", "rule", "del", "priority", "1000") },
			func() bool {
				out, _ := n.TryExec("ip", "rule", "show", "priority", "1000")
				return has(out, "lookup 150")
			}},
	}
	for _, every := range []time.Duration{30 * time.Millisecond, 10 * time.Millisecond} {
		stop := make(chan struct{})
		stormDone := make(chan int)
		go func() {
			changes := 0
			for i := 0; ; i++ {
				select {
				case <-stop:
					stormDone <- changes
					return
				case <-time.After(every):
				}
				if n.NL.LinkSetTxQLen(shim, 1000+i%2) == nil {
					changes++
				}
			}
		}()
		// Control: the storm reaches the daemon (each change is an event
		// on a watched link, and wakes the loop).
		count0 := r.d.Status().LastSync.Count
		time.Sleep(time.Second)
		if woke := r.d.Status().LastSync.Count - count0; woke < 3 {
			t.Errorf("storm every %s: the daemon synced %d times in a second; the storm does not reach it", every, woke)
		}
		for _, k := range kinds {
			var lat []time.Duration
			for i := range 20 {
				if !k.present() {
					t.Fatalf("%s: not present before trial %d", k.name, i)
				}
				k.del()
				lat = append(lat, waitFor(t, k.name+" restored", 20*time.Second, k.present))
				time.Sleep(50 * time.Millisecond)
			}
			slices.Sort(lat)
			t.Logf("storm every %s: %s restored, median %.0f ms, max %.0f ms (20 trials)", every, k.name, ms(lat[len(lat)/2]), ms(lat[len(lat)-1]))
			if lat[len(lat)-1] >= time.Second {
				t.Errorf("storm every %s: a deleted %s came back after %s; want < 1s", every, k.name, lat[len(lat)-1])
			}
		}
		close(stop)
		t.Logf("storm every %s: %d link changes", every, <-stormDone)
	}
}

// ownerTable creates "inet nodeagent" in ns with NFT_TABLE_F_OWNER, as a
// process that holds its netlink socket open would (firewalld-style), and
// returns the func that closes the socket, which removes the table.
func ownerTable(t *testing.T, ns *testenv.NetNS) func() {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns.Handle)})
	if err != nil {
		t.Fatal(err)
	}
	nfgen := func(family uint8, resID uint16) []byte {
		b := []byte{family, unix.NFNETLINK_V0, 0, 0}
		binary.BigEndian.PutUint16(b[2:], resID)
		return b
	}
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(unix.NFTA_TABLE_NAME, "nodeagent")
	ae.Uint32(unix.NFTA_TABLE_FLAGS, 2) // NFT_TABLE_F_OWNER
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	msgs := []netlink.Message{
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), Flags: netlink.Request},
			Data: nfgen(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)},
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE), Flags: netlink.Request | netlink.Acknowledge | netlink.Create},
			Data: append(nfgen(unix.NFPROTO_INET, 0), attrs...)},
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_END), Flags: netlink.Request},
			Data: nfgen(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)},
	}
	if _, err := c.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Receive(); err != nil {
		t.Fatalf("owner table: %v", err)
	}
	if out := ns.Exec(t, "nft", "list", "tables"); !has(out, "table inet nodeagent") {
		t.Fatalf("owner table not created:\n%s", out)
	}
	closed := false
	closeFn := func() {
		if !closed {
			closed = true
			c.Close()
		}
	}
	t.Cleanup(closeFn)
	return closeFn
}

// countAt counts packets from src at ns's prerouting.
func countAt(t *testing.T, ns *testenv.NetNS, table, src string) func() int {
	t.Helper()
	ns.Exec(t, "nft", "add", "table", "ip", table)
	ns.Exec(t, "nft", "add chain ip "+table+" pre { type filter hook prerouting priority -400 ; }")
	ns.Exec(t, "nft", "add", "rule", "ip", table, "pre", "ip", "saddr", src, "counter")
	re := regexp.MustCompile(`packets (\d+)`)
	return func() int {
		m := re.FindStringSubmatch(ns.Exec(t, "nft", "list", "chain", "ip", table, "pre"))
		if m == nil {
			return -1
		}
		v, _ := strconv.Atoi(m[1])
		return v
	}
}

// TestForeignOwnerTableHoldsForwarding: on a fresh node a foreign
// "inet nodeagent" table with the owner flag keeps nodeagent from arming
// the kill switch; nodeagent then leaves forwarding off, says why, and
// nothing from the kill-switch source reaches the WAN. When the foreign
// table goes, everything converges and VLAN traffic leaves by the tunnel.
func TestForeignOwnerTableHoldsForwarding(t *testing.T) {
	lan, node, wan, tun := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "vlan50", lan, "eth0")
	node.Veth(t, "uplink", wan, "eth0")
	node.Veth(t, "tun0", tun, "eth0")
	for _, c := range [][]string{
		{"lan", "ip addr add 10.10.50.20/24 dev eth0", "ip route add default via 10.10.50.1"},
		{"node", "ip addr add 10.10.50.1/24 dev vlan50", "ip addr add 192.0.2.1/24 dev uplink", "ip route add default via 192.0.2.2", "ip addr add 10.99.0.1/24 dev tun0"},
		{"wan", "ip addr add 192.0.2.2/24 dev eth0", "ip addr add 198.51.100.10/32 dev lo", "ip route add 10.10.50.0/24 via 192.0.2.1"},
		{"tun", "ip addr add 10.99.0.2/24 dev eth0", "ip addr add 198.51.100.10/32 dev lo", "ip route add 10.10.50.0/24 via 10.99.0.1"},
	} {
		ns := map[string]*testenv.NetNS{"lan": lan, "node": node, "wan": wan, "tun": tun}[c[0]]
		for _, line := range c[1:] {
			ns.Exec(t, strings.Fields(line)...)
		}
	}
	atWAN, atTun := countAt(t, wan, "count", "10.10.50.0/24"), countAt(t, tun, "count", "10.10.50.0/24")
	if v := node.Exec(t, "sysctl", "-n", "net.ipv4.ip_forward"); strings.TrimSpace(v) != "0" {
		t.Fatalf("a fresh namespace forwards already: %s", v)
	}
	release := ownerTable(t, node)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(`dad: {disabled: true}
sysctls:
  net.ipv4.ip_forward: "1"
routing:
  tables:
    - {id: 150, killSwitch: true, routes: [{to: default, via: 10.99.0.2, dev: tun0}, {to: 10.10.50.0/24, dev: vlan50}]}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  killSwitch: [{from: 10.10.50.0/24, allowOut: [tun0]}]
checks: {gatewayARP: false}
`), 0o600)
	log := &testenv.SyncBuffer{}
	d, err := NewDaemon(RunOptions{
		Options: Options{Config: cfg, TablesFile: filepath.Join(dir, "rt.conf")}, Host: node.Host,
		Log: newTestLogger(log),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("daemon log:\n%s", log.String())
		}
	}()
	waitFor(t, "a sync with the kill switch down", 30*time.Second, func() bool {
		s := d.Status()
		c := s.Condition(api.CondKillSwitchArmed)
		return c != nil && c.Reason == "ForwardingHeld"
	})
	s := d.Status()
	c := s.Condition(api.CondKillSwitchArmed)
	if c.Status != api.False || !has(c.Message, "forwarding is held off") || !has(c.Message, "NFT_TABLE_F_OWNER") {
		t.Errorf("KillSwitchArmed %+v; want False saying forwarding is held and why", c)
	}
	if !slices.ContainsFunc(s.Failed, func(o api.Object) bool { return has(o.Message, "sysctl net.ipv4.ip_forward: held at 0") }) {
		t.Errorf("failed %+v; want the held ip_forward", s.Failed)
	}
	if v := strings.TrimSpace(node.Exec(t, "sysctl", "-n", "net.ipv4.ip_forward")); v != "0" {
		t.Errorf("ip_forward = %s with the kill switch down; want 0", v)
	}
	if out := node.Exec(t, "ip", "rule", "show", "priority", "1000"); !has(out, "lookup 150") {
		t.Errorf("the policy rule (the other layer) is missing:\n%s", out)
	}
	lan.TryExec("ping", "-c", "5", "-i", "0.2", "-W", "1", "198.51.100.10")
	if w := atWAN(); w != 0 {
		t.Errorf("%d packets from the VLAN reached the WAN with the kill switch down", w)
	}
	if !has(log.String(), "forwarding is held off") {
		t.Error("the log does not say forwarding is held")
	}

	release() // the foreign table goes with its socket
	waitFor(t, "convergence once the foreign table is gone", 60*time.Second, func() bool {
		s := d.Status()
		c := s.Condition(api.CondKillSwitchArmed)
		return s.Ready && c != nil && c.Status == api.True
	})
	if v := strings.TrimSpace(node.Exec(t, "sysctl", "-n", "net.ipv4.ip_forward")); v != "1" {
		t.Errorf("ip_forward = %s after convergence; want 1", v)
	}
	lan.Exec(t, "ping", "-c", "3", "-i", "0.2", "-W", "2", "198.51.100.10")
	if w, tn := atWAN(), atTun(); w != 0 || tn < 3 {
		t.Errorf("after convergence: %d packets at the WAN (want 0), %d at the tunnel (want >= 3)", w, tn)
	}
}

func newTestLogger(w *testenv.SyncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
