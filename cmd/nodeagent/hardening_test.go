package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestTenSimultaneousStarts: ten `nodeagent run` started at once on one
// node: exactly one runs, and the nine others exit 1 naming its pid.
func TestTenSimultaneousStarts(t *testing.T) {
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "wire0")
	bin := binary(t)
	dir := t.TempDir()
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
	t.Setenv("NODEAGENT_LOCK", filepath.Join(dir, "run", "nodeagent.lock"))
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(killConfig(3)), 0o600)
	type started struct {
		cmd    *exec.Cmd
		stderr *bytes.Buffer
		done   chan error
	}
	var all []*started
	for i := range 10 {
		// Each its own socket: only the lock keeps them apart.
		s := &started{stderr: &bytes.Buffer{}, done: make(chan error, 1)}
		s.cmd = exec.Command("ip", "netns", "exec", node.Name, bin, "run", "-c", cfg, "--socket", filepath.Join(dir, fmt.Sprintf("s%d.sock", i)))
		s.cmd.Stderr = s.stderr
		all = append(all, s)
	}
	for _, s := range all {
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range all {
		go func() { s.done <- s.cmd.Wait() }()
	}
	t.Cleanup(func() {
		for _, s := range all {
			s.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, s := range all {
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				s.cmd.Process.Kill()
			}
		}
	})
	var running []*started
	var refused []string
	deadline := time.After(30 * time.Second)
	for _, s := range all {
		select {
		case err := <-s.done:
			s.done <- err
			code := -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			if code != 1 {
				t.Errorf("a refused start exited %d (%v); want 1\n%s", code, err, s.stderr)
			}
			refused = append(refused, s.stderr.String())
		case <-time.After(3 * time.Second):
			running = append(running, s)
		case <-deadline:
			t.Fatal("timed out")
		}
	}
	if len(running) != 1 {
		t.Fatalf("%d daemons kept running; want exactly 1", len(running))
	}
	pid := running[0].cmd.Process.Pid // ip netns exec execs the daemon
	want := fmt.Sprintf("(pid %d, run)", pid)
	for _, e := range refused {
		if !strings.Contains(e, "another nodeagent holds") || !strings.Contains(e, want) {
			t.Errorf("refusal %q does not name the running daemon %s", strings.TrimSpace(e), want)
		}
	}
	t.Logf("one of ten ran (pid %d); the nine others said: %s", pid, strings.TrimSpace(refused[0]))
	// apply --once, teardown and release are refused too while it runs,
	// with the fix named.
	for _, args := range [][]string{{"apply", "--once", "-c", cfg}, {"teardown"}, {"release", "-c", cfg}} {
		out, err := node.TryExec(append([]string{bin}, args...)...)
		if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "stop it first: systemctl stop nodeagent") {
			t.Errorf("%s while the daemon runs: %v\n%s", args[0], err, out)
		}
	}
}

