package importer

import (
	"context"
	"os"
	"path/filepath"
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
		{"ip", "rule", "add", "fwmark", "0x10/0xff", "lookup", "151", "pref", "200"},
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
    - {priority: 200, fwMark: 0x10/0xff, table: 151, adopt: true}
`
	if diff := cmp.Diff(strings.Split(want, "\n"), strings.Split(string(r.Config), "\n")); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	wantSteps := []string{
		"install -d -m 0755 /etc/nodeagent && cp -a /tmp/out/* /etc/nodeagent/   # as root: keys stay 0600, key directories 0700",
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
func TestTakeOverNetNS(t *testing.T) {
	node := testenv.NewNetNS(t)
	far := testenv.NewNetNS(t)
	node.Veth(t, "trunk0", far, "up0")
	for _, c := range [][]string{
		{"ip", "link", "add", "shim50", "link", "trunk0", "type", "macvlan", "mode", "private"},
		{"ip", "link", "set", "shim50", "up"},
		{"ip", "addr", "add", "10.10.50.2/24", "dev", "shim50"},
		{"ip", "rule", "add", "from", "10.10.50.0/24", "lookup", "150", "pref", "100"},
		{"ip", "-6", "rule", "add", "from", "fd00:50::/64", "lookup", "150", "pref", "101"},
		{"ip", "rule", "add", "iif", "shim50", "lookup", "main", "suppress_prefixlength", "0", "pref", "90"},
		{"ip", "-6", "rule", "add", "iif", "shim50", "lookup", "main", "suppress_prefixlength", "0", "pref", "90"},
		{"ip", "route", "add", "default", "via", "10.10.50.254", "dev", "shim50", "table", "150"},
		{"ip", "route", "add", "unreachable", "default", "metric", "4000", "table", "150"},
		{"ip", "route", "add", "unreachable", "default", "metric", "4294967295", "table", "151"},
		{"ip", "-6", "route", "add", "unreachable", "default", "metric", "4294967295", "table", "151"},
		{"ip", "rule", "add", "fwmark", "0x10", "lookup", "151", "pref", "200"},
		{"ip", "-6", "rule", "add", "fwmark", "0x10", "lookup", "151", "pref", "200"},
	} {
		node.Exec(t, c...)
	}
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
	if err := WriteOut(root, first); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(filepath.Join(root, ConfigName))
	if err != nil {
		t.Fatal(err)
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
	// The rt_tables.d entry is nodeagent's own file, written, not adopted.
	var report plan.Report
	for _, e := range p.Report() {
		if !strings.Contains(e.Text, "rt_tables") {
			report = append(report, e)
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
	if out := node.Exec(t, "ip", "rule", "show", "pref", "100"); !strings.Contains(out, "proto 147") {
		t.Errorf("rule 100 is not nodeagent's after the sync: %s", out)
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
}
