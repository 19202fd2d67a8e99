package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// podNode is the real nodeagent daemon running on a trunk lab.
type podNode struct {
	t      *testing.T
	l      *piastub.Lab
	bin    string
	socket string
	log    string
	cmd    *exec.Cmd
	client *api.Client
}

func (n *podNode) start() {
	t := n.t
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", n.l.Node.Name, n.bin, "run", "-c", n.l.Config, "--socket", n.socket,
		"--state-dir", n.l.StateDir, "--resync", "5s")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.cmd = cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		f.Close()
	})
}

func (n *podNode) status() api.Status {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := n.client.Status(ctx)
	if err != nil {
		return api.Status{}
	}
	return *s
}

func (n *podNode) healthy() bool {
	s := n.status()
	return s.Ready && len(s.PIA) == 1 && s.PIA[0].Healthy
}

func (n *podNode) plan() api.Plan {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := n.client.Plan(ctx)
	if err != nil {
		n.t.Fatalf("plan: %v", err)
	}
	return *p
}

// changes counts the changes the daemon has logged (one line each).
func (n *podNode) changes() int {
	b, _ := os.ReadFile(n.log)
	return strings.Count(string(b), "msg=change ")
}

func (n *podNode) wait(what string, within time.Duration, cond func() bool) {
	n.t.Helper()
	for start := time.Now(); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > within {
			b, _ := os.ReadFile(n.log)
			n.t.Fatalf("timed out after %s waiting for %s; daemon log:\n%s", within, what, b)
		}
	}
}

