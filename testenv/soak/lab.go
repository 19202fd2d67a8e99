package soak

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/kubetest"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// The lab's addresses: the example's LAN (192.168.2.0/24, the node .10,
// the Gateway's VIP .20 that checks.arpReachable names, a NAS .30), VLAN
// 50 (the shim .1, the pod .10, a host beyond the trunk .20), the node's
// uplink 192.0.2.1 behind a WAN router .2, and two remote clients out on
// the WAN.
const (
	nodeLAN   = "192.168.2.10"
	vip       = "192.168.2.20"
	nas       = "192.168.2.30"
	shimAddr  = "10.10.50.1"
	podAddr   = "10.10.50.10"
	vlanHost  = "10.10.50.20"
	uplink    = "192.0.2.1"
	wanRouter = "192.0.2.2"
	phoneAddr = "10.90.0.2"
	// laptopAddr is in wg0's egress pool: its internet leaves by the PIA
	// tunnel, under the pool's kill switch.
	laptopAddr = "10.90.0.130"
	// nodeNode is the Node's name.
	nodeName = "homelab-node"
	// metricsAddr is the daemon's metrics listener, in the node's namespace.
	metricsAddr = "127.0.0.1:9477"
	// queryDNS is the resolver the pod asks: any address will do, the
	// PIA device's dns section sends VLAN 50's DNS into the tunnel.
	queryDNS = "9.9.9.9"
)

