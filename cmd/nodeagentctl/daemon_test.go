package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/agent"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/hazard"
	"github.com/nodeagent/nodeagent/testenv"
)

// asCtl makes the test binary act as nodeagentctl, so it can run as
// another user.
const asCtl = "NODEAGENTCTL_TEST_AS_MAIN"

// asHog makes the test binary a client that opens connections to the
// socket it names and holds them idle.
const asHog = "NODEAGENTCTL_TEST_HOG"

func TestMain(m *testing.M) {
	if os.Getenv(asCtl) == "1" {
		main()
	}
	if socket := os.Getenv(asHog); socket != "" {
		hog(socket, 64)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hog opens n connections to socket, sends one keep-alive request on each
// and keeps every connection the server answered with 200 open and idle.
// It prints "accepted A refused R", then "closed C" once it sees how many
// the server closed within 8 seconds, and exits.
func hog(socket string, n int) {
	var conns []net.Conn
	refused := 0
	for range n {
		c, err := net.Dial("unix", socket)
		if err != nil {
			refused++
			continue
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /v1/status HTTP/1.1\r\nHost: nodeagent\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			refused++
			c.Close()
			continue
		}
		io.Copy(io.Discard, resp.Body)
		conns = append(conns, c)
	}
	fmt.Printf("accepted %d refused %d\n", len(conns), refused)
	os.Stdout.Sync()
	closed := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(8 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	fmt.Printf("closed %d\n", closed)
}

// testDaemon runs a daemon on cfg in node, serving socket (group
// nogroup), until stop is called or the test ends.
func testDaemon(t *testing.T, node *testenv.NetNS, cfg, socket, version string) (*agent.Daemon, func()) {
	t.Helper()
	return runDaemon(t, agent.RunOptions{
		Options: agent.Options{Config: cfg, TablesFile: filepath.Join(filepath.Dir(cfg), "rt.conf")},
		Socket:  socket, SocketGroup: "nogroup", Host: node.Host, Resync: time.Hour, Version: version,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		// No networkd, whatever runs on the machine: the golden status
		// does not depend on it.
		Hazards: hazard.Paths{Root: t.TempDir()}, HazardSystem: &hazard.System{},
	})
}

// runDaemon runs a daemon with o until stop is called or the test ends.
func runDaemon(t *testing.T, o agent.RunOptions) (*agent.Daemon, func()) {
	t.Helper()
	d, err := agent.NewDaemon(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return d, stop
}

// ctlAt runs nodeagentctl, in this process, against socket.
func ctlAt(socket string) func(args ...string) (int, string) {
	return func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		c := &cli{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }, now: time.Now, poll: 20 * time.Millisecond}
		code := c.run(context.Background(), append([]string{"--socket", socket}, args...))
		return code, out.String() + errb.String()
	}
}

// TestAgainstTheDaemon runs nodeagentctl against a real daemon converging a
// namespace: status exits 0 when ready, 1 when degraded (a rejected
// reload), 2 when the daemon is gone; -o json decodes into the API type the
// daemon serves; a caller that is not root (nobody, in the socket's group)
// reads status but is refused reload with 403.
func TestAgainstTheDaemon(t *testing.T) {
	node := testenv.NewNetNS(t)
	peer := testenv.NewNetNS(t)
	node.Veth(t, "enp1s0", peer, "eth0")
	// Under /tmp itself, not t.TempDir (whose parent is 0700): nobody must
	// reach the socket and the binary.
	dir, err := os.MkdirTemp("", "nodeagentctl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	cfg := filepath.Join(dir, "nodeagent.yaml")
	good := "dad: {disabled: true}\nmacvlans:\n  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}\nfirewall:\n  masquerade: [{from: 10.10.50.0/24, out: enp1s0}]\n"
	os.WriteFile(cfg, []byte(good), 0o644)
	socket := filepath.Join(dir, "nodeagent.sock")
	d, stop := testDaemon(t, node, cfg, socket, "")
	ctl := ctlAt(socket)
	if code, out := ctl("wait", "--for=ready", "--timeout=30s"); code != 0 {
		t.Fatalf("wait --for=ready: exit %d\n%s", code, out)
	}
	code, out := ctl("status")
	if code != 0 || !strings.Contains(out, "ready") {
		t.Errorf("status when ready: exit %d\n%s", code, out)
	}
	// -o json is the API struct, exactly.
	var got api.Status
	for i := 0; i < 3; i++ {
		code, out = ctl("status", "-o", "json")
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("status -o json (exit %d) does not decode: %v\n%s", code, err, out)
		}
		want := d.Status()
		roundTrip, _ := json.Marshal(want)
		var w api.Status
		json.Unmarshal(roundTrip, &w)
		if diff := cmp.Diff(w, got); diff == "" {
			break
		} else if i == 2 {
			t.Errorf("status -o json differs from the daemon's status (-daemon +ctl):\n%s", diff)
		}
	}
	// nobody, in the socket's group: reads work, reload is refused.
	self, _ := os.Executable()
	bin := filepath.Join(dir, "nodeagentctl")
	b, _ := os.ReadFile(self)
	os.WriteFile(bin, b, 0o755)
	asNobody := func(args ...string) (int, string) {
		cmd := exec.Command(bin, append([]string{"--socket", socket}, args...)...)
		cmd.Env = append(os.Environ(), asCtl+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatalf("run as nobody: %v", err)
		}
		return 0, string(out)
	}
	if code, out := asNobody("status"); code != 0 {
		t.Errorf("status as nobody: exit %d\n%s", code, out)
	}
	if code, out := asNobody("reload"); code != 1 || !strings.Contains(out, "403") || !strings.Contains(out, "reload needs root") {
		t.Errorf("reload as nobody: exit %d, want 1 and a 403\n%s", code, out)
	}
	// Degraded: a broken config is rejected, the daemon keeps running.
	os.WriteFile(cfg, []byte(strings.Replace(good, "10.10.50.3/24", "10.10.50.300/24", 1)), 0o644)
	code, out = ctl("reload")
	if code != 1 || !strings.Contains(out, cfg+":3:") {
		t.Errorf("reload of a broken config: exit %d, want 1 naming %s:3\n%s", code, cfg, out)
	}
	if code, out := ctl("status"); code != 1 || !strings.Contains(out, "degraded") {
		t.Errorf("status when degraded: exit %d\n%s", code, out)
	}
	if code, out := ctl("wait", "--for=condition/ConfigLoaded", "--timeout=300ms"); code != 1 || !strings.Contains(out, "timed out") {
		t.Errorf("wait for a condition that does not come: exit %d\n%s", code, out)
	}
	os.WriteFile(cfg, []byte(good), 0o644)
	if code, out := ctl("reload"); code != 0 {
		t.Errorf("reload of the fixed config: exit %d\n%s", code, out)
	}
	if code, out := ctl("status"); code != 0 {
		t.Errorf("status after the fix: exit %d\n%s", code, out)
	}
	// Unreachable.
	stop()
	if code, out := ctl("status"); code != 2 || !strings.Contains(out, "cannot reach nodeagent") {
		t.Errorf("status with the daemon gone: exit %d\n%s", code, out)
	}
}

// TestIdleConnectionsDoNotLockOutRoot: 64 idle keep-alive connections from
// uid 65534 (in the socket's group) do not keep root's status and reload
// from answering within a second; the uid gets its share and no more, and
// its idle connections are closed after a few seconds.
func TestIdleConnectionsDoNotLockOutRoot(t *testing.T) {
	node := testenv.NewNetNS(t)
	dir, err := os.MkdirTemp("", "nodeagentctl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte("sysctls: {net.ipv4.conf.lo.forwarding: \"0\"}\n"), 0o644)
	socket := filepath.Join(dir, "nodeagent.sock")
	testDaemon(t, node, cfg, socket, "")
	c := api.NewClient(socket)
	waitCtx, waitCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer waitCancel()
	for {
		if s, err := c.Status(waitCtx); err == nil && s.Ready {
			break
		} else if waitCtx.Err() != nil {
			t.Fatalf("not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.CloseIdleConnections()

	self, _ := os.Executable()
	bin := filepath.Join(dir, "hog")
	b, _ := os.ReadFile(self)
	os.WriteFile(bin, b, 0o755)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), asHog+"="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatal("the hog said nothing")
	}
	var accepted, refused int
	fmt.Sscanf(lines.Text(), "accepted %d refused %d", &accepted, &refused)
	t.Logf("uid 65534 opened 64 connections: %d accepted and held idle, %d refused", accepted, refused)
	// Control: the hog really holds connections.
	if accepted == 0 || accepted+refused != 64 {
		t.Fatalf("hog: %q", lines.Text())
	}
	if accepted > 8 {
		t.Errorf("one uid holds %d connections; want at most 8", accepted)
	}
	for _, call := range []struct {
		name string
		do   func(context.Context) error
	}{
		{"status", func(ctx context.Context) error { _, err := c.Status(ctx); return err }},
		{"reload", func(ctx context.Context) error { _, err := c.Reload(ctx); return err }},
		{"status again", func(ctx context.Context) error { _, err := c.Status(ctx); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		err := call.do(ctx)
		cancel()
		t.Logf("root's %s with the hog's connections open: %.1f ms", call.name, float64(time.Since(start).Microseconds())/1000)
		if err != nil {
			t.Errorf("root's %s: %v", call.name, err)
		}
	}
	if !lines.Scan() {
		t.Fatal("the hog did not report the closes")
	}
	var closed int
	fmt.Sscanf(lines.Text(), "closed %d", &closed)
	if closed != accepted {
		t.Errorf("the server closed %d of the %d idle connections within 8s; want all (idle timeout 5s)", closed, accepted)
	}
}
