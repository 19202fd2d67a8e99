package netcfg

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv"
)

// ownProto matches nodeagent's protocol as `ip` prints it: by name where
// packaging's rt_protos.d entry is installed, by number where it is not.
var ownProto = regexp.MustCompile(`proto (nodeagent|147)\b`)

// TestAdoptRulesAndRoutesInPlace is the take-over of a node set up the old
// way (issue 33): a policy rule and the routes of its table, made with
// `ip rule` and `ip route`, are adopted by a config marking them adopt:
// true while a client behind the node pings through them. Not a ping is
// lost, `ip monitor` never shows a route of table 150 deleted nor the rule deleted
// before nodeagent's stands beside it, and afterwards they are nodeagent's
// and the plan is empty.
func TestAdoptRulesAndRoutesInPlace(t *testing.T) {
	node, client, upstream := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "lan0", client, "eth0")
	node.Veth(t, "wan0", upstream, "eth0")
	run(t, client, "ip addr add 10.10.50.2/24 dev eth0", "ip route add default via 10.10.50.1")
	run(t, upstream, "ip addr add 192.0.2.2/24 dev eth0", "ip addr add 198.51.100.1/32 dev lo",
		"ip route add 10.10.50.0/24 via 192.0.2.1")
	// The node as a script left it: the main table has no way to
	// 198.51.100.1, only table 150, which the rule sends 10.10.50.0/24 to.
	run(t, node, "ip addr add 10.10.50.1/24 dev lan0", "ip addr add 192.0.2.1/24 dev wan0",
		"sysctl -qw net.ipv4.ip_forward=1",
		"ip route add default via 192.0.2.2 dev wan0 table 150",
		"ip route add unreachable default metric 4294967294 table 150",
		"ip rule add from 10.10.50.0/24 table 150 priority 1000")
	before := node.Exec(t, "ip", "-d", "rule", "show", "priority", "1000")
	t.Logf("the old rule: %s", strings.TrimSpace(before))
	client.Exec(t, "ping", "-c", "1", "-W", "2", "198.51.100.1")

	const yaml = `routing:
  tables:
    - id: 150
      routes:
        - {to: default, via: 192.0.2.2, dev: wan0, adopt: true}
        - {to: default, type: unreachable, metric: 4294967294, adopt: true}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150, adopt: true}
`
	c, err := config.ParseWith("nodeagent.yaml", []byte(yaml), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatalf("config:\n%v", err)
	}
	d, err := FromConfig(c, tablesFile(t, node))
	if err != nil {
		t.Fatal(err)
	}
	cv := &Converger{Host: node.Host}
	ctx := context.Background()

	p, err := cv.Plan(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	want := `~ route default via 192.0.2.2 dev wan0 table 150 adopt (mark as nodeagent's)
~ route unreachable default table 150 metric 4294967294 adopt (mark as nodeagent's)
~ rule 1000: from 10.10.50.0/24 lookup 150 adopt (mark as nodeagent's)
`
	if got := p.Route.String(); got != want || !p.Route.Report().OnlyAdoptions() {
		t.Fatalf("the plan of the marked config is not only the adoptions:\n%swant:\n%s", p, want)
	}
	t.Logf("plan:\n%s", p)

	node.WaitDAD(t) // no link-local routes coming and going in the record
	mon := startIPMonitor(t, node)
	// A ping every 2ms from the client, forwarded by the node by table
	// 150, from before the sync until after it.
	ping := exec.Command("ip", "netns", "exec", client.Name, "ping", "-n", "-q", "-i", "0.002", "-c", "1000", "-W", "1", "198.51.100.1")
	var pingOut bytes.Buffer
	ping.Stdout, ping.Stderr = &pingOut, &pingOut
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	synced, err := cv.Sync(ctx, d)
	if err != nil {
		t.Fatalf("sync: %v\n%s", err, synced)
	}
	pingErr := ping.Wait()
	lines := mon.stop(t)

	sent, received := pingFigures(pingOut.String())
	t.Logf("pings sent %d, received %d, lost %d", sent, received, sent-received)
	if pingErr != nil || sent < 900 || sent != received {
		t.Errorf("pings lost across the adoption (ping: %v):\n%s", pingErr, pingOut.String())
	}

	t.Logf("ip monitor route rule, %d lines during the sync:\n%s", len(lines), strings.Join(lines, "\n"))
	if strings.Contains(strings.Join(lines, "\n"), "999:") {
		t.Logf("the kernel refused nodeagent's rule beside the old one: the adoption bridged by priority 999")
	} else {
		t.Logf("the kernel took nodeagent's rule beside the old one at priority 1000 (they differ only in protocol)")
	}
	ruleLine := regexp.MustCompile(`^(Deleted )?\d+:\s`)
	ours := 0 // nodeagent's rules for 10.10.50.0/24 in the kernel
	for _, l := range lines {
		deleted := strings.HasPrefix(l, "Deleted ")
		switch {
		case !ruleLine.MatchString(l):
			if deleted && strings.Contains(l, "table 150") {
				t.Errorf("a route was deleted during the adoption: %s", l)
			}
		case !strings.Contains(l, "from 10.10.50.0/24 lookup 150"):
		case ownProto.MatchString(l) && deleted:
			ours--
		case ownProto.MatchString(l):
			ours++
		case deleted && ours == 0:
			t.Errorf("the old rule was deleted before nodeagent's stood beside it: %s", l)
		}
	}

	rules := node.Exec(t, "ip", "rule", "show")
	var at1000 []string
	for _, l := range strings.Split(rules, "\n") {
		if strings.HasPrefix(l, "1000:") || strings.HasPrefix(l, "999:") {
			at1000 = append(at1000, l)
		}
	}
	if len(at1000) != 1 || !strings.Contains(at1000[0], "1000:\tfrom 10.10.50.0/24 lookup 150") || !ownProto.MatchString(at1000[0]) {
		t.Errorf("after the adoption the rule is not nodeagent's, alone:\n%s", rules)
	}
	routes := strings.TrimSpace(node.Exec(t, "ip", "route", "show", "table", "150"))
	t.Logf("ip rule show:\n%sip route show table 150:\n%s", rules, routes)
	rl := strings.Split(routes, "\n")
	if len(rl) != 2 {
		t.Errorf("table 150 has %d routes, want 2:\n%s", len(rl), routes)
	}
	for _, l := range rl {
		if !ownProto.MatchString(l) {
			t.Errorf("route not nodeagent's after the adoption: %s", l)
		}
	}
	p, err = cv.Plan(ctx, d)
	if err != nil || !p.Empty() {
		t.Errorf("plan after the adoption is not empty (%v):\n%s", err, p)
	}
}

