package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
)

// hostState is what the demo must leave as it found it on the host. Tests
// of other packages may run beside it and make namespaces and userspace
// WireGuard sockets of their own: only the demo's names count (na-demo-*,
// its devices).
func hostState(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, args := range map[string][]string{
		"namespaces": {"ip", "netns", "list"},
		"links":      {"ip", "-o", "link", "show"},
		"addresses":  {"ip", "-o", "addr", "show"},
		"rules":      {"ip", "rule", "show"},
		"routes":     {"ip", "route", "show", "table", "all"},
		"nftables":   {"nft", "list", "tables"},
	} {
		b, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, b)
		}
		out[name] = string(b)
	}
	var ours []string
	for _, l := range strings.Split(out["namespaces"], "\n") {
		if strings.HasPrefix(l, "na-demo-") {
			ours = append(ours, l)
		}
	}
	out["namespaces"] = strings.Join(ours, "\n")
	ents, _ := os.ReadDir("/var/run/wireguard")
	var socks []string
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, "dsrv") || strings.HasPrefix(n, "wgc-") || strings.HasSuffix(n, "-demo.sock") {
			socks = append(socks, n)
		}
	}
	out["wireguard sockets"] = strings.Join(socks, " ")
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "nodeagent-demo-*"))
	out["temporary directories"] = strings.Join(dirs, " ")
	return out
}

// build builds nodeagent, nodeagentctl and the demo into a directory of
// the test's.
func build(t *testing.T) string {
	bin := t.TempDir()
	for pkg, out := range map[string]string{"../../cmd/nodeagent": "nodeagent", "../../cmd/nodeagentctl": "nodeagentctl", ".": "demo"} {
		if b, err := exec.Command("go", "build", "-o", filepath.Join(bin, out), pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	return bin
}

// TestDemo runs `make demo`'s program twice, as a user would, with the
// real binaries: every check passes both times, and afterwards no
// process, namespace, link, address, rule, route, nft table, socket or
// file of it is left on the host.
func TestDemo(t *testing.T) {
	testenv.RequireRoot(t)
	if testenv.InVM() {
		t.Skip("the host tier runs the demo")
	}
	bin := build(t)
	before := hostState(t)
	for run := 1; run <= 2; run++ {
		start := time.Now()
		cmd := exec.Command(filepath.Join(bin, "demo"), "--nodeagent", filepath.Join(bin, "nodeagent"))
		out, err := cmd.CombinedOutput()
		t.Logf("run %d (%s):\n%s", run, time.Since(start).Round(100*time.Millisecond), out)
		if err != nil {
			t.Errorf("run %d: %v", run, err)
		}
		if n := strings.Count(string(out), "✗"); n > 0 || !strings.Contains(string(out), "checks passed") {
			t.Errorf("run %d: %d checks failed", run, n)
		}
		if strings.Contains(string(out), "\033[") {
			t.Errorf("run %d: terminal escapes in output that is not a terminal", run)
		}
		if procs, _ := exec.Command("pgrep", "-f", bin).Output(); len(procs) > 0 {
			t.Errorf("run %d left processes: %s", run, procs)
		}
		after := hostState(t)
		for k, v := range before {
			if after[k] != v {
				t.Errorf("run %d changed the host's %s:\nbefore:\n%s\nafter:\n%s", run, k, v, after[k])
			}
		}
	}
}

// TestDemoInterrupted: Ctrl-C half-way cleans up as well.
func TestDemoInterrupted(t *testing.T) {
	testenv.RequireRoot(t)
	if testenv.InVM() {
		t.Skip("the host tier runs the demo")
	}
	bin := build(t)
	before := hostState(t)
	cmd := exec.Command(filepath.Join(bin, "demo"), "--nodeagent", filepath.Join(bin, "nodeagent"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Interrupt once the daemon runs (the PIA step has begun).
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "the PIA tunnel") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Errorf("interrupted demo: %v, want exit 130\n%s", err, out.String())
	}
	if procs, _ := exec.Command("pgrep", "-f", bin).Output(); len(procs) > 0 {
		t.Errorf("left processes: %s", procs)
	}
	after := hostState(t)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("the interrupted demo changed the host's %s:\nbefore:\n%s\nafter:\n%s", k, v, after[k])
		}
	}
}