// Lab is the homelab the soak runs: namespaces, the PIA stub, the API
// server, a pod, clients, foreign objects, the config and its files.
type Lab struct {
	t    testing.TB
	Dir  string // root of the lab's files, under /run (the hook must not sit where the unit's sandbox hides it)
	Logs string

	Node, LAN, WAN, Phone, Laptop *testenv.NetNS
	Stub                          *piastub.Stub
	Kube                          *kubetest.Server
	Pod                           *testenv.Pod
	us                            *wg.Userspace
	proxy                         *kubeProxy

	P                      ConfigParams
	Config, StateDir       string
	Socket, PeersDir       string
	Good                   []byte
	hookMode, delivered    string
	clockFile              string
	phoneKey, laptopKey    wgtypes.Key
	wg0Key                 wgtypes.Key
	phoneDev, laptopDev    string
	pingCmds               []*exec.Cmd
	podApp                 *podApp
	stateMounted           bool
	foreignRouteTable150   string
	foreignRouteMain       string
	foreignRuleTable200    string
	foreignRouteTable200   string
	floodA, floodB         string
	clientFiles            map[string][]byte // peers.d file -> its content
	exampleRaw             []byte
	kubeStarted, ownedKube bool
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewLab builds the lab; kube, when not nil, is an API server already
// running (shared between runs); otherwise one is started for the lab.
func NewLab(t testing.TB, logs string, kube *kubetest.Server, example []byte) *Lab {
	testenv.RequireRoot(t)
	testenv.RequireCNI(t)
	l := &Lab{t: t, Logs: logs, Kube: kube, exampleRaw: example}
	dir, err := os.MkdirTemp("/run", "nodeagent-soak-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	l.Dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	suffix := randHex(2)
	standIn := !testenv.HasModule("8021q")

	l.Node, l.LAN, l.WAN = testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	l.Phone, l.Laptop = testenv.NewNetNS(t), testenv.NewNetNS(t)
	l.Stub = piastub.Start(t, piastub.Options{DevicePrefix: "ssrv" + suffix[:2]})
	l.Stub.ConnectTo(t, l.WAN)
	l.Node.Veth(t, "enp1s0", l.LAN, "eth0")
	l.Node.Veth(t, "uplink", l.WAN, "eth0")
	l.Phone.Veth(t, "eth0", l.WAN, "tophone")
	l.Laptop.Veth(t, "eth0", l.WAN, "tolaptop")
	run(t, l.Node, "ip addr add "+nodeLAN+"/24 dev enp1s0", "ip addr add "+uplink+"/24 dev uplink", "ip route add default via "+wanRouter)
	run(t, l.WAN, "ip addr add "+wanRouter+"/24 dev eth0", "ip addr add 198.51.100.1/25 dev tophone", "ip addr add 198.51.100.129/25 dev tolaptop",
		"ip route add 10.10.50.0/24 via "+uplink, "ip route add 203.0.113.0/24 via 100.64.0.2",
		// What reaches the WAN router from the node other than as
		// WireGuard's own UDP: VLAN 50's or wg0's clients' addresses,
		// plaintext to the far side (a leak masqueraded as the node),
		// DNS. Counted before anything else sees the packet.
		"nft add table inet leak",
		"nft add chain inet leak pre { type filter hook prerouting priority -400 ; }",
		`nft add rule inet leak pre iifname eth0 ip saddr 10.10.50.0/24 counter comment "vlan"`,
		`nft add rule inet leak pre iifname eth0 ip saddr 10.90.0.0/24 counter comment "clients"`,
		`nft add rule inet leak pre iifname eth0 ip daddr 203.0.113.0/24 counter comment "plain"`,
		`nft add rule inet leak pre iifname eth0 udp dport 53 counter comment "dns"`,
		`nft add rule inet leak pre iifname eth0 tcp dport 53 counter comment "dns-tcp"`)
	piastub.Sysctl(t, l.WAN, "net/ipv4/ip_forward", "1")
	run(t, l.Phone, "ip addr add 198.51.100.10/25 dev eth0", "ip route add default via 198.51.100.1")
	run(t, l.Laptop, "ip addr add 198.51.100.140/25 dev eth0", "ip route add "+uplink+"/32 via 198.51.100.129")
	run(t, l.Stub.Inet, "ip route add default via "+piastub.Exit.String())
	piastub.ServeTCP(t, l.Stub.Inet, piastub.Far.String()+":8000")
	// The LAN: the Gateway's VIP (answers ARP for checks.arpReachable), a
	// NAS, and a host on VLAN 50 beyond the trunk.
	lanVLAN := "eth0"
	if !standIn {
		lanVLAN = "eth0.50"
		run(t, l.LAN, "ip link add link eth0 name eth0.50 type vlan id 50", "ip link set eth0.50 up")
	}
	run(t, l.LAN, "ip addr add "+nas+"/24 dev eth0", "ip addr add "+vip+"/24 dev eth0",
		"ip addr add "+vlanHost+"/24 dev "+lanVLAN, "ip route add default via "+shimAddr+" src "+vlanHost)
	piastub.ServeTCP(t, l.LAN, nas+":8000")

	// Files.
	etc := filepath.Join(dir, "etc", "nodeagent")
	l.PeersDir = filepath.Join(etc, "peers.d")
	for _, d := range []string{filepath.Join(etc, "keys"), l.PeersDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(etc, "keys"), 0o700)
	files := l.Stub.WriteFiles(dir)
	l.Stub.Creds(filepath.Join(etc, "pia.cred"))
	piaKey, _ := wgtypes.GeneratePrivateKey()
	l.wg0Key, _ = wgtypes.GeneratePrivateKey()
	writeFile(t, filepath.Join(etc, "keys", "wg-pia.key"), piaKey.String()+"\n", 0o600)
	writeFile(t, filepath.Join(etc, "keys", "wg0.key"), l.wg0Key.String()+"\n", 0o600)
	l.phoneKey, _ = wgtypes.GeneratePrivateKey()
	l.laptopKey, _ = wgtypes.GeneratePrivateKey()
	l.clientFiles = map[string][]byte{
		"phone.yaml":  fmt.Appendf(nil, "name: phone\npublicKey: %s\nallowedIPs: [%s/32]\n", l.phoneKey.PublicKey(), phoneAddr),
		"laptop.conf": fmt.Appendf(nil, "[Peer]\nPublicKey = %s\nAllowedIPs = %s/32\n", l.laptopKey.PublicKey(), laptopAddr),
	}
	for name, b := range l.clientFiles {
		writeFile(t, filepath.Join(l.PeersDir, name), string(b), 0o644)
	}
	// The port hook: the app (the pod's listener, below) takes the port it
	// is given; hook.mode makes it hang or fail, as a torrent client's
	// WebUI that is down or refuses does.
	l.hookMode, l.delivered = filepath.Join(dir, "hook.mode"), filepath.Join(dir, "delivered")
	l.clockFile = filepath.Join(dir, "clock-step")
	writeFile(t, l.clockFile, "0s\n", 0o644)
	writeFile(t, l.hookMode, "ok\n", 0o644)
	hook := filepath.Join(dir, "hook.sh")
	writeFile(t, hook, fmt.Sprintf(`#!/bin/sh
# The soak's port hook: hands the forwarded port to the pod's app.
case "$(cat %[1]s 2>/dev/null)" in
hang) while :; do sleep 1; done ;;
fail) echo "the app refused the port" >&2; exit 1 ;;
esac
echo "$NODEAGENT_PIA_PORT" > %[2]s.tmp && mv %[2]s.tmp %[2]s
`, l.hookMode, l.delivered), 0o755)

	// The state directory is a small tmpfs of its own, so that it can be
	// filled and made read-only without touching anything else.
	l.StateDir = filepath.Join(dir, "state")
	os.Mkdir(l.StateDir, 0o700)
	if err := unix.Mount("tmpfs", l.StateDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=4m,mode=0700"); err != nil {
		t.Fatalf("tmpfs for the state directory: %v", err)
	}
	l.stateMounted = true
	t.Cleanup(func() { unix.Unmount(l.StateDir, unix.MNT_DETACH) })

	// The API server, reached from the node's namespace through a proxy
	// on the node's loopback at the server's own address.
	if l.Kube == nil {
		k, err := kubetest.New(filepath.Join(dir, "kube"))
		if err != nil {
			t.Fatal(err)
		}
		l.Kube, l.ownedKube = k, true
		t.Cleanup(k.Stop)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		err = k.Start(ctx, t.Logf)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	l.Kube.CreateNode(ctx, nodeName, map[string]string{"kubernetes.io/hostname": nodeName})
	cancel()
	kubeconfig := filepath.Join(dir, "kubelet.kubeconfig")
	if err := l.Kube.WriteNodeKubeconfig(kubeconfig, nodeName); err != nil {
		t.Fatal(err)
	}
	os.Chmod(kubeconfig, 0o600)
	l.proxy = startKubeProxy(t, l.Node, strings.TrimPrefix(l.Kube.URL, "https://"))

	l.P = ConfigParams{
		Dir: dir, PIADev: "wgpia" + suffix, WG0Dev: "wg0s" + suffix, StandIn: standIn,
		Node: nodeName, Kubeconfig: kubeconfig,
		ServerList: files.ServerList, TokenURL: files.TokenURL, CAFile: files.CAFile,
		ServerListKeyFile: files.ServerListKeyFile, WebCAFile: files.WebCAFile,
		Region: "stub_ams", Hook: hook, HookEvery: "30s", HookTimeout: "10s", Endpoint: uplink + ":51820",
	}
	good, err := HomelabConfig(example, l.P)
	if err != nil {
		t.Fatal(err)
	}
	l.Good = good
	l.Config = filepath.Join(etc, "nodeagent.yaml")
	writeFile(t, l.Config, string(good), 0o644)
	l.Socket = filepath.Join(dir, "nodeagent.sock")

	// Foreign objects: another manager's route in main, in table 150 and
	// in a table of its own with its rule; a firewall's table; a link of
	// someone else's for the event floods.
	l.floodA, l.floodB = "flood0", "flood1"
	run(t, l.Node, "ip link add "+l.floodA+" type veth peer name "+l.floodB, "ip link set "+l.floodA+" up", "ip link set "+l.floodB+" up",
		"ip addr add 10.96.0.1/30 dev "+l.floodA,
		"ip route add 10.98.0.0/24 via 192.168.2.1 dev enp1s0 proto bird",
		"ip route add 10.99.0.0/24 via 192.168.2.1 dev enp1s0 table 200 proto static",
		"ip rule add priority 500 from 10.99.0.0/24 lookup 200",
		"nft add table inet foreign",
		"nft add chain inet foreign input { type filter hook input priority 10 ; policy accept ; }",
		`nft add rule inet foreign input ip saddr 10.99.0.0/24 counter drop comment "firewalld-ish"`)
	return l
}

// Start brings up what runs beside the daemon once it has converged:
// the pod (CNI ADD on VLAN 50, which nodeagent makes), the table-150
// foreign route (table 150 routes only once nodeagent made the table's
// links), the clients, and the traffic.
func (l *Lab) Start() {
	t := l.t
	l.Pod = testenv.AttachPod(t, l.Node, testenv.NAD(l.P.VLAN(), shimAddr, ""), "qbittorrent", podAddr+"/24")
	run(t, l.Node, "ip route add 10.97.0.0/24 dev enp1s0 table 150 proto static")
	l.podApp = startPodApp(t, l.Pod.NS, l.delivered)
	l.us = wg.NewUserspace(nil)
	t.Cleanup(l.us.Close)
	suffix := strings.TrimPrefix(l.P.PIADev, "wgpia")
	l.phoneDev, l.laptopDev = "wgcp"+suffix, "wgcl"+suffix
	l.client(l.Phone, l.phoneDev, phoneAddr, l.phoneKey, []string{"10.90.0.0/24", "192.168.2.0/24"})
	l.client(l.Laptop, l.laptopDev, laptopAddr, l.laptopKey, []string{"0.0.0.0/0"})
	run(t, l.Laptop, "ip route add default dev "+l.laptopDev)
	// Traffic that runs the whole time: the pod and the VLAN host to the
	// internet, the phone to the NAS, the laptop to both.
	l.ping(l.Pod.NS, "", piastub.Far.String(), "0.2")
	l.ping(l.LAN, vlanHost, piastub.Far.String(), "0.2")
	l.ping(l.Phone, "", nas, "0.5")
	l.ping(l.Laptop, "", piastub.Far.String(), "0.5")
	l.ping(l.Laptop, "", nas, "0.5")
}

// client starts a userspace WireGuard client in ns dialling wg0.
func (l *Lab) client(ns *testenv.NetNS, dev, addr string, key wgtypes.Key, allowed []string) {
	t := l.t
	if err := l.us.Start(ns.Host, dev, 1420); err != nil {
		t.Fatal(err)
	}
	var nets []net.IPNet
	for _, a := range allowed {
		_, n, _ := net.ParseCIDR(a)
		nets = append(nets, *n)
	}
	ka := 5 * time.Second
	ep := &net.UDPAddr{IP: net.ParseIP(uplink), Port: 51820}
	err := ns.Host.Do(func() error {
		c, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.ConfigureDevice(dev, wgtypes.Config{PrivateKey: &key, Peers: []wgtypes.PeerConfig{{
			PublicKey: l.wg0Key.PublicKey(), Endpoint: ep, PersistentKeepaliveInterval: &ka, AllowedIPs: nets,
		}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, ns, "ip addr add "+addr+"/32 dev "+dev, "ip link set "+dev+" up")
	if len(allowed) > 1 {
		for _, a := range allowed {
			run(t, ns, "ip route add "+a+" dev "+dev)
		}
	}
}

// ping runs ping(8) in ns for as long as the lab.
func (l *Lab) ping(ns *testenv.NetNS, src, dst, every string) {
	args := []string{"netns", "exec", ns.Name, "ping", "-q", "-n", "-i", every, "-W", "1"}
	if src != "" {
		args = append(args, "-I", src)
	}
	cmd := exec.Command("ip", append(args, dst)...)
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.pingCmds = append(l.pingCmds, cmd)
	l.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

func run(t testing.TB, ns *testenv.NetNS, lines ...string) {
	t.Helper()
	for _, line := range lines {
		ns.Exec(t, strings.Fields(line)...)
	}
}

func writeFile(t testing.TB, path, s string, mode os.FileMode) {
	if err := os.WriteFile(path, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, mode)
}

// nsRun runs a command in ns without ip-netns-exec's mount namespace and
// remount (the soak runs observers several times a second): the child
// inherits the namespace of the thread that forks it.
func nsRun(ns *testenv.NetNS, args ...string) (string, error) {
	var out []byte
	err := ns.Host.Do(func() error {
		var err error
		out, err = exec.Command(args[0], args[1:]...).CombinedOutput()
		return err
	})
	return string(out), err
}

// podApp is the pod's app: a listener on the port the hook last handed
// it (the torrent client's listen port), answering "hello".
type podApp struct {
	mu   sync.Mutex
	port int
	l    net.Listener
}

func startPodApp(t testing.TB, ns *testenv.NetNS, delivered string) *podApp {
	a := &podApp{}
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-done
		a.mu.Lock()
		if a.l != nil {
			a.l.Close()
		}
		a.mu.Unlock()
	})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			b, err := os.ReadFile(delivered)
			if err != nil {
				continue
			}
			var port int
			fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &port)
			a.mu.Lock()
			if port != a.port {
				if a.l != nil {
					a.l.Close()
					a.l = nil
				}
				a.port = port
				if port > 0 {
					if ln, err := ns.Host.Listen("tcp", fmt.Sprintf("%s:%d", podAddr, port)); err == nil {
						a.l = ln
						go serveHello(ln)
					}
				}
			}
			a.mu.Unlock()
		}
	}()
	return a
}

func serveHello(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("hello"))
		c.Close()
	}
}

// Port is the port the app listens on now.
func (a *podApp) Port() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.l == nil {
		return 0
	}
	return a.port
}