// counters hides nft's counters, which traffic moves.
var counters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// owned is nodeagent's part of the node as ip(8) and nft(8) show it: the
// links (with their addresses), routes, rules and its nft table.
func (n *podNode) owned() string {
	var b strings.Builder
	for _, args := range [][]string{
		{"ip", "-d", "addr", "show"}, {"ip", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"},
		{"ip", "rule"}, {"ip", "-6", "rule"}, {"nft", "list", "table", "inet", "nodeagent"},
	} {
		out, _ := n.l.Node.TryExec(args...)
		b.WriteString("$ " + strings.Join(args, " ") + "\n" + counters.ReplaceAllString(out, "counter"))
	}
	return b.String()
}

// ping reports whether one echo from ns to addr came back.
func ping(ns *testenv.NetNS, addr string) bool {
	_, err := ns.TryExec("ping", "-c", "1", "-W", "1", addr)
	return err == nil
}

// TestSameNodePods is the seeds' topology: download pods on the gateway
// node itself, attached to VLAN 50 by Debian's real macvlan CNI plugin as
// Multus attaches them, behind the PIA tunnel (testenv/piastub) and the kill
// switch. The old layout (the pods' gateway on the VLAN link) is warned
// about and gets the pods no replies; the shim layout works for them and
// for a host on VLAN 50 beyond the trunk; the pods are never touched. On the
// host kernel a vepa macvlan stands in for enp1s0.50 (the kernel has no
// 8021q); in the VM it is a real VLAN, and WireGuard the kernel's.
func TestSameNodePods(t *testing.T) {
	testenv.RequireCNI(t)
	l := piastub.NewTrunkLab(t, piastub.Options{}, "stub_ams")
	l.PIA = `      portForward: {enabled: true, to: 10.10.50.10, toPort: 8080}
      dns: {for: [10.10.50.0/24]}`
	l.OldLayout = true
	l.WriteConfig(t, "stub_ams")
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(l.Dir, "rt_tables.conf"))
	n := &podNode{t: t, l: l, bin: binary(t), socket: filepath.Join(l.Dir, "s.sock"), log: filepath.Join(l.Dir, "nodeagent.log")}
	n.client = api.NewClient(n.socket)
	t.Logf("VLAN 50 is %s", l.VLAN)

	// The old layout: validate and status warn, and the warning is true.
	out, _ := l.Node.TryExec(n.bin, "validate", "-c", l.Config, "--state-dir", l.StateDir)
	warning := "macvlan pods on " + l.VLAN + " cannot reach 10.10.50.1 on " + l.VLAN + " itself; put it on " + piastub.Shim
	if !strings.Contains(out, "warning: "+l.Config+":") || !strings.Contains(out, warning) {
		t.Errorf("validate of the old layout does not warn %q:\n%s", warning, out)
	}
	n.start()
	n.wait("the tunnel healthy (old layout)", 90*time.Second, n.healthy)
	if w := layoutWarnings(n.status().Warnings); len(w) != 2 || !strings.Contains(w[0], warning) {
		t.Errorf("status warnings %q, want the address's and the route's", w)
	}
	if p := n.plan(); len(layoutWarnings(p.Warnings)) != 2 {
		t.Errorf("nodeagentctl plan warnings %q, want 2 about the layout", p.Warnings)
	}
	qbt := testenv.AttachPod(t, l.Node, l.NAD(), "qbittorrent", "10.10.50.10/24", "fd00:50::10/64")
	jd := testenv.AttachPod(t, l.Node, l.NAD(), "jdownloader", "10.10.50.11/24", "fd00:50::11/64")
	exitBefore, _ := l.FarSaw(t)
	replies := 0
	for range 5 {
		if ping(qbt.NS, piastub.Far.String()) {
			replies++
		}
	}
	exitAfter, _ := l.FarSaw(t)
	if replies != 0 || exitAfter < exitBefore+5 {
		t.Errorf("old layout: the pod got %d of 5 replies, and the far side saw %d echoes from the stub's address; want 0 replies to 5 echoes that left through the tunnel",
			replies, exitAfter-exitBefore)
	}
	if !ping(l.LAN, piastub.Far.String()) {
		t.Error("old layout: the host beyond the trunk does not reach the internet")
	}

	// The shim layout, reloaded under the running pods.
	podsBefore := []string{qbt.State(t), jd.State(t)}
	l.OldLayout = false
	l.WriteConfig(t, "stub_ams")
	l.Node.Exec(t, "kill", "-HUP", strconv.Itoa(n.cmd.Process.Pid))
	n.wait("the shim layout converged, without warnings", 30*time.Second, func() bool {
		s := n.status()
		return len(layoutWarnings(s.Warnings)) == 0 && s.Ready && !s.Degraded && len(n.plan().Lines) == 0
	})
	for _, p := range []*testenv.Pod{qbt, jd} {
		n.wait(p.Name+" reaching the internet", 20*time.Second, func() bool { return ping(p.NS, piastub.Far.String()) })
	}
	checkPods(t, "a layout change on the node", podsBefore, qbt, jd)
	// Not even the old layout leaked: the node's ICMP errors about the
	// replies it could not deliver would go to the far side by the main
	// table, and the kill switch's output rules drop them.
	leaks := [4]int{}
	noLeaks(t, l, "the old layout", leaks)
	// The kernel's own IPv6 duplicate-address detection of the shim's
	// address, which changes what ip(8) shows, ends before the node is compared.
	n.wait("the shim's IPv6 address out of DAD", 10*time.Second, func() bool {
		out, _ := l.Node.TryExec("ip", "-6", "addr", "show", "dev", piastub.Shim, "tentative")
		return strings.TrimSpace(out) == ""
	})

	// 1. Both pods reach the internet through the tunnel only, as the
	// stub's address; the forwarded port reaches one over TCP and UDP;
	// its DNS goes through the tunnel; the shim reaches both; the host
	// beyond the trunk works.
	exit0, other0 := l.FarSaw(t)
	for _, p := range []*testenv.Pod{qbt, jd} {
		for range 3 {
			if !ping(p.NS, piastub.Far.String()) {
				t.Errorf("%s: an echo to the internet was lost", p.Name)
			}
		}
	}
	if exit, other := l.FarSaw(t); exit < exit0+6 || other != other0 {
		t.Errorf("the far side saw %d echoes from the stub's address and %d from others, want 6 and 0", exit-exit0, other-other0)
	}
	piastub.Serve(t, qbt.NS, "10.10.50.10:8080")
	n.wait("a forwarded port", 60*time.Second, func() bool { s := n.status(); return len(s.PIA) == 1 && s.PIA[0].ForwardedPort != 0 })
	port := n.status().PIA[0].ForwardedPort
	public := piastub.Exit.String() + ":" + strconv.Itoa(port)
	n.wait("the forwarded port reaching qbittorrent over TCP and UDP", 20*time.Second, func() bool {
		return piastub.ReachTCP(l.Stub.Inet, public, time.Second) && piastub.ReachUDP(l.Stub.Inet, public, time.Second)
	})
	dns0 := l.Stub.Count("dns:" + piastub.DNSServers[0].String())
	for _, server := range []string{"10.10.50.1", "9.9.9.9"} {
		if a, err := piastub.DNSQuery(qbt.NS, server, piastub.TestName); err != nil || a != piastub.TestAddr {
			t.Errorf("qbittorrent's DNS query to %s: %v %v, want %v from PIA's resolver", server, a, err, piastub.TestAddr)
		}
	}
	if got := l.Stub.Count("dns:" + piastub.DNSServers[0].String()); got < dns0+2 {
		t.Errorf("PIA's resolver counted %d of the pod's 2 queries", got-dns0)
	}
	for _, p := range []string{"10.10.50.10", "10.10.50.11"} {
		if _, err := l.Node.TryExec("ping", "-c", "1", "-W", "1", "-I", piastub.Shim, p); err != nil {
			t.Errorf("the shim does not reach the pod at %s", p)
		}
	}
	if !l.PingFar() {
		t.Error("the host on VLAN 50 beyond the trunk does not reach the internet")
	}
	noLeaks(t, l, "pods on the node", leaks)

	// A pod added and one removed: no writes.
	changes, owned := n.changes(), n.owned()
	proxy := testenv.AttachPod(t, l.Node, l.NAD(), "browser-vpn-proxy", "10.10.50.12/24", "fd00:50::12/64")
	if !ping(proxy.NS, "10.10.50.1") {
		t.Error("a new pod does not reach its gateway")
	}
	proxy.Del(t)
	time.Sleep(2 * time.Second) // the events' debounce, and a sync if one comes
	if got := n.changes(); got != changes {
		t.Errorf("a pod added and removed: the daemon logged %d change(s)", got-changes)
	}
	if got := n.owned(); got != owned {
		t.Errorf("a pod added and removed changed the node:\n--- before\n%s\n--- after\n%s", owned, got)
	}

	// 2. The tunnel down at the stub: nothing of the pods' reaches the WAN.
	for _, s := range l.Stub.Servers {
		s.Down()
	}
	n.wait("the tunnel unhealthy", 60*time.Second, func() bool { s := n.status(); return len(s.PIA) == 1 && !s.PIA[0].Healthy })
	if st := n.status(); st.Condition(api.CondTunnelHealthy) == nil || st.Condition(api.CondTunnelHealthy).Status != api.False {
		t.Errorf("TunnelHealthy %+v while the tunnel is down", st.Conditions)
	}
	for _, p := range []*testenv.Pod{qbt, jd} {
		if ping(p.NS, piastub.Far.String()) {
			t.Errorf("%s reached the internet with the tunnel down", p.Name)
		}
	}
	if ping(qbt.NS, "2001:db8:1::2") {
		t.Error("qbittorrent reached the WAN over IPv6")
	}
	if a, err := piastub.DNSQuery(qbt.NS, "9.9.9.9", piastub.TestName); err == nil {
		t.Errorf("with the tunnel down, a pod's DNS query was answered: %v", a)
	}
	noLeaks(t, l, "the tunnel down", leaks)
	for _, s := range l.Stub.Servers {
		s.Up()
	}
	n.wait("the tunnel healthy again", 90*time.Second, n.healthy)
	for _, p := range []*testenv.Pod{qbt, jd} {
		n.wait(p.Name+" back on the internet", 30*time.Second, func() bool { return ping(p.NS, piastub.Far.String()) })
	}

	// 3. Reload, resync, a rule repaired, kill -9 and a restart: the pods
	// are as they were.
	pods := []string{qbt.State(t), jd.State(t)}
	l.Node.Exec(t, "kill", "-HUP", strconv.Itoa(n.cmd.Process.Pid))
	last := n.status().LastSync
	n.wait("a resync", 30*time.Second, func() bool {
		s := n.status().LastSync
		return s != nil && last != nil && s.Count > last.Count && s.Trigger == "resync"
	})
	l.Node.Exec(t, "ip", "rule", "del", "priority", "1000")
	n.wait("rule 1000 repaired", 10*time.Second, func() bool {
		out, _ := l.Node.TryExec("ip", "rule", "show", "priority", "1000")
		return strings.Contains(out, "lookup 150") || strings.Contains(out, "lookup vlan50-egress")
	})
	n.cmd.Process.Signal(syscall.SIGKILL)
	n.cmd.Wait()
	checkPods(t, "reload, resync, drift repair, kill -9", pods, qbt, jd)
	n.start()
	n.wait("healthy after kill -9", 90*time.Second, n.healthy)
	checkPods(t, "a restart", pods, qbt, jd)
	if !ping(qbt.NS, piastub.Far.String()) {
		t.Error("after the restart the pod does not reach the internet")
	}

	// CNI DEL of one pod leaves nodeagent's objects as they were.
	owned = n.owned()
	jd.Del(t)
	time.Sleep(2 * time.Second)
	if got := n.owned(); got != owned {
		t.Errorf("CNI DEL changed the node:\n--- before\n%s\n--- after\n%s", owned, got)
	}
	if p := n.plan(); len(p.Lines) != 0 {
		t.Errorf("after CNI DEL the plan is not empty: %q", p.Lines)
	}

	// qbittorrent gone too: what a peer sends to the forwarded port now
	// finds no pod, and the node's ICMP errors about it (host unreachable,
	// quoting the peer's packet) are dropped, not sent outside the tunnel.
	qbt.Del(t)
	// (The tunnel's outage above may have moved the node to another
	// server, and so to another port.)
	public = piastub.Exit.String() + ":" + strconv.Itoa(n.status().PIA[0].ForwardedPort)
	drops := killSwitchDrops(t, l)
	// The pod's neighbour entry would take up to a minute to fail (until
	// then the node sends to its old MAC and reports nothing): forget it.
	l.Node.Exec(t, "ip", "neigh", "flush", "to", "10.10.50.10")
	n.wait("the node's ICMP errors about the gone pod dropped", 30*time.Second, func() bool {
		if piastub.ReachUDP(l.Stub.Inet, public, 200*time.Millisecond) {
			t.Fatal("the forwarded port answered with its pod gone")
		}
		return killSwitchDrops(t, l) > drops
	})
	noLeaks(t, l, "a forwarded port whose pod is gone", leaks)

	// teardown never takes a pod's link with it: a canary pod on VLAN 50.
	canary := testenv.AttachPod(t, l.Node, l.NAD(), "canary", "10.10.50.100/24", "fd00:50::100/64")
	pods = []string{canary.State(t)}
	n.cmd.Process.Signal(syscall.SIGTERM)
	n.cmd.Wait()
	before := n.owned()
	out, err := l.Node.TryExec(n.bin, "teardown", "--state-dir", l.StateDir)
	if l.VLAN == "enp1s0.50" {
		// The canary's link sits on enp1s0.50, which the kernel would
		// delete it with: teardown refuses and changes nothing.
		if err == nil || !strings.Contains(out, "enp1s0.50: macvlan net1 in netns "+canary.NS.Name) || !strings.Contains(out, "--force") {
			t.Errorf("teardown with a pod on enp1s0.50: %v\n%s", err, out)
		}
		if got := n.owned(); got != before {
			t.Errorf("a refused teardown changed the node:\n--- before\n%s\n--- after\n%s", before, got)
		}
		checkPods(t, "a refused teardown", pods, canary)
		canary.Del(t)
		out = l.Node.Exec(t, n.bin, "teardown", "--state-dir", l.StateDir)
	} else {
		// The pods' links are on the trunk itself (the kernel puts a
		// macvlan made on a macvlan on that macvlan's lower device), not
		// on the stand-in: teardown goes ahead and they stay as they were.
		if err != nil {
			t.Fatalf("teardown: %v\n%s", err, out)
		}
		checkPods(t, "teardown", pods, canary)
	}
	left := n.owned()
	for _, gone := range []string{piastub.Shim, "10.10.50.1/24", "lookup 150", "table inet nodeagent {", l.Dev} {
		if strings.Contains(left, gone) {
			t.Errorf("teardown left %q:\n%s\n%s", gone, out, left)
		}
	}
}

