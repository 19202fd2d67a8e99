package netcfg

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// homelabLab is a node with the homelab's shape of config: the VLAN-50
// shim and a SAN shim (macvlans: the host kernel has no 8021q), the PIA
// gateway's kill-switch table, rules and nftables (masquerade, kill switch,
// MSS clamp), forwarding sysctls, and wg0 with a register of 10 peers
// (userspace on this kernel, the module in the VM).
func homelabLab(tb testing.TB) (*testenv.NetNS, Desired) {
	tb.Helper()
	testenv.RequireRoot(tb)
	node, peer := testenv.NewNetNS(tb), testenv.NewNetNS(tb)
	node.Veth(tb, "enp1s0", peer, "eth0")
	node.Veth(tb, "tun0", testenv.NewNetNS(tb), "eth0")
	dir := tb.TempDir()
	k, _ := wgtypes.GeneratePrivateKey()
	key := filepath.Join(dir, "wg0.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
	peers := filepath.Join(dir, "peers.d")
	os.Mkdir(peers, 0o755)
	for i := 0; i < 10; i++ {
		p, _ := wgtypes.GeneratePrivateKey()
		os.WriteFile(filepath.Join(peers, fmt.Sprintf("client%d.yaml", i)), []byte(fmt.Sprintf("publicKey: %s\nallowedIPs: [10.90.0.%d/32]\n", p.PublicKey(), 10+i)), 0o644)
	}
	name := "wgb" + strings.TrimPrefix(node.Name, "na-test-")[:6]
	yaml := fmt.Sprintf(`dad: {disabled: true}
sysctls:
  net.ipv4.ip_forward: "1"
macvlans:
  - {name: vlan50-shim, parent: enp1s0, addresses: [10.10.50.3/24]}
  - {name: san-shim, parent: enp1s0, addresses: [10.10.49.3/24]}
wireguard:
  - {name: %s, privateKeyFile: %s, listenPort: 51820, addresses: [10.90.0.1/24], mtu: 1420, peersDir: %s}
routing:
  tables:
    - id: 150
      name: vlan50-egress
      killSwitch: true
      routes: [{to: default, dev: tun0}, {to: 10.10.50.0/24, dev: vlan50-shim}]
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
firewall:
  masquerade: [{from: 10.10.50.0/24, out: tun0}, {from: 10.90.0.0/24, out: enp1s0}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [tun0]}]
  mssClamp: [tun0]
`, name, key, peers)
	c, err := config.Parse(filepath.Join(dir, "nodeagent.yaml"), []byte(yaml))
	if err != nil {
		tb.Fatal(err)
	}
	d, err := FromConfig(c, filepath.Join(dir, "rt_tables.conf"))
	if err != nil {
		tb.Fatal(err)
	}
	return node, d
}

// dumpKinds are the kinds of kernel dump a sync makes.
var dumpKinds = []string{host.DumpLinks, host.DumpAddresses, host.DumpRoutes, host.DumpRules, host.DumpNftables, host.DumpWireGuard}

// dumpsSince is how many dumps of each kind h made since before.
func dumpsSince(h *host.Host, before map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, n := range h.Dumps() {
		if d := n - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func dumpsString(m map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// TestDumpsPerSync counts the kernel dumps of a sync through the host
// handle: a sync with changes dumps each kind (links, addresses, routes,
// rules, nftables, WireGuard devices) at most twice, once before and once
// after its writes; a no-op sync at most once.
func TestDumpsPerSync(t *testing.T) {
	node, d := homelabLab(t)
	us := wg.NewUserspace(nil)
	defer us.Close()
	cv := &Converger{Host: node.Host, Userspace: us}
	defer cv.Close()
	ctx := context.Background()
	sync := func() (Plans, map[string]int64) {
		before := node.Host.Dumps()
		p, err := cv.Plan(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if !p.Empty() {
			if err := cv.Apply(ctx, p).Report.Err(); err != nil {
				t.Fatal(err)
			}
		}
		return p, dumpsSince(node.Host, before)
	}
	cold, dumps := sync()
	t.Logf("sync with %d changes: %s", len(cold.Report()), dumpsString(dumps))
	if cold.Empty() {
		t.Fatal("the first sync changed nothing")
	}
	for _, k := range dumpKinds {
		if dumps[k] > 2 {
			t.Errorf("a sync with changes dumped %s %d times; want at most 2", k, dumps[k])
		}
	}
	for i := range 3 {
		p, dumps := sync()
		if !p.Empty() {
			t.Fatalf("no-op sync %d planned:\n%s", i, p)
		}
		t.Logf("no-op sync: %s", dumpsString(dumps))
		for _, k := range dumpKinds {
			if dumps[k] > 1 {
				t.Errorf("a no-op sync dumped %s %d times; want at most 1", k, dumps[k])
			}
		}
	}
}

// BenchmarkNoopSyncHomelab is the daemon's steady state with the homelab's
// shape of config (DESIGN.md §8: no-op sync <= 1 ms, zero writes, each
// kernel dump once). Each iteration is what a kernel event or resync costs
// the daemon: one plan of every subsystem from one snapshot, with the
// desired state in memory (an empty plan is not applied).
func BenchmarkNoopSyncHomelab(b *testing.B) {
	node, d := homelabLab(b)
	us := wg.NewUserspace(nil)
	defer us.Close()
	cv := &Converger{Host: node.Host, Userspace: us}
	defer cv.Close()
	ctx := context.Background()
	if _, err := cv.Sync(ctx, d); err != nil {
		b.Fatal(err)
	}
	writes, cfgWrites, dumps := node.Host.Writes(), cv.WG().ConfigWrites(), node.Host.Dumps()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		p, err := cv.Plan(ctx, d)
		if err != nil || !p.Empty() {
			b.Fatalf("no-op plan: %v\n%s", err, p)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.StopTimer()
	w := node.Host.Writes() - writes + cv.WG().ConfigWrites() - cfgWrites
	per1 := map[string]int64{}
	for k, n := range dumpsSince(node.Host, dumps) {
		per1[k] = n / int64(b.N)
	}
	b.ReportMetric(float64(per.Microseconds())/1000, "noop-ms")
	b.ReportMetric(float64(w), "noop-writes")
	fmt.Printf("\nhomelab-shaped config, no-op sync (one snapshot, every subsystem planned): %.2f ms (target <= 1 ms), %d writes (target 0), dumps per sync: %s\n\n",
		float64(per.Microseconds())/1000, w, dumpsString(per1))
}

// BenchmarkNoopSync1000Macvlans is the daemon's no-op sync of 1000 owned
// macvlans with an address each (the host kernel's stand-in for 1000 VLANs):
// a plan of every subsystem from one snapshot. The link and address dumps
// are shared by every subsystem that needs them; before the one snapshot,
// the link and WireGuard subsystems each dumped every link.
func BenchmarkNoopSync1000Macvlans(b *testing.B) {
	testenv.RequireRoot(b)
	const n = 1000
	node, peer := testenv.NewNetNS(b), testenv.NewNetNS(b)
	node.Veth(b, "trunk0", peer, "wire0")
	var d Desired
	for j := 1; j <= n; j++ {
		d.Link.Links = append(d.Link.Links, link.Link{
			Name: fmt.Sprintf("m%d", j), Kind: link.Macvlan, Parent: "trunk0", Mode: "bridge", Up: true,
			Addrs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j >> 8), byte(j), 1}), 24)},
		})
	}
	cv := &Converger{Host: node.Host}
	defer cv.Close()
	ctx := context.Background()
	if _, err := cv.Sync(ctx, d); err != nil {
		b.Fatal(err)
	}
	writes, dumps := node.Host.Writes(), node.Host.Dumps()
	var best time.Duration
	const rounds = 50
	for range rounds {
		start := time.Now()
		p, err := cv.Plan(ctx, d)
		if err != nil || !p.Empty() {
			b.Fatalf("no-op plan: %v\n%s", err, p)
		}
		if took := time.Since(start); best == 0 || took < best {
			best = took
		}
	}
	per1 := map[string]int64{}
	for k, c := range dumpsSince(node.Host, dumps) {
		per1[k] = c / rounds
	}
	b.ReportMetric(float64(best.Microseconds())/1000, "noop-ms")
	fmt.Printf("\n%d macvlans + %d addresses, no-op sync: %.1f ms best of %d (target <= 12 ms), %d writes, dumps per sync: %s\n\n",
		n, n, float64(best.Microseconds())/1000, rounds, node.Host.Writes()-writes, dumpsString(per1))
}

// BenchmarkNoopSync1000x1000x5000 is the daemon's no-op sync at scale, in
// the VM (8021q, WireGuard): one config with 1000 VLANs with an address
// each, 1000 rules, 1000 routes, the nftables table with 1000 masquerade
// and 1000 kill-switch sources, and a kernel WireGuard device with 5000
// register peers, planned from one snapshot with the desired state in
// memory (as on a kernel event), beside the same run's raw kernel dump
// floor: `ip -d addr show; ip rule; ip route show table all; nft list
// table inet nodeagent; wg show all dump`, one process each, timed
// together (the cost of starting the shell in the namespace subtracted).
// Best of 5 each. Run with -benchtime=1x.
func BenchmarkNoopSync1000x1000x5000(b *testing.B) {
	testenv.RequireModule(b, "8021q")
	testenv.RequireModule(b, "dummy")
	testenv.RequireModule(b, "wireguard")
	const n, peers, runs = 1000, 5000, 5
	for i := 0; i < b.N; i++ {
		ns := testenv.NewNetNS(b)
		ns.Exec(b, "ip", "link", "add", "trunk0", "type", "dummy")
		ns.Exec(b, "ip", "link", "set", "trunk0", "up")
		dir := b.TempDir()
		key, _ := wgtypes.GeneratePrivateKey()
		keyFile := filepath.Join(dir, "wg0.key")
		os.WriteFile(keyFile, []byte(key.String()+"\n"), 0o600)
		reg := filepath.Join(dir, "peers.d")
		testenv.WriteRegister(b, reg, peers)
		var y strings.Builder
		y.WriteString("dad: {disabled: true}\nvlans:\n")
		for j := 1; j <= n; j++ {
			fmt.Fprintf(&y, "  - {name: trunk0.%d, parent: trunk0, id: %d, addresses: [10.%d.%d.1/24]}\n", j, j, j>>8, j&255)
		}
		y.WriteString("routing:\n  tables:\n    - id: 150\n      killSwitch: true\n      routes:\n")
		for j := 1; j <= n; j++ {
			fmt.Fprintf(&y, "        - {to: 10.%d.%d.0/24, dev: trunk0.%d}\n", 100+j>>8, j&255, j)
		}
		y.WriteString("  rules:\n")
		for j := 1; j <= n; j++ {
			fmt.Fprintf(&y, "    - {priority: %d, from: 10.%d.%d.0/24, table: 150}\n", 2000+j, j>>8, j&255)
		}
		y.WriteString("firewall:\n  masquerade:\n")
		for j := 1; j <= n; j++ {
			fmt.Fprintf(&y, "    - {from: 172.%d.%d.0/24, out: trunk0}\n", 16+j>>8, j&255)
		}
		y.WriteString("  killSwitch:\n")
		for j := 1; j <= n; j++ {
			fmt.Fprintf(&y, "    - {from: 10.%d.%d.0/24, allowOut: [trunk0]}\n", j>>8, j&255)
		}
		fmt.Fprintf(&y, "wireguard:\n  - {name: wg0, implementation: kernel, privateKeyFile: %s, listenPort: 51820, peersDir: %s}\n", keyFile, reg)
		c, err := config.Parse(filepath.Join(dir, "nodeagent.yaml"), []byte(y.String()))
		if err != nil {
			b.Fatal(err)
		}
		d, err := FromConfig(c, filepath.Join(dir, "rt_tables.conf"))
		if err != nil {
			b.Fatal(err)
		}
		cv := &Converger{Host: ns.Host}
		ctx := context.Background()
		start := time.Now()
		if _, err := cv.Sync(ctx, d); err != nil {
			b.Fatal(err)
		}
		cold := time.Since(start)
		writes, cfgWrites, dumps := ns.Host.Writes(), cv.WG().ConfigWrites(), ns.Host.Dumps()
		var noop time.Duration
		for r := 0; r < runs; r++ {
			s := time.Now()
			p, err := cv.Plan(ctx, d)
			if err != nil || !p.Empty() {
				b.Fatalf("no-op plan: %v\n%s", err, p)
			}
			if e := time.Since(s); noop == 0 || e < noop {
				noop = e
			}
		}
		w := ns.Host.Writes() - writes + cv.WG().ConfigWrites() - cfgWrites
		per1 := map[string]int64{}
		for k, c := range dumpsSince(ns.Host, dumps) {
			per1[k] = c / runs
		}
		cv.Close()

		sh := func(script string) time.Duration {
			s := time.Now()
			if out, err := exec.Command("ip", "netns", "exec", ns.Name, "sh", "-c", script).CombinedOutput(); err != nil {
				b.Fatalf("%s: %v\n%s", script, err, out)
			}
			return time.Since(s)
		}
		// Full paths: the VM's sh is busybox's, which would run its own
		// ip applet.
		tool := func(name string) string {
			p, err := exec.LookPath(name)
			if err != nil {
				b.Fatal(err)
			}
			return p
		}
		ip, nftBin, wgBin := tool("ip"), tool("nft"), tool("wg")
		floorScript := fmt.Sprintf("%[1]s -d addr show >/dev/null && %[1]s rule >/dev/null && %[1]s route show table all >/dev/null && %[2]s list table inet nodeagent >/dev/null && %[3]s show all dump >/dev/null", ip, nftBin, wgBin)
		var floor, execCost time.Duration
		for r := 0; r < runs; r++ {
			if e := sh("true"); execCost == 0 || e < execCost {
				execCost = e
			}
			if e := sh(floorScript); floor == 0 || e < floor {
				floor = e
			}
		}
		floor -= execCost
		ms := func(d time.Duration) float64 { return d.Seconds() * 1000 }
		b.ReportMetric(ms(noop), "noop-ms")
		b.ReportMetric(ms(floor), "dump-floor-ms")
		b.ReportMetric(noop.Seconds()/floor.Seconds(), "x-dump-floor")
		b.ReportMetric(float64(w), "noop-writes")
		fmt.Printf("\n%d VLANs + %d rules + %d routes + nftables (%d+%d sources) + %d WireGuard peers (cold converge %.1f s):\n"+
			"  nodeagent no-op sync (one snapshot, every subsystem planned)  %8.1f ms   %.2fx the dump floor (target <= 1.5x), %d writes (target 0)\n"+
			"  raw dump floor (ip -d addr; ip rule; ip route show table all;\n"+
			"    nft list table; wg show all dump; one process each)        %8.1f ms   (shell start %.1f ms subtracted)\n"+
			"  dumps per no-op sync: %s\n\n",
			n, n, n, n, n, peers, cold.Seconds(), ms(noop), noop.Seconds()/floor.Seconds(), w, ms(floor), ms(execCost), dumpsString(per1))
	}
}