// ipMonitor is `ip -ts monitor route rule` running in a namespace.
type ipMonitor struct {
	ns    *testenv.NetNS
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

// Markers bracket what a monitor records: a route added and deleted in a
// table of its own, whose lines are not returned.
const markerTable = "4242"

func startIPMonitor(t *testing.T, ns *testenv.NetNS, objects ...string) *ipMonitor {
	t.Helper()
	if len(objects) == 0 {
		objects = []string{"route", "rule"}
	}
	m := &ipMonitor{ns: ns, cmd: exec.Command("ip", append([]string{"-n", ns.Name, "-ts", "monitor"}, objects...)...), done: make(chan struct{})}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.cmd.Process.Kill()
		m.cmd.Wait()
	})
	go func() {
		defer close(m.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			m.mu.Lock()
			m.lines = append(m.lines, sc.Text())
			m.mu.Unlock()
		}
	}()
	m.mark(t, "203.0.113.1")
	return m
}

// mark adds and deletes a marker route and waits until the monitor has
// printed both: everything before them has been printed too.
func (m *ipMonitor) mark(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Until the monitor listens, the marker may go unseen: repeat it.
		run(t, m.ns, "ip route add unreachable "+addr+" table "+markerTable, "ip route del unreachable "+addr+" table "+markerTable)
		time.Sleep(20 * time.Millisecond)
		m.mu.Lock()
		n := 0
		for _, l := range m.lines {
			if strings.Contains(l, addr) {
				n++
			}
		}
		m.mu.Unlock()
		if n >= 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ip monitor in %s printed no marker", m.ns.Name)
		}
	}
}

// stop marks the end, stops the monitor and returns what it printed
// between the marks, each line without its timestamp.
func (m *ipMonitor) stop(t *testing.T) []string {
	t.Helper()
	m.mark(t, "203.0.113.2")
	m.cmd.Process.Kill()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, l := range m.lines {
		if strings.Contains(l, "table "+markerTable) {
			continue
		}
		if i := strings.Index(l, "] "); strings.HasPrefix(l, "[") && i > 0 {
			l = l[i+2:]
		}
		if strings.HasPrefix(l, "Timestamp:") {
			continue
		}
		out = append(out, l)
	}
	return out
}

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (packets )?received`)

// pingFigures reads ping's summary: packets sent and received.
func pingFigures(out string) (sent, received int) {
	m := pingStats.FindStringSubmatch(out)
	if m == nil {
		return 0, 0
	}
	sent, _ = strconv.Atoi(m[1])
	received, _ = strconv.Atoi(m[2])
	return sent, received
}
