package nft_test

import (
	"context"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.org/x/sys/unix"
)

func parse(t testing.TB, yaml string) nft.Desired {
	t.Helper()
	c, err := config.ParseWith("nodeagent.yaml", []byte(yaml), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatalf("config:\n%v", err)
	}
	d, err := netcfg.FromConfig(c, "")
	if err != nil {
		t.Fatal(err)
	}
	return d.Nft
}

// converge observes, plans and applies once, and returns the plan.
func converge(t testing.TB, ns *testenv.NetNS, d nft.Desired) nft.Plan {
	t.Helper()
	o, err := nft.Observe(context.Background(), ns.Host.Snapshot(), d)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	p := nft.MakePlan(d, o)
	if _, rep := nft.Apply(context.Background(), ns.Host.Snapshot(), p); rep.Err() != nil {
		err := rep.Err()
		t.Fatalf("apply:\n%s\nerror: %v", p, err)
	}
	return p
}

// observe observes ns and fails the test on error.
func observe(t testing.TB, ns *testenv.NetNS) nft.Observed {
	t.Helper()
	o, err := nft.Observe(context.Background(), ns.Host.Snapshot(), nft.Desired{})
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	return o
}

// run runs `ip`/`sysctl`-style setup lines in ns, one command per line.
func run(t testing.TB, ns *testenv.NetNS, lines ...string) {
	t.Helper()
	for _, l := range lines {
		ns.Exec(t, strings.Fields(l)...)
	}
}

// ipBatch runs ip commands in ns in one process; failures are ignored
// (-force), for restoring state that may be half there. Lines take no
// global options (no -6): the family follows from the addresses.
func ipBatch(ns *testenv.NetNS, lines ...string) {
	cmd := exec.Command("ip", "-n", ns.Name, "-force", "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	cmd.CombinedOutput()
}

// nftCounters installs a table `inet count` in ns with a chain at the
// earliest hook (prerouting -400: before conntrack, before anything can
// drop) holding one counter rule per match, and returns a func reading the
// packet counts in order.
func nftCounters(t testing.TB, ns *testenv.NetNS, matches ...string) func() []int {
	t.Helper()
	script := "table inet count {\n chain pre {\n  type filter hook prerouting priority -400; policy accept;\n"
	for _, m := range matches {
		script += "  " + m + " counter\n"
	}
	script += " }\n}\n"
	nftScript(t, ns, script)
	re := regexp.MustCompile(`counter packets (\d+)`)
	return func() []int {
		var out []int
		for _, m := range re.FindAllStringSubmatch(ns.Exec(t, "nft", "list", "chain", "inet", "count", "pre"), -1) {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
		if len(out) != len(matches) {
			t.Fatalf("read %d counters, want %d", len(out), len(matches))
		}
		return out
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// nftScript loads an nft script in ns with `nft -f`.
func nftScript(t testing.TB, ns *testenv.NetNS, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f in %s: %v\n%s\n%s", ns.Name, err, out, script)
	}
}

// nftMonitor counts nftables notifications (NFNLGRP_NFTABLES) in a
// namespace: every change to any table, chain, set, element or rule, like
// `nft monitor`. Reads (dumps) cause none.
type nftMonitor struct {
	conn  *netlink.Conn
	count atomic.Int64
	stop  atomic.Bool
	done  chan struct{}
}

func newNftMonitor(t testing.TB, ns *testenv.NetNS) *nftMonitor {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns.Handle)})
	if err != nil {
		t.Fatalf("netfilter netlink socket in %s: %v", ns.Name, err)
	}
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		c.Close()
		t.Fatalf("join NFNLGRP_NFTABLES: %v", err)
	}
	m := &nftMonitor{conn: c, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for !m.stop.Load() {
			c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			msgs, err := c.Receive()
			if err == nil {
				m.count.Add(int64(len(msgs)))
			}
		}
	}()
	t.Cleanup(func() { m.Stop() })
	return m
}

// Stop waits for notifications in flight and returns the count.
func (m *nftMonitor) Stop() int64 {
	if !m.stop.Load() {
		time.Sleep(100 * time.Millisecond)
		m.stop.Store(true)
		<-m.done
		m.conn.Close()
	}
	return m.count.Load()
}

// udpFlood sends small UDP datagrams from ns to addr as fast as it can
// for d and returns how many it sent.
func udpFlood(t testing.TB, ns *testenv.NetNS, addr string, d time.Duration) int {
	n := 0
	err := ns.Host.Do(func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		payload := make([]byte, 32)
		for end := time.Now().Add(d); time.Now().Before(end); {
			if _, err := c.Write(payload); err == nil {
				n++
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("udp flood to %s: %v", addr, err)
	}
	return n
}

// pingCount pings dst from ns with the given ping options and returns how
// many echo requests were sent; replies are not needed (the far side's
// counters are what tests assert).
func pingCount(ns *testenv.NetNS, dst string, opts ...string) int {
	out, _ := ns.TryExec(append(append([]string{"ping", "-n", "-q"}, opts...), dst)...)
	m := regexp.MustCompile(`(\d+) packets transmitted`).FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
