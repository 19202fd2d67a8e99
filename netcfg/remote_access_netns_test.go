package netcfg

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestRemoteAccessEndToEnd is the seeds' remote-access VPN, every part
// converged by nodeagent: a client namespace dials wg0 on node (10.90.0.1,
// udp/51820) over node's uplink; node forwards to the lan and masquerades
// the client to its own lan address. The lan host sees node's address,
// never the client's. The client end is nodeagent too (it is just another
// WireGuard config). The implementation is auto: userspace on a kernel
// without WireGuard, the kernel module in the VM tier.
func TestRemoteAccessEndToEnd(t *testing.T) {
	client, node, lan := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "uplink", client, "eth0")
	node.Veth(t, "enp1s0", lan, "eth0")
	run(t, client, "ip addr add 203.0.113.50/24 dev eth0")
	run(t, node, "ip addr add 203.0.113.1/24 dev uplink", "ip addr add 192.168.2.10/24 dev enp1s0")
	run(t, lan, "ip addr add 192.168.2.20/24 dev eth0")
	atLan := countV4(t, lan, "fromnode", "192.168.2.10")
	fromClient := countV4(t, lan, "fromclient", "10.90.0.0/24")

	dir := t.TempDir()
	key := func(name string) (string, wgtypes.Key) {
		k, _ := wgtypes.GeneratePrivateKey()
		p := filepath.Join(dir, name+".key")
		os.WriteFile(p, []byte(k.String()+"\n"), 0o600)
		return p, k.PublicKey()
	}
	nodeKey, nodePub := key("node")
	clientKey, clientPub := key("client")
	peers := filepath.Join(dir, "peers.d")
	os.Mkdir(peers, 0o755)
	os.WriteFile(filepath.Join(peers, "laptop.conf"), []byte(fmt.Sprintf("# alice's laptop\n[Peer]\nPublicKey = %s\nAllowedIPs = 10.90.0.2/32\n", clientPub)), 0o644)
	suffix := strings.TrimPrefix(node.Name, "na-test-")[:4]
	wg0, wgc := "wg0"+suffix, "wgc"+suffix // userspace sockets share one directory

	nodeYAML := fmt.Sprintf(`sysctls:
  net.ipv4.ip_forward: "1"
wireguard:
  - name: %s
    privateKeyFile: %s
    listenPort: 51820
    addresses: [10.90.0.1/24]
    mtu: 1420
    peersDir: %s
firewall:
  masquerade: [{from: 10.90.0.0/24, out: enp1s0}]
`, wg0, nodeKey, peers)
	clientYAML := fmt.Sprintf(`wireguard:
  - name: %s
    privateKeyFile: %s
    addresses: [10.90.0.2/32]
    peers:
      - publicKey: %s
        endpoint: 203.0.113.1:51820
        allowedIPs: [10.90.0.0/24, 192.168.2.0/24]
        persistentKeepalive: 25
routing:
  tables:
    - id: 100
      routes: [{to: 10.90.0.0/24, dev: %s}, {to: 192.168.2.0/24, dev: %s}]
  rules:
    - {priority: 100, to: 10.90.0.0/24, table: 100}
    - {priority: 101, to: 192.168.2.0/24, table: 100}
`, wgc, clientKey, nodePub, wgc, wgc)
	us := wg.NewUserspace(nil)
	t.Cleanup(us.Close)
	sync := func(ns *testenv.NetNS, yaml string) Plans {
		t.Helper()
		c, err := config.Parse(filepath.Join(dir, ns.Name+".yaml"), []byte(yaml))
		if err != nil {
			t.Fatalf("config:\n%v", err)
		}
		d, err := FromConfig(c, tablesFile(t, ns))
		if err != nil {
			t.Fatal(err)
		}
		cv := &Converger{Host: ns.Host, Userspace: us}
		defer cv.Close()
		p, err := cv.Sync(context.Background(), d)
		if _, skipped, failed := Split(err); len(failed)+len(skipped) > 0 {
			t.Fatalf("sync:\n%s\nerror: %v", p, err)
		}
		return p
	}
	sync(node, nodeYAML)
	sync(client, clientYAML)

	client.Exec(t, "ping", "-c", "3", "-i", "0.2", "-W", "3", "192.168.2.20")
	if got, leaked := atLan(), fromClient(); got < 3 || leaked != 0 {
		t.Errorf("lan saw %d packets from node's 192.168.2.10 (want >= 3) and %d from the tunnel range (want 0)", got, leaked)
	}
	show := node.Exec(t, "wg", "show", wg0)
	if !strings.Contains(show, "peer: "+clientPub.String()) || !strings.Contains(show, "endpoint: 203.0.113.50:") || !strings.Contains(show, "latest handshake") {
		t.Errorf("wg show %s:\n%s", wg0, show)
	}
	if p := sync(node, nodeYAML); !p.Empty() {
		t.Errorf("node not converged after apply:\n%s", p)
	}
}

// countV4 counts packets at ns's prerouting from an IPv4 prefix, in a
// table of its own.
func countV4(t *testing.T, ns *testenv.NetNS, table, v4 string) func() int {
	t.Helper()
	run(t, ns, "nft add table ip "+table,
		"nft add chain ip "+table+" pre { type filter hook prerouting priority -400 ; }",
		"nft add rule ip "+table+" pre ip saddr "+v4+" counter")
	return func() int {
		out := ns.Exec(t, "nft", "list", "chain", "ip", table, "pre")
		var n int
		if i := strings.Index(out, "packets "); i >= 0 {
			fmt.Sscanf(out[i:], "packets %d", &n)
		}
		return n
	}
}