// killSwitchDrops is the kill switch's drop counter.
func killSwitchDrops(t *testing.T, l *piastub.Lab) int {
	out := l.Node.Exec(t, "nft", "list", "counter", "inet", "nodeagent", "ks_drops")
	m := regexp.MustCompile(`packets (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no ks_drops counter:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// leakCounts are the lab's counters of what reached the WAN outside the
// tunnel: VLAN packets (IPv4, IPv6), plaintext to the far side, and DNS.
func leakCounts(t *testing.T, l *piastub.Lab) [4]int {
	v4, v6, plain := l.Leaks(t)
	return [4]int{v4, v6, plain, l.DNSLeaks(t)}
}

// noLeaks fails t unless the leak counters are still at since.
func noLeaks(t *testing.T, l *piastub.Lab, when string, since [4]int) {
	t.Helper()
	if now := leakCounts(t, l); now != since {
		t.Errorf("%s: packets reached the WAN outside the tunnel (v4, v6, plaintext to the far side, DNS): %v, was %v", when, now, since)
	}
}

// checkPods fails t unless each pod's state is as before.
func checkPods(t *testing.T, after string, before []string, pods ...*testenv.Pod) {
	t.Helper()
	for i, p := range pods {
		if got := p.State(t); got != before[i] {
			t.Errorf("after %s, pod %s changed:\n--- before\n%s\n--- after\n%s", after, p.Name, before[i], got)
		}
	}
}

// layoutWarnings are the warnings of ws about the pods' layout: the test's
// pod listens on a fixed port (toPort), which lint rightly warns about too.
func layoutWarnings(ws []string) []string {
	var out []string
	for _, w := range ws {
		if !strings.Contains(w, "portForward.toPort:") {
			out = append(out, w)
		}
	}
	return out
}