// rss returns a process's resident set in KiB.
func rss(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmHWM in /proc/%d/status", pid)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestErrorCapsBoundTheDaemon: thirty peer files of YAML aliases (each
// thousands of errors uncapped) and then a config that expands to a
// million errors: the daemon's peak RSS stays under 100 MiB and its status
// under 1 MiB.
func TestErrorCapsBoundTheDaemon(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this")
	}
	node := testenv.NewNetNS(t)
	bin := binary(t)
	dir := t.TempDir()
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
	t.Setenv("NODEAGENT_LOCK", filepath.Join(dir, "nodeagent.lock"))
	peers := filepath.Join(dir, "peers.d")
	os.Mkdir(peers, 0o755)
	k, _ := wgtypes.GeneratePrivateKey()
	key := filepath.Join(dir, "wg.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o600)
	var alias strings.Builder
	alias.WriteString("publicKey: " + k.PublicKey().String() + "\nx: &a 1\n")
	for i := 0; alias.Len() < 64<<10-40; i++ {
		fmt.Fprintf(&alias, "k%d: *a\n", i)
	}
	for i := range 30 {
		os.WriteFile(filepath.Join(peers, fmt.Sprintf("alias%02d.yaml", i)), []byte(alias.String()), 0o600)
	}
	cfg := filepath.Join(dir, "nodeagent.yaml")
	good := fmt.Sprintf("wireguard:\n  - name: %s\n    privateKeyFile: %s\n    listenPort: 51820\n    peersDir: %s\n", "wgcap"+node.Name[len(node.Name)-4:], key, peers)
	os.WriteFile(cfg, []byte(good), 0o600)
	socket := filepath.Join(dir, "s.sock")
	cmd := exec.Command("ip", "netns", "exec", node.Name, bin, "run", "-c", cfg, "--socket", socket)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("daemon log (%d bytes), first 4 KiB:\n%.4096s", stderr.Len(), stderr.String())
		}
	}()
	c := api.NewClient(socket)
	status := func() (api.Status, int) {
		var s *api.Status
		var err error
		for range 200 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s, err = c.Status(ctx)
			cancel()
			if err == nil && s.LastSync != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		b, _ := json.Marshal(s)
		return *s, len(b)
	}
	s, size := status()
	lines := 0
	for _, o := range s.Skipped {
		lines += strings.Count(o.Message, "\n") + 1
	}
	t.Logf("30 alias files: status %d bytes, %d skipped entries; peak RSS %d KiB", size, len(s.Skipped), rss(t, cmd.Process.Pid))
	if size > 1<<20 {
		t.Errorf("status is %d bytes with 30 alias files; want < 1 MiB", size)
	}
	if !s.Ready || !s.Degraded {
		t.Errorf("ready %v degraded %v; want ready (the device works) and degraded", s.Ready, s.Degraded)
	}
	// A config that expands to a million errors, loaded by a reload: it
	// is rejected, within the caps.
	var b strings.Builder
	b.WriteString(good + "x: &a {")
	for i := range 330 {
		fmt.Fprintf(&b, "u%d: 1, ", i)
	}
	b.WriteString("u: 1}\nvlans: [*a")
	for range 3029 {
		b.WriteString(",*a")
	}
	b.WriteString("]\n")
	os.WriteFile(cfg+".new", []byte(b.String()), 0o600)
	os.Rename(cfg+".new", cfg)
	for i := 0; ; i++ {
		s, size = status()
		if s.LastRejected != nil {
			break
		}
		if i > 200 {
			t.Fatal("the million-error config was not rejected")
		}
		time.Sleep(50 * time.Millisecond)
	}
	peak := rss(t, cmd.Process.Pid)
	t.Logf("%d-byte config of a million errors: rejected with %d lines (last %q); status %d bytes; peak RSS %d KiB; log %d bytes",
		b.Len(), len(s.LastRejected.Errors), s.LastRejected.Errors[len(s.LastRejected.Errors)-1], size, peak, stderr.Len())
	if len(s.LastRejected.Errors) > 21 || size > 1<<20 {
		t.Errorf("rejection: %d lines, status %d bytes", len(s.LastRejected.Errors), size)
	}
	if peak > 100<<10 {
		t.Errorf("peak RSS %d KiB; want < 100 MiB", peak)
	}
	if stderr.Len() > 1<<20 {
		t.Errorf("the daemon logged %d bytes", stderr.Len())
	}
}

// TestOneShotCommandsStopOnSignal: apply --once, waiting in duplicate
// address detection, stops on SIGINT and on SIGTERM.
func TestOneShotCommandsStopOnSignal(t *testing.T) {
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "wire0")
	bin := binary(t)
	dir := t.TempDir()
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
	t.Setenv("NODEAGENT_LOCK", filepath.Join(dir, "nodeagent.lock"))
	cfg := filepath.Join(dir, "nodeagent.yaml")
	// DAD that takes half a minute: three probes ten seconds apart, then 10s.
	os.WriteFile(cfg, []byte("dad: {probes: 3, interval: 10s, wait: 10s}\nmacvlans:\n  - {name: m1, parent: trunk0, addresses: [10.60.1.1/24]}\n"), 0o600)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		cmd := exec.Command("ip", "netns", "exec", node.Name, bin, "apply", "--once", "-c", cfg)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		time.Sleep(time.Second)
		select {
		case err := <-done:
			t.Fatalf("apply --once ended before the signal (DAD should take half a minute): %v\n%s", err, out.String())
		default:
		}
		sent := time.Now()
		cmd.Process.Signal(sig)
		select {
		case err := <-done:
			took := time.Since(sent)
			t.Logf("%v: apply --once stopped %.0f ms after the signal: %v", sig, float64(took.Milliseconds()), err)
			if err == nil {
				t.Errorf("%v: apply --once exited 0 after being interrupted", sig)
			}
		case <-time.After(8 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v: apply --once did not stop within 8s\n%s", sig, out.String())
		}
		node.TryExec(bin, "teardown")
	}
}
