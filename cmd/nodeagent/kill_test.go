package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// asNodeagent makes the test binary act as nodeagent itself: the VM has
// no Go toolchain to build one.
const asNodeagent = "NODEAGENT_TEST_AS_NODEAGENT"

func TestMain(m *testing.M) {
	if os.Getenv(asNodeagent) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	// The binaries the tests run take a lock of their own, never the
	// host's /run/nodeagent/nodeagent.lock.
	lockDir, err := os.MkdirTemp("", "nodeagent-lock-")
	if err == nil {
		os.Setenv("NODEAGENT_LOCK", filepath.Join(lockDir, "nodeagent.lock"))
	}
	code := m.Run()
	os.RemoveAll(lockDir)
	os.Exit(code)
}

// binary builds nodeagent once per test run. In the VM it is a script that
// runs this test binary as nodeagent.
func binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if testenv.InVM() {
			self, err := os.Executable()
			if err != nil {
				buildErr = err
				return
			}
			builtBin = filepath.Join(os.TempDir(), "nodeagent")
			buildErr = os.WriteFile(builtBin, []byte("#!/bin/sh\n"+asNodeagent+"=1 exec "+self+" \"$@\"\n"), 0o755)
			return
		}
		dir, err := os.MkdirTemp("", "nodeagent-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "nodeagent")
		if out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build: %v", buildErr)
	}
	return builtBin
}

func killConfig(n int) string {
	var b strings.Builder
	b.WriteString("dad: {disabled: true}\nmacvlans:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  - {name: m%d, parent: trunk0, addresses: [10.60.%d.1/24]}\n", i, i)
	}
	b.WriteString("routing:\n  tables:\n    - id: 150\n      killSwitch: true\n      routes:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "        - {to: 10.70.%d.0/24, dev: m%d}\n", i, i)
	}
	b.WriteString("  rules:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "    - {priority: %d, from: 10.60.%d.0/24, table: 150}\n", 2000+i, i)
	}
	b.WriteString("firewall:\n  masquerade: [{from: 10.60.0.0/16, out: trunk0}]\n  killSwitch: [{from: 10.60.0.0/16, allowOut: [trunk0]}]\n")
	return b.String()
}

// withoutOurs drops nodeagent's own (proto 147) lines.
func withoutOurs(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, "proto 147") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// lines counts the non-empty lines a command prints in ns.
func lines(t *testing.T, ns *testenv.NetNS, args ...string) int {
	t.Helper()
	return len(strings.Fields(strings.ReplaceAll(ns.Exec(t, args...), " ", "_")))
}

