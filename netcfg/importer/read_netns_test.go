package importer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestReadBuildNetNS sets a node up the old way with ip(8) in a fresh
// namespace (a veth for the trunk, a macvlan shim with addresses, IPv4 and
// IPv6 rules into a named table with a default route and an unreachable
// fallback, sysctls) and imports it: Read sees what ip made, and Build's
// config is the expected one and validates with its files installed.
// VLANs and WireGuard need 8021q and wireguard, which this kernel lacks:
// the golden cases and the VM tier cover them.
func TestReadBuildNetNS(t *testing.T) {
	node := testenv.NewNetNS(t)
	far := testenv.NewNetNS(t)
	node.Veth(t, "trunk0", far, "up0")
	for _, c := range [][]string{
		{"ip", "link", "add", "shim50", "link", "trunk0", "type", "macvlan", "mode", "bridge"},
		{"ip", "link", "set", "shim50", "mtu", "1400", "up"},
		{"ip", "addr", "add", "10.10.50.2/24", "dev", "shim50"},
		{"ip", "addr", "add", "fd00:50::2/64", "dev", "shim50", "nodad"},
		{"ip", "addr", "add", "10.10.50.9/24", "dev", "shim50", "valid_lft", "3600", "preferred_lft", "3600"},
		{"ip", "rule", "add", "from", "10.10.50.0/24", "lookup", "150", "pref", "100"},
		{"ip", "-6", "rule", "add", "from", "fd00:50::/64", "lookup", "150", "pref", "101"},
		{"ip", "rule", "add", "iif", "shim50", "lookup", "151", "pref", "200"},
		{"ip", "route", "add", "default", "via", "10.10.50.254", "dev", "shim50", "table", "150"},
		{"ip", "route", "add", "unreachable", "default", "metric", "4000", "table", "150"},
		{"ip", "-6", "route", "add", "default", "via", "fd00:50::fe", "dev", "shim50", "table", "150"},
		{"ip", "route", "add", "10.10.51.0/24", "dev", "shim50", "src", "10.10.50.2", "table", "150"},
		{"ip", "route", "add", "unreachable", "default", "metric", "4294967295", "table", "151"},
		{"ip", "-6", "route", "add", "unreachable", "default", "metric", "4294967295", "table", "151"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"sysctl", "-qw", "net.ipv4.conf.shim50.rp_filter=2"},
	} {
		node.Exec(t, c...)
	}

	etc := t.TempDir()
	writeFile(t, filepath.Join(etc, "iproute2", "rt_tables"), "255\tlocal\n254\tmain\n253\tdefault\n150\tvpn\n")
	writeFile(t, filepath.Join(etc, "systemd", "system", "shim50.service"),
		"[Service]\nType=oneshot\nExecStart=/usr/sbin/ip link add shim50 link trunk0 type macvlan mode bridge\n")

	s, err := Read(context.Background(), node.Host, ReadOptions{Etc: etc})
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	r, err := Build(s, Options{Out: "/tmp/out"})
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, r.Config)
	}
	want := `# nodeagent.yaml, imported by ` + "`nodeagent import`" + ` from what this node has.
# Every object below is taken over in place (adopt: true): nodeagent marks it
# as its own without deleting it first. Read the comments, then follow the
# steps ` + "`nodeagent import`" + ` printed.
sysctls:
  net.ipv4.conf.shim50.rp_filter: "2"
  net.ipv4.ip_forward: "1"
macvlans:
  - name: shim50
    # parent trunk0 is a veth, which nodeagent does not manage: whatever makes it must keep making it before nodeagent starts
    parent: trunk0
    mode: bridge
    mtu: 1400
    # address 10.10.50.9/24 not imported: dynamic (DHCP, SLAAC or with a lifetime); whatever gives it keeps it
    addresses: [10.10.50.2/24, fd00:50::2/64]
    adopt: true
routing:
  tables:
    - id: 150
      # /etc/iproute2/rt_tables names it vpn and stays as it is; a name: here would have nodeagent write it again in /etc/iproute2/rt_tables.d/nodeagent.conf
      routes:
        - {to: default, via: 10.10.50.254, dev: shim50, adopt: true}
        - {to: default, metric: 4000, type: unreachable, adopt: true}
        - {to: 10.10.51.0/24, dev: shim50, src: 10.10.50.2, adopt: true}
        - {to: "::/0", via: fd00:50::fe, dev: shim50, adopt: true}
    - id: 151
      # the two unreachable defaults at metric 4294967295 are what killSwitch: true makes;
      # they are listed as routes so that they are adopted
      routes:
        - {to: default, metric: 4294967295, type: unreachable, adopt: true}
        - {to: "::/0", metric: 4294967295, type: unreachable, adopt: true}
  rules:
    - {priority: 100, from: 10.10.50.0/24, table: 150, adopt: true}
    - {priority: 101, from: fd00:50::/64, table: 150, adopt: true}
    # without from and to, nodeagent makes this rule for IPv4 and IPv6
    - {priority: 200, iif: shim50, table: 151, adopt: true}
`
	if diff := cmp.Diff(strings.Split(want, "\n"), strings.Split(string(r.Config), "\n")); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	wantSteps := []string{
		"install -d -m 0750 /etc/nodeagent && cp -a /tmp/out/* /etc/nodeagent/   # as root: keys stay 0600, key directories 0700",
		"nodeagent validate",
		"nodeagent plan   # expect only adoptions (~ ... adopt), nothing added or removed",
		"systemctl disable shim50.service   # it made links nodeagent now makes; do not stop it",
		"systemctl enable --now nodeagent",
		"nodeagent plan   # expect nothing to change",
		"reboot   # proves the node comes up from nodeagent alone; then nodeagent plan again",
	}
	if diff := cmp.Diff(wantSteps, r.Steps); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	// The one note: rule 200 is IPv4 only in the kernel.
	if len(r.Notes) != 1 || !strings.HasPrefix(r.Notes[0], "rule 200: the kernel has it for IPv4 only") {
		t.Errorf("notes: %q", r.Notes)
	}

	root := t.TempDir()
	r, err = Build(s, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteOut(root, r); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(filepath.Join(root, ConfigName)); err != nil {
		t.Errorf("the installed config does not validate:\n%v", err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTakeOverNetNS is the switch-over on a real kernel: what ip(8) made is
// imported, nodeagent's plan for the imported config is adoptions only,
// a sync carries them out and leaves nothing to do, and importing again
// (nodeagent's rt_tables.d entry now naming the tables) prints the same
// config: the fixed point.
//
// Beside the old setup the node has what a CNI and a VPN daemon install,
// exactly as their sources do (scope.go names the files): Cilium's local
// rule moved from 0 to 100, its L7 proxy's rules 9 and 10 and tables 2004
// and 2005, with protocol kernel; Tailscale's rules 5210-5270 and table
// 52 through tailscale0. And an IPv6 source-specific route in a table of
// the old setup's. None of them is imported, the plan touches none, `ip
// rule` and their tables are byte for byte the same after the take-over
// and after a later config drops the imported rules; the from-route too.
func TestTakeOverNetNS(t *testing.T) {
	node := testenv.NewNetNS(t)
	far := testenv.NewNetNS(t)
	node.Veth(t, "trunk0", far, "up0")
	node.Veth(t, "cilium_host", far, "cilium_net")
	for _, c := range [][]string{
		{"ip", "link", "add", "shim50", "link", "trunk0", "type", "macvlan", "mode", "private"},
		{"ip", "link", "set", "shim50", "up"},
		{"ip", "addr", "add", "10.10.50.2/24", "dev", "shim50"},
		{"ip", "-6", "addr", "add", "fd00:50::2/64", "dev", "shim50", "nodad"},
		{"ip", "rule", "add", "from", "10.10.50.0/24", "lookup", "150", "pref", "1000"},
		{"ip", "-6", "rule", "add", "from", "fd00:50::/64", "lookup", "150", "pref", "1001"},
		{"ip", "rule", "add", "iif", "shim50", "lookup", "main", "suppress_prefixlength", "0", "pref", "990"},
		{"ip", "-6", "rule", "add", "iif", "shim50", "lookup", "main", "suppress_prefixlength", "0", "pref", "990"},
		{"ip", "route", "add", "default", "via", "10.10.50.254", "dev", "shim50", "table", "150"},
		{"ip", "route", "add", "unreachable", "default", "metric", "4000", "table", "150"},
		{"ip", "-6", "route", "add", "fd00:60::/64", "via", "fd00:50::fe", "dev", "shim50", "table", "150"},
		{"ip", "-6", "route", "add", "default", "from", "2001:db8:a::/48", "via", "fd00:50::fe", "dev", "shim50", "table", "150"},
		// Cilium (pkg/datapath/linux/node.go, pkg/proxy/routes.go).
		{"ip", "addr", "add", "10.0.0.90/32", "dev", "cilium_host"},
		{"ip", "link", "set", "cilium_host", "up"},
		{"ip", "rule", "add", "pref", "100", "lookup", "local", "protocol", "kernel"},
		{"ip", "rule", "del", "pref", "0", "lookup", "local"},
		{"ip", "-6", "rule", "add", "pref", "100", "lookup", "local", "protocol", "kernel"},
		{"ip", "-6", "rule", "del", "pref", "0", "lookup", "local"},
		{"ip", "rule", "add", "pref", "9", "fwmark", "0x200/0xf00", "lookup", "2004", "protocol", "kernel"},
		{"ip", "-6", "rule", "add", "pref", "9", "fwmark", "0x200/0xf00", "lookup", "2004", "protocol", "kernel"},
		{"ip", "rule", "add", "pref", "10", "fwmark", "0xa00/0xf00", "lookup", "2005", "protocol", "kernel"},
		{"ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "2004", "proto", "kernel", "scope", "host"},
		{"ip", "-6", "route", "add", "local", "::/0", "dev", "lo", "table", "2004", "proto", "kernel"},
		{"ip", "route", "add", "10.0.0.90/32", "dev", "cilium_host", "table", "2005", "proto", "kernel", "scope", "link"},
		{"ip", "route", "add", "default", "via", "10.0.0.90", "dev", "cilium_host", "table", "2005", "proto", "kernel"},
		// Tailscale (wgengine/router/osrouter/router_linux.go): netlink
		// with no protocol.
		{"ip", "tuntap", "add", "tailscale0", "mode", "tun"},
		{"ip", "link", "set", "tailscale0", "up"},
		{"ip", "addr", "add", "100.101.102.103/32", "dev", "tailscale0"},
		{"ip", "rule", "add", "pref", "5210", "fwmark", "0x80000/0xff0000", "lookup", "main", "protocol", "0"},
		{"ip", "rule", "add", "pref", "5230", "fwmark", "0x80000/0xff0000", "lookup", "default", "protocol", "0"},
		{"ip", "rule", "add", "pref", "5250", "fwmark", "0x80000/0xff0000", "unreachable", "protocol", "0"},
		{"ip", "rule", "add", "pref", "5270", "lookup", "52", "protocol", "0"},
		{"ip", "-6", "rule", "add", "pref", "5210", "fwmark", "0x80000/0xff0000", "lookup", "main", "protocol", "0"},
		{"ip", "-6", "rule", "add", "pref", "5270", "lookup", "52", "protocol", "0"},
		{"ip", "route", "add", "100.100.100.100/32", "dev", "tailscale0", "table", "52", "proto", "0"},
		{"ip", "route", "add", "100.64.0.0/10", "dev", "tailscale0", "table", "52", "proto", "0"},
		{"ip", "route", "add", "throw", "192.168.1.0/24", "table", "52", "proto", "0"},
		{"ip", "-6", "route", "add", "fd7a:115c:a1e0::/48", "dev", "tailscale0", "table", "52", "proto", "0"},
	} {
		node.Exec(t, c...)
	}
	// others is everything of Cilium's and Tailscale's, and the
	// from-route, as ip(8) prints it.
	others := func() string {
		var b strings.Builder
		for _, c := range [][]string{
			{"ip", "-d", "rule", "show"}, {"ip", "-6", "-d", "rule", "show"},
			{"ip", "-d", "route", "show", "table", "2004"}, {"ip", "-6", "-d", "route", "show", "table", "2004"},
			{"ip", "-d", "route", "show", "table", "2005"}, {"ip", "-d", "route", "show", "table", "52"},
			{"ip", "-6", "-d", "route", "show", "table", "52"},
		} {
			fmt.Fprintf(&b, "$ %s\n%s", strings.Join(c, " "), node.Exec(t, c...))
		}
		for _, l := range strings.Split(node.Exec(t, "ip", "-6", "-d", "route", "show", "table", "150"), "\n") {
			if strings.Contains(l, " from ") {
				b.WriteString(l + "\n")
			}
		}
		return b.String()
	}
	// ours drops the old setup's rules (990, 1000, 1001) from a listing.
	ours := regexp.MustCompile(`(?m)^(990|1000|1001):.*\n`)
	before := others()
	t.Logf("before:\n%s", before)

	etc := t.TempDir()
	writeFile(t, filepath.Join(etc, "iproute2", "rt_tables"), "255\tlocal\n254\tmain\n253\tdefault\n150\tvpn\n")
	tablesFile := filepath.Join(etc, "iproute2", "rt_tables.d", "nodeagent.conf")
	os.MkdirAll(filepath.Dir(tablesFile), 0o755)

	ctx := context.Background()
	s, err := Read(ctx, node.Host, ReadOptions{Etc: etc})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	first, err := Build(s, Options{Root: root})
	if err != nil {
		t.Fatalf("%v\n%s", err, first.Config)
	}
	t.Logf("imported:\n%s", first.Config)
	for _, want := range []string{
		"#   rule 100: from all lookup local proto kernel: Cilium's (the kernel's local-table rule, which Cilium moves from 0 to 100",
		"#   rule 9: from all fwmark 0x200/0xf00 lookup 2004 proto kernel: Cilium's (its L7 proxy's)",
		"#   rule 10: from all fwmark 0xa00/0xf00 lookup 2005 proto kernel: Cilium's (its L7 proxy's)",
		"#   rule 5270: from all lookup 52: Tailscale's (its policy routing (5200 and up))",
		"#   table 2004, 2 route(s): Cilium's (its L7 proxy's)",
		"#   table 52, 4 route(s): Tailscale's (its policy routing (5200 and up))",
		"# not imported: default (IPv6) from 2001:db8:a::/48 via fd00:50::fe dev shim50",
	} {
		if !strings.Contains(string(first.Config), want) {
			t.Errorf("the config does not list %q", want)
		}
	}
	if !slices.ContainsFunc(first.Notes, func(n string) bool { return strings.Contains(n, "from 2001:db8:a::/48") }) {
		t.Errorf("the notes do not list the from-route: %q", first.Notes)
	}
	if err := WriteOut(root, first); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(filepath.Join(root, ConfigName))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Routing.Rules {
		if r.Priority < 990 {
			t.Errorf("rule %d is imported; it is not the old setup's", r.Priority)
		}
	}
	for _, tb := range c.Routing.Tables {
		if tb.ID != 150 {
			t.Errorf("table %d is imported; it is not the old setup's", tb.ID)
		}
	}
	d, err := netcfg.FromConfig(c, tablesFile)
	if err != nil {
		t.Fatal(err)
	}
	cv := &netcfg.Converger{Host: node.Host}
	defer cv.Close()
	p, err := cv.Plan(ctx, d)
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, p)
	}
	t.Logf("plan:\n%s", p)
	// The rt_tables.d entry is nodeagent's own file, written, not adopted.
	var report plan.Report
	for _, e := range p.Report() {
		if !strings.Contains(e.Text, "rt_tables") {
			report = append(report, e)
		}
		for _, other := range []string{"2004", "2005", "table 52", "lookup 52", "tailscale0", "cilium", "from 2001:db8:a"} {
			if strings.Contains(e.Text, other) {
				t.Errorf("the plan touches another's object: %s", e.Text)
			}
		}
	}
	if !report.OnlyAdoptions() {
		t.Errorf("the plan for the imported config is not adoptions only:\n%s\nconfig:\n%s", p, first.Config)
	}
	if _, err := cv.Sync(ctx, d); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if p, err := cv.Plan(ctx, d); err != nil || !p.Empty() {
		t.Errorf("after the sync: %v\n%s", err, p)
	}
	if out := node.Exec(t, "ip", "rule", "show", "pref", "1000"); !strings.Contains(out, "proto 147") {
		t.Errorf("rule 1000 is not nodeagent's after the sync: %s", out)
	}
	after := others()
	if d := cmp.Diff(ours.ReplaceAllString(before, ""), ours.ReplaceAllString(after, "")); d != "" {
		t.Errorf("another's rules or tables changed in the take-over (-before +after):\n%s", d)
	}

	s, err = Read(ctx, node.Host, ReadOptions{Etc: etc})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(s, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(strings.Split(string(first.Config), "\n"), strings.Split(string(again.Config), "\n")); diff != "" {
		t.Errorf("importing after the take-over differs (-first +again):\n%s", diff)
	}

	// A later config without the imported rules: nodeagent removes its
	// own, and nothing of anyone else's.
	c.Routing.Rules = nil
	d, err = netcfg.FromConfig(c, tablesFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err = cv.Sync(ctx, d)
	if err != nil {
		t.Fatalf("sync without the rules: %v\n%s", err, p)
	}
	t.Logf("the config without the imported rules:\n%s", p)
	dropped := others()
	if d := cmp.Diff(ours.ReplaceAllString(before, ""), ours.ReplaceAllString(dropped, "")); d != "" {
		t.Errorf("dropping the imported rules changed another's (-before +after):\n%s", d)
	}
	if ours.MatchString(dropped) {
		t.Errorf("an imported rule is still there after the config dropped it:\n%s", dropped)
	}
}
