package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
	os.Exit(m.Run())
}

// binary builds nodeagent once per test run. In the VM it is a script that
// runs this test binary as nodeagent.
func binary(t *testing.T) string {
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
	testenv.RequireRoot(t) // to become nobody
	if _, err := exec.LookPath("su"); err != nil {
		t.Skip("needs su to run as nobody")
	}
	bin := binary(t)
	dir, err := os.MkdirTemp("", "nodeagent-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, p := range []string{dir, filepath.Dir(bin)} {
		os.Chmod(p, 0o755)
	}
	cfg := filepath.Join(dir, "nodeagent.yaml")
	example, err := os.ReadFile("../../examples/homelab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(cfg, example, 0o644)
	for _, args := range [][]string{{"validate"}, {"plan"}} {
		line := fmt.Sprintf("%s %s -c %s --rt-tables ''", bin, args[0], cfg)
		out, err := exec.Command("su", "nobody", "-s", "/bin/sh", "-c", line).CombinedOutput()
		if err != nil {
			t.Fatalf("%s as nobody: %v\n%s", args[0], err, out)
		}
		if args[0] == "plan" && (!strings.Contains(string(out), "not readable without root") || !strings.Contains(string(out), "wireguard pia (1): not converged by this build")) {
			t.Fatalf("plan as nobody:\n%s", out)
		}
	}
}
