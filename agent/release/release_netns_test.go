package release

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
)

// oldUnit is the old setup's unit, as the seeds' vlan50-parent role and
// the package test's vlan50.service make VLAN 50 and its policy routing
// with ip(8); on the host kernel (no 8021q) a macvlan on the trunk stands
// in for the VLAN.
const oldUnit = `[Unit]
Description=VLAN 50 on the trunk (the old way)
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/ip link add link trunk0 name vlan50 type macvlan mode bridge
ExecStart=/sbin/ip addr add 10.10.50.1/24 dev vlan50
ExecStart=/sbin/ip link set vlan50 up
ExecStart=/sbin/ip rule add from 10.10.50.0/24 table 150 priority 1000
ExecStart=/sbin/ip route add default via 192.0.2.1 dev up0 table 150
ExecStart=/sbin/ip route add unreachable default metric 4000 table 150
[Install]
WantedBy=multi-user.target
`

// startUnit runs a unit's ExecStart lines in ns, in order, as systemd
// would start it: the first that fails fails the start, and is returned
// with its output.
func startUnit(ns *testenv.NetNS, unit string) (string, error) {
	for line := range strings.SplitSeq(unit, "\n") {
		cmd, ok := strings.CutPrefix(line, "ExecStart=")
		if !ok {
			continue
		}
		args := strings.Fields(cmd)
		args[0] = filepath.Base(args[0])
		if out, err := ns.TryExec(args...); err != nil {
			return cmd + ": " + out, err
		}
	}
	return "", nil
}

const releaseConfig = `dad: {disabled: true}
macvlans:
  - {name: vlan50, parent: trunk0, addresses: [10.10.50.1/24], adopt: true}
  - {name: vlan51, parent: trunk0, addresses: [10.10.51.1/24, "fd51::1/64"], adopt: true}
  - {name: vlan52, parent: trunk0, addresses: [10.10.52.1/24], adopt: true}
  - {name: shim0, parent: trunk0, addresses: [10.10.53.1/24]}
routing:
  tables:
    - id: 150
      routes:
        - {to: default, via: 192.0.2.1, dev: up0, adopt: true}
        - {to: default, type: unreachable, metric: 4000, adopt: true}
    - id: 160
      routes:
        - {to: 10.60.0.0/16, via: 192.0.2.1, dev: up0, adopt: true}
        - {to: 10.70.0.0/16, via: 192.0.2.1, dev: up0}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150, adopt: true}
    - {priority: 1001, from: 10.10.60.0/24, table: 160, adopt: true}
    - {priority: 1002, from: 10.10.70.0/24, table: 160}
firewall:
  masquerade: [{from: 10.10.50.0/24, out: up0}]
`

// releaseLab is a node set up the old way and taken over by nodeagent.
type releaseLab struct {
	node, lan *testenv.NetNS
	etc       string
	d         netcfg.Desired
	dir       string
	pod       *testenv.Pod
	index     map[string]int
}