// kubeProxy forwards TCP from the node's loopback to the API server on
// the host's, so the daemon reaches it at the server's own address
// (whose certificate names 127.0.0.1). Hang makes it hold new and open
// connections without forwarding a byte (an API server that accepts and
// never answers).
type kubeProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	hang   bool
	conns  map[net.Conn]bool
}

func startKubeProxy(t testing.TB, node *testenv.NetNS, addr string) *kubeProxy {
	l, err := node.Host.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("kube proxy in the node's namespace: %v", err)
	}
	p := &kubeProxy{l: l, target: addr, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		l.Close()
		p.closeAll()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *kubeProxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *kubeProxy) serve(c net.Conn) {
	p.track(c, true)
	defer p.track(c, false)
	defer c.Close()
	p.mu.Lock()
	hang := p.hang
	p.mu.Unlock()
	if hang {
		io.Copy(io.Discard, c) // until the client or Hang(false) closes it
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	p.track(up, true)
	defer p.track(up, false)
	defer up.Close()
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
}

// Hang turns the blackhole on or off; either way the open connections
// are cut, as a restart of a load balancer in front of the server does.
func (p *kubeProxy) Hang(on bool) {
	p.mu.Lock()
	p.hang = on
	p.mu.Unlock()
	p.closeAll()
}

func (p *kubeProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// forwardedReach reports whether a connection from the internet to the
// stub's exit address at port reaches the pod's app.
func (l *Lab) forwardedReach(port int) bool {
	return port > 0 && piastub.ReachTCP(l.Stub.Inet, netip.AddrPortFrom(piastub.Exit, uint16(port)).String(), 2*time.Second)
}