// TestKillNineMidApply kills `nodeagent apply --once` with SIGKILL at
// different points of a cold converge, several times over, and then lets
// one run finish: the node converges with no duplicate and no half-made
// object, and the foreign objects planted first are untouched.
func TestKillNineMidApply(t *testing.T) {
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "wire0")
	bin := binary(t)
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(t.TempDir(), "nodeagent.conf"))
	for _, l := range []string{
		"ip link add link trunk0 name podshim type macvlan mode bridge",
		"ip rule add priority 2001 from 10.20.0.0/16 lookup 200 proto static",
		"ip route add 10.80.0.0/16 dev trunk0 table 150 proto static",
		"nft add table inet k3s-test",
		"nft add chain inet k3s-test forward { type filter hook forward priority -10 ; policy accept ; }",
		"nft add rule inet k3s-test forward ip saddr 10.60.0.0/16 counter accept",
	} {
		node.Exec(t, strings.Fields(l)...)
	}
	foreign := func() string {
		return node.Exec(t, "ip", "-d", "link", "show", "podshim") +
			withoutOurs(node.Exec(t, "ip", "-d", "rule", "show", "priority", "2001")) + // nodeagent uses 2001 too
			node.Exec(t, "ip", "route", "show", "table", "150", "proto", "static") +
			node.Exec(t, "nft", "-j", "list", "table", "inet", "k3s-test")
	}
	before := foreign()
	cfg := filepath.Join(t.TempDir(), "nodeagent.yaml")
	os.WriteFile(cfg, []byte(killConfig(60)), 0o600)

	killed := 0
	for i, delay := range []time.Duration{2, 8, 15, 25, 40, 60, 90, 130} {
		cmd := exec.Command("ip", "netns", "exec", node.Name, bin, "apply", "--once", "-c", cfg)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay * time.Millisecond)
		cmd.Process.Kill()
		cmd.Wait()
		// Count only runs the signal really ended, not ones already done.
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			killed++
		}
		if i%2 == 1 {
			// Start the next one from nothing, so kills land early in a
			// cold converge as well as late.
			node.TryExec(bin, "teardown")
		}
	}
	if killed == 0 {
		t.Fatal("no run was killed: the test proves nothing")
	}
	if out, err := node.TryExec(bin, "apply", "--once", "-c", cfg); err != nil {
		t.Fatalf("apply after %d kills: %v\n%s", killed, err, out)
	}
	if out := node.Exec(t, bin, "apply", "--once", "-c", cfg); !strings.Contains(out, "no changes") {
		t.Fatalf("not converged after the kills; the next apply did:\n%s", out)
	}
	for _, check := range []struct {
		what string
		got  int
		want int
	}{
		// every shim exists once and is marked; none is left half-made
		{"marked macvlans", strings.Count(node.Exec(t, "ip", "-d", "link", "show", "type", "macvlan"), "alias nodeagent"), 60},
		{"links still in creation", strings.Count(node.Exec(t, "ip", "-d", "link", "show"), "group 0x6e610001"), 0},
		{"IPv4 routes in table 150", lines(t, node, "ip", "-4", "route", "show", "table", "150", "proto", "147"), 61}, // 60 + kill switch
		{"IPv6 routes in table 150", lines(t, node, "ip", "-6", "route", "show", "table", "150", "proto", "147"), 1},
		{"rules", strings.Count(node.Exec(t, "ip", "-d", "rule", "show"), "proto 147"), 60},
		{"nodeagent tables", strings.Count(node.Exec(t, "nft", "list", "tables"), "table inet nodeagent"), 1},
	} {
		if check.got != check.want {
			t.Errorf("%s: %d, want %d", check.what, check.got, check.want)
		}
	}
	if diff := cmp.Diff(before, foreign()); diff != "" {
		t.Fatalf("foreign objects changed (-before +after):\n%s", diff)
	}
	t.Logf("%d runs killed with SIGKILL mid-apply; converged after", killed)
}

// TestValidateAndPlanWithoutRoot runs validate and plan as nobody: both
// work, and plan says which part the kernel would not show.
func TestValidateAndPlanWithoutRoot(t *testing.T) {
	bin, dir := asNobody(t)
	cfg := exampleWithFiles(t, dir)
	for _, args := range [][]string{{"validate"}, {"plan"}} {
		line := fmt.Sprintf("%s %s -c %s --rt-tables ''", bin, args[0], cfg)
		out, err := exec.Command("su", "nobody", "-s", "/bin/sh", "-c", line).CombinedOutput()
		if err != nil {
			t.Fatalf("%s as nobody: %v\n%s", args[0], err, out)
		}
		// The key files are root's and private: not read, and said so.
		if args[0] == "validate" && !strings.Contains(string(out), "wireguard[1].privateKeyFile: "+dir+"/etc/keys/wg0.key cannot be read: permission denied; not checked") {
			t.Fatalf("validate as nobody:\n%s", out)
		}
		if args[0] == "plan" && (!strings.Contains(string(out), "not readable without root") || !strings.Contains(string(out), "! wireguard wg0: private key:")) {
			t.Fatalf("plan as nobody:\n%s", out)
		}
	}
}