// newReleaseLab makes the node the old way: vlan50 and its policy
// routing by vlan50.service (run here as systemd would), vlan51 as
// systemd-networkd's .netdev would (its file under etc), vlan52 by hand
// (no file makes it), a route and rule of table 160 by hand; a pod on
// vlan51, attached by Debian's macvlan CNI plugin when it is installed.
// Then nodeagent takes them over with a config adopting them, and makes
// what the config adds: shim0, a route and a rule, its nftables table.
func newReleaseLab(t *testing.T) *releaseLab {
	t.Helper()
	l := &releaseLab{node: testenv.NewNetNS(t), lan: testenv.NewNetNS(t), etc: t.TempDir(), dir: t.TempDir(), index: map[string]int{}}
	up := testenv.NewNetNS(t)
	l.node.Veth(t, "trunk0", l.lan, "eth0")
	l.node.Veth(t, "up0", up, "eth0")
	l.node.Exec(t, "ip", "addr", "add", "192.0.2.2/24", "dev", "up0")
	l.node.Exec(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	up.Exec(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "eth0")
	files := map[string]string{
		"systemd/system/vlan50.service":                  oldUnit,
		"systemd/network/51-vlan51.netdev":               "[NetDev]\nName=vlan51\nKind=macvlan\n[MACVLAN]\nMode=bridge\n",
		"systemd/network/10-trunk0.network":              "[Match]\nName=trunk0\n[Network]\nMACVLAN=vlan51\n",
		"systemd/system/k3s.service.d/10-nodeagent.conf": "[Unit]\nWants=nodeagent.service\nAfter=nodeagent.service\n[Service]\nExecStartPre=/usr/bin/nodeagentctl wait --for=ready --timeout=2m\n",
		"systemd/system/k3s.service.d/20-other.conf":     "[Service]\nEnvironment=K3S_DEBUG=1\n",
	}
	for f, text := range files {
		p := filepath.Join(l.etc, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wants := filepath.Join(l.etc, "systemd/system/multi-user.target.wants")
	os.MkdirAll(wants, 0o755)
	os.Symlink("/lib/systemd/system/nodeagent.service", filepath.Join(wants, "nodeagent.service"))
	if out, err := startUnit(l.node, oldUnit); err != nil {
		t.Fatalf("the old unit: %v\n%s", err, out)
	}
	for _, c := range [][]string{
		{"ip", "link", "add", "link", "trunk0", "name", "vlan51", "type", "macvlan", "mode", "bridge"},
		{"ip", "addr", "add", "10.10.51.1/24", "dev", "vlan51"},
		{"ip", "addr", "add", "fd51::1/64", "dev", "vlan51", "nodad"},
		{"ip", "link", "set", "vlan51", "up"},
		{"ip", "link", "add", "link", "trunk0", "name", "vlan52", "type", "macvlan", "mode", "bridge"},
		{"ip", "addr", "add", "10.10.52.1/24", "dev", "vlan52"},
		{"ip", "link", "set", "vlan52", "up"},
		{"ip", "route", "add", "10.60.0.0/16", "via", "192.0.2.1", "dev", "up0", "table", "160"},
		{"ip", "rule", "add", "from", "10.10.60.0/24", "table", "160", "priority", "1001"},
	} {
		l.node.Exec(t, c...)
	}
	if _, err := os.Stat(filepath.Join(testenv.CNIDir, "macvlan")); err == nil {
		l.pod = testenv.AttachPod(t, l.node, testenv.NAD("vlan51", "10.10.51.1", ""), "qbittorrent", "10.10.51.10/24")
	} else {
		t.Logf("no pod: Debian's CNI plugins are not installed (%v)", err)
	}
	c, err := config.ParseWith("nodeagent.yaml", []byte(releaseConfig), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	if l.d, err = netcfg.FromConfig(c, filepath.Join(l.dir, "rt_tables.conf")); err != nil {
		t.Fatal(err)
	}
	cv := &netcfg.Converger{Host: l.node.Host}
	if _, err := cv.Sync(context.Background(), l.d); err != nil {
		t.Fatalf("the take-over: %v", err)
	}
	for _, n := range []string{"vlan50", "vlan51", "vlan52"} {
		if got := alias(t, l.node, n); got != host.LinkAlias {
			t.Fatalf("%s after the take-over: alias %q, not nodeagent's", n, got)
		}
		l.index[n] = ifindex(t, l.node, n)
	}
	rules := l.node.Exec(t, "ip", "rule", "show")
	if !ownProto.MatchString(grepLine(rules, "1001:")) || !ownProto.MatchString(grepLine(rules, "1000:")) {
		t.Fatalf("the rules after the take-over are not nodeagent's:\n%s", rules)
	}
	return l
}

var ownProto = regexp.MustCompile(`proto (nodeagent|147)\b`)

func grepLine(text, prefix string) string {
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), prefix) {
			return line
		}
	}
	return ""
}

func alias(t *testing.T, ns *testenv.NetNS, name string) string {
	t.Helper()
	l, err := ns.NL.LinkByName(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return l.Attrs().Alias
}

func ifindex(t *testing.T, ns *testenv.NetNS, name string) int {
	t.Helper()
	l, err := ns.NL.LinkByName(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return l.Attrs().Index
}

func (l *releaseLab) config(dryRun, inPlace bool) Config {
	return Config{Desired: l.d, Etc: l.etc, TablesFile: filepath.Join(l.dir, "rt_tables.conf"), StateDir: l.dir,
		PortDir: filepath.Join(l.dir, "pia"), Options: Options{InPlace: inPlace}, DryRun: dryRun, Host: l.node.Host}
}

// operState is ip's operational state of a link, which moves by itself
// (UNKNOWN to UP, as a macvlan's carrier settles).
var operState = regexp.MustCompile(`state [A-Z]+ `)

// state is the node's links, addresses, rules, routes and nftables tables
// as ip(8) and nft print them, for comparing before and after.
func (l *releaseLab) state(t *testing.T) string {
	var b strings.Builder
	for _, c := range [][]string{{"ip", "-d", "link", "show"}, {"ip", "addr", "show"}, {"ip", "rule", "show"},
		{"ip", "route", "show", "table", "all"}, {"nft", "list", "tables"}} {
		b.WriteString(l.node.Exec(t, c...))
	}
	return operState.ReplaceAllString(b.String(), "")
}

// TestReleaseHandsBackAndRemoves is release on the host kernel: a dry run
// changes nothing; then what the config adopts and its old owner takes as
// it is (vlan51, networkd's; vlan52, no one's; table 160's route and rule
// 1001) stays, unmarked, the same links with the same addresses;
// what vlan50.service makes (vlan50, rule 1000, table 150's routes) is
// deleted, and the unit starts again after it, every `ip ... add` of it
// succeeding; what nodeagent made (shim0, rule 1002, table 160's second
// route, its nftables table) is gone; the pod on vlan51 is untouched. The
// output names each object and the steps. A second release finds nothing.
func TestReleaseHandsBackAndRemoves(t *testing.T) {
	l := newReleaseLab(t)
	var podBefore string
	if l.pod != nil {
		podBefore = operState.ReplaceAllString(l.pod.State(t), "")
	}
	before := l.state(t)
	var out bytes.Buffer
	if err := Run(context.Background(), &out, l.config(true, false)); err != nil {
		t.Fatalf("dry run: %v\n%s", err, out.String())
	}
	t.Logf("release --dry-run:\n%s", out.String())
	if !strings.Contains(out.String(), "dry run: nothing changed") {
		t.Errorf("the dry run does not say it changed nothing:\n%s", out.String())
	}
	if after := l.state(t); after != before {
		t.Fatalf("the dry run changed the node:\n--- before\n%s\n--- after\n%s", before, after)
	}
	dry := out.String()

	out.Reset()
	if err := Run(context.Background(), &out, l.config(false, false)); err != nil {
		t.Fatalf("release: %v\n%s", err, out.String())
	}
	t.Logf("release:\n%s", out.String())
	if strings.TrimSuffix(dry, "dry run: nothing changed\n"+strings.SplitN(dry, "dry run: nothing changed\n", 2)[1]) !=
		strings.SplitN(out.String(), "note: ", 2)[0] {
		t.Errorf("release did other than its dry run said:\n--- dry run\n%s\n--- release\n%s", dry, out.String())
	}
	for _, want := range []string{
		"- link vlan50 (macvlan on trunk0): vlan50.service makes it again (its ip link add fails while it exists)",
		"~ link vlan51 (macvlan on trunk0) hand back: unmark it and its addresses 10.10.51.1/24, fd51::1/64; it stays as it is: systemd-networkd takes it as it is (/etc/systemd/network/51-vlan51.netdev)",
		"~ link vlan52 (macvlan on trunk0) hand back: unmark it and its addresses 10.10.52.1/24; it stays as it is: nothing under /etc makes it now",
		"- link shim0 (macvlan on trunk0)",
		"- rule 1000: from 10.10.50.0/24 lookup 150: vlan50.service adds it again",
		"~ rule 1001: from 10.10.60.0/24 lookup 160 hand back",
		"- rule 1002: from 10.10.70.0/24 lookup 160\n",
		"~ route 10.60.0.0/16 via 192.0.2.1 dev up0 table 160 hand back",
		"- route 10.70.0.0/16 via 192.0.2.1 dev up0 table 160\n",
		"note: vlan52 (macvlan) is handed back as it is, and nothing under /etc makes it",
		"  1. systemctl disable nodeagent",
		"  2. rm /etc/systemd/system/k3s.service.d/10-nodeagent.conf && systemctl daemon-reload   # it names nodeagent",
		"  3. systemctl stop vlan50.service; systemctl enable --now vlan50.service   # makes vlan50 again",
		"  4. networkctl reload   # systemd-networkd finds vlan51 there and uses it as it is",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("release's output lacks %q", want)
		}
	}

	// Handed back: the same links, up, no mark; their addresses there,
	// without nodeagent's IFA_PROTO.
	for _, n := range []string{"vlan51", "vlan52"} {
		if got := ifindex(t, l.node, n); got != l.index[n] {
			t.Errorf("%s is another link now (ifindex %d, was %d)", n, got, l.index[n])
		}
		if a := alias(t, l.node, n); a != "" {
			t.Errorf("%s keeps the alias %q", n, a)
		}
		if out := l.node.Exec(t, "ip", "link", "show", n); !strings.Contains(out, ",UP") {
			t.Errorf("%s is not up: %s", n, out)
		}
	}
	addrs, err := l.node.Host.AddrList()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, a := range addrs {
		found[a.Prefix.String()] = true
		if a.Owned() {
			t.Errorf("address %s keeps nodeagent's mark", a.Prefix)
		}
	}
	for _, p := range []string{"10.10.51.1/24", "fd51::1/64", "10.10.52.1/24"} {
		if !found[p] {
			t.Errorf("address %s is gone", p)
		}
	}
	rules := l.node.Exec(t, "ip", "rule", "show")
	if r := grepLine(rules, "1001:"); r == "" || ownProto.MatchString(r) || strings.Count(rules, "1001:") != 1 {
		t.Errorf("rule 1001 is not handed back (once, unmarked):\n%s", rules)
	}
	// ip prints no protocol for boot's, what `ip route add` gives.
	t160 := l.node.Exec(t, "ip", "route", "show", "table", "160")
	if strings.TrimSpace(t160) != "10.60.0.0/16 via 192.0.2.1 dev up0" {
		t.Errorf("table 160 is not its adopted route alone, handed back with protocol boot:\n%s", t160)
	}
	// Removed: what nodeagent made, and what the unit makes.
	left := l.state(t)
	for _, gone := range []string{"vlan50", "shim0", "1000:", "1002:", "10.70.0.0/16", "table inet nodeagent", "proto nodeagent", "proto 147"} {
		if strings.Contains(left, gone) {
			t.Errorf("release left %q", gone)
		}
	}
	if l.pod != nil {
		if got := operState.ReplaceAllString(l.pod.State(t), ""); got != podBefore {
			t.Errorf("the pod changed:\n--- before\n%s\n--- after\n%s", podBefore, got)
		}
	}
	// The old unit starts again: none of its ip ... add meets what it
	// adds, and the VLAN and its policy routing are back.
	if out, err := startUnit(l.node, oldUnit); err != nil {
		t.Fatalf("vlan50.service after release: %v\n%s", err, out)
	}
	if r := l.node.Exec(t, "ip", "route", "get", "198.51.100.1", "from", "10.10.50.9", "iif", "vlan50"); !strings.Contains(r, "via 192.0.2.1 dev up0 table 150") {
		t.Errorf("the old setup's policy routing after its unit started again: %s", r)
	}

	// A second release, a process of its own as on a node (a handle that
	// remembers no link of nodeagent's: vlan50 is the unit's now).
	h, err := host.Open(l.node.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	second := l.config(false, false)
	second.Host = h
	out.Reset()
	if err := Run(context.Background(), &out, second); err != nil {
		t.Fatalf("a second release: %v\n%s", err, out.String())
	}
	if !strings.HasPrefix(out.String(), "nothing of nodeagent's on this node\n") {
		t.Errorf("a second release:\n%s", out.String())
	}
}

// TestReleaseInPlace: with --in-place nothing adopted is deleted, not even
// what vlan50.service makes itself: vlan50, rule 1000 and table 150's
// routes stay, unmarked, the same objects, and the unit is enabled for the
// next boot rather than started.
func TestReleaseInPlace(t *testing.T) {
	l := newReleaseLab(t)
	var out bytes.Buffer
	if err := Run(context.Background(), &out, l.config(false, true)); err != nil {
		t.Fatalf("release --in-place: %v\n%s", err, out.String())
	}
	t.Logf("release --in-place:\n%s", out.String())
	for _, n := range []string{"vlan50", "vlan51", "vlan52"} {
		if got := ifindex(t, l.node, n); got != l.index[n] || alias(t, l.node, n) != "" {
			t.Errorf("%s: ifindex %d (was %d), alias %q", n, got, l.index[n], alias(t, l.node, n))
		}
	}
	rules := l.node.Exec(t, "ip", "rule", "show")
	if r := grepLine(rules, "1000:"); r == "" || ownProto.MatchString(r) || strings.Count(rules, "1000:") != 1 {
		t.Errorf("rule 1000 is not handed back in place:\n%s", rules)
	}
	// ip prints no protocol for boot's, what `ip route add` gives.
	t150 := l.node.Exec(t, "ip", "route", "show", "table", "150")
	if t150 != "default via 192.0.2.1 dev up0 \nunreachable default metric 4000 \n" {
		t.Errorf("table 150 is not the unit's two routes, handed back in place with protocol boot:\n%q", t150)
	}
	if left := l.state(t); ownProto.MatchString(left) || strings.Contains(left, "shim0") {
		t.Errorf("release --in-place left something of nodeagent's:\n%s", left)
	}
	if !strings.Contains(out.String(), "systemctl enable vlan50.service   # at the next boot") || strings.Contains(out.String(), "enable --now") {
		t.Errorf("the steps do not enable vlan50.service for the next boot only:\n%s", out.String())
	}
	// The node is as the old setup leaves it: starting the unit now fails
	// on the first object it adds, as release said.
	if _, err := startUnit(l.node, oldUnit); err == nil {
		t.Error("vlan50.service started although its objects were left in place")
	}
}
