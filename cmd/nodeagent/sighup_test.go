package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestSIGHUPWhileStarting: SIGHUPs every 2 ms from the daemon's first
// moments (an operator's `pkill -HUP nodeagent` as it restarts) until it is
// ready and for a second after: it never dies of one, becomes ready and
// stops cleanly at SIGTERM. The soak found it (seed 24239155: a SIGHUP
// storm just after a kill -9 and restart): SIGHUP's default action ends a
// Go program, and the daemon listened for it only once Run began, after
// its config read and set-up. The storm begins as the process's
// initialisation reaches internal/earlyhup (GODEBUG=inittrace=1 says when),
// about 5 ms after exec here; a build without it gets the storm 20 ms after
// exec.
func TestSIGHUPWhileStarting(t *testing.T) {
	testenv.RequireRoot(t)
	if testenv.InVM() {
		t.Skip("the host tier runs this: it needs only a namespace")
	}
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "wire0")
	bin := binary(t)
	dir := t.TempDir()
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
	cfg := filepath.Join(dir, "nodeagent.yaml")
	if err := os.WriteFile(cfg, []byte(killConfig(5)), 0o600); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "s.sock")
	cmd := exec.Command("ip", "netns", "exec", node.Name, bin, "run", "-c", cfg, "--socket", socket)
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first inittrace line: the daemon's own process runs (ip netns
	// exec has exec'd it); the earlyhup line: SIGHUP is caught from now.
	first, hooked := make(chan struct{}), make(chan struct{})
	var logMu sync.Mutex
	var log []string
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		n := 0
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, "init ") {
				if n++; n == 1 {
					close(first)
				}
				if strings.Contains(l, "/earlyhup ") {
					close(hooked)
				}
				continue
			}
			logMu.Lock()
			log = append(log, l)
			logMu.Unlock()
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tail := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return strings.Join(log[max(0, len(log)-15):], "\n")
	}
	select {
	case <-first:
	case err := <-exited:
		t.Fatalf("the daemon exited before its initialisation: %v\n%s", err, tail())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("no initialisation trace from the daemon in 30 s")
	}
	from := "its earlyhup init"
	select {
	case <-hooked:
	case <-time.After(20 * time.Millisecond):
		from = "20 ms after its first init"
	}

	c := api.NewClient(socket)
	isReady := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		s, err := c.Status(ctx)
		return err == nil && s.Ready
	}
	t0 := time.Now()
	sent, readyAt := 0, time.Duration(0)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	lastCheck := time.Time{}
	for readyAt == 0 || time.Since(t0) < readyAt+time.Second {
		select {
		case err := <-exited:
			t.Fatalf("the daemon died after %d SIGHUPs in %s: %v\n%s", sent, time.Since(t0).Round(time.Millisecond), err, tail())
		case <-tick.C:
		}
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatalf("SIGHUP %d: %v", sent+1, err)
		}
		sent++
		if readyAt == 0 && time.Since(lastCheck) > 50*time.Millisecond {
			lastCheck = time.Now()
			if isReady() {
				readyAt = time.Since(t0)
			}
		}
		if time.Since(t0) > 60*time.Second {
			cmd.Process.Kill()
			t.Fatalf("not ready 60 s into the SIGHUPs (%d sent)\n%s", sent, tail())
		}
	}
	t.Logf("%d SIGHUPs from %s on; ready %s into them, and a second more of them", sent, from, readyAt.Round(time.Millisecond))
	if !isReady() {
		t.Errorf("not ready after the SIGHUPs\n%s", tail())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the daemon's exit at SIGTERM: %v\n%s", err, tail())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the daemon did not stop at SIGTERM")
	}
}