// TestKillNineDaemon kills `nodeagent run` with SIGKILL at 20 random points
// of a cold converge (each start from a torn-down node, each delay drawn
// within the time a full converge takes), then lets one run converge: no
// duplicate or half-made object, foreign objects untouched.
func TestKillNineDaemon(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this; under TCG the kill points would say little about the real timing")
	}
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "wire0")
	bin := binary(t)
	dir := t.TempDir()
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
	node.Exec(t, "ip", "link", "add", "link", "trunk0", "name", "podshim", "type", "macvlan", "mode", "bridge")
	node.Exec(t, "ip", "rule", "add", "priority", "2001", "from", "10.20.0.0/16", "lookup", "200", "proto", "static")
	foreign := func() string {
		return node.Exec(t, "ip", "-d", "link", "show", "podshim") + withoutOurs(node.Exec(t, "ip", "-d", "rule", "show", "priority", "2001"))
	}
	before := foreign()
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(killConfig(60)), 0o600)
	socket := filepath.Join(dir, "s.sock")
	start := func() *exec.Cmd {
		cmd := exec.Command("ip", "netns", "exec", node.Name, bin, "run", "-c", cfg, "--socket", socket)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	ready := func(timeout time.Duration) bool {
		c := api.NewClient(socket)
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := c.Status(ctx)
			cancel()
			if err == nil && s.Ready {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	}
	// How long a cold converge takes, start to ready.
	t0 := time.Now()
	cmd := start()
	if !ready(60 * time.Second) {
		cmd.Process.Kill()
		t.Fatal("the daemon never became ready")
	}
	full := time.Since(t0)
	cmd.Process.Kill()
	cmd.Wait()
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("cold converge to ready: %s; kill points drawn in [0, %s) with seed %d", full, full, seed)
	const kills = 20
	for i := 0; i < kills; i++ {
		node.TryExec(bin, "teardown")
		cmd := start()
		time.Sleep(time.Duration(rng.Int64N(int64(full))))
		cmd.Process.Kill()
		cmd.Wait()
	}
	cmd = start()
	if !ready(60 * time.Second) {
		cmd.Process.Kill()
		t.Fatalf("not ready after %d kills", kills)
	}
	// DESIGN.md §8: RSS <= 40 MiB steady. ip netns exec execs the daemon,
	// so the pid is the daemon's.
	time.Sleep(2 * time.Second)
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(l, "VmRSS:") || strings.HasPrefix(l, "VmHWM:") {
				t.Logf("daemon with 60 macvlans, 60 routes, 60 rules and the nft table, steady: %s", strings.Join(strings.Fields(l), " "))
			}
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if out := node.Exec(t, bin, "apply", "--once", "-c", cfg); !strings.Contains(out, "no changes") {
		t.Fatalf("not converged after the kills; apply did:\n%s", out)
	}
	for _, check := range []struct {
		what      string
		got, want int
	}{
		{"marked macvlans", strings.Count(node.Exec(t, "ip", "-d", "link", "show", "type", "macvlan"), "alias nodeagent"), 60},
		{"links still in creation", strings.Count(node.Exec(t, "ip", "-d", "link", "show"), "group 0x6e610001"), 0},
		{"IPv4 routes in table 150", lines(t, node, "ip", "-4", "route", "show", "table", "150", "proto", "147"), 61},
		{"rules", strings.Count(node.Exec(t, "ip", "-d", "rule", "show"), "proto 147"), 60},
		{"nodeagent tables", strings.Count(node.Exec(t, "nft", "list", "tables"), "table inet nodeagent"), 1},
	} {
		if check.got != check.want {
			t.Errorf("%s: %d, want %d", check.what, check.got, check.want)
		}
	}
	if diff := cmp.Diff(before, foreign()); diff != "" {
		t.Fatalf("foreign objects changed (-before +after):\n%s", diff)
	}
}

// asNobody skips unless the test can run commands as nobody (root, su);
// it returns the binary and a directory outside the test's private
// temporary tree (which nobody cannot enter), both readable by nobody.
func asNobody(t *testing.T) (bin, dir string) {
	t.Helper()
	testenv.RequireRoot(t) // to become nobody
	if _, err := exec.LookPath("su"); err != nil {
		t.Skip("needs su to run as nobody")
	}
	bin = binary(t)
	dir, err := os.MkdirTemp("", "nodeagent-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, p := range []string{dir, filepath.Dir(bin)} {
		os.Chmod(p, 0o755)
	}
	return bin, dir
}
