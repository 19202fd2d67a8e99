package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// TestPIAKillNineAndRestart: `kill -9` the daemon of a healthy PIA tunnel
// and start it again, then stop it cleanly and start it again: no new
// addKey either time (counted at the stub), and with the kernel's
// WireGuard the device keeps its ifindex and its session (the handshake
// goes on, traffic flows while no daemon runs). `teardown` then removes
// the device and forgets the registration.
func TestPIAKillNineAndRestart(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	bin := binary(t)
	socket := filepath.Join(l.Dir, "s.sock")
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(l.Dir, "rt_tables.conf"))
	start := func() *exec.Cmd {
		cmd := exec.Command("ip", "netns", "exec", l.Node.Name, bin, "run", "-c", l.Config, "--socket", socket, "--state-dir", l.StateDir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
		return cmd
	}
	healthy := func(what string) (api.PIATunnel, time.Duration) {
		t.Helper()
		c := api.NewClient(socket)
		t0 := time.Now()
		for time.Since(t0) < 60*time.Second {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := c.Status(ctx)
			cancel()
			if err == nil && len(s.PIA) == 1 && s.PIA[0].Healthy {
				return s.PIA[0], time.Since(t0)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s: the tunnel did not become healthy within 60s", what)
		return api.PIATunnel{}, 0
	}
	index := func() int {
		t.Helper()
		link, err := l.Node.NL.LinkByName(l.Dev)
		if err != nil {
			return -1
		}
		return link.Attrs().Index
	}

	t0 := time.Now()
	cmd := start()
	first, _ := healthy("first start")
	t.Logf("nodeagent run start -> tunnel healthy: %s", time.Since(t0).Round(time.Millisecond))
	kernel := strings.Contains(l.Node.Exec(t, "ip", "-d", "link", "show", l.Dev), "wireguard")
	idx := index()
	if !l.PingFar() {
		t.Fatal("no traffic through the tunnel")
	}
	for _, stop := range []struct {
		name string
		sig  syscall.Signal
	}{{"kill -9", syscall.SIGKILL}, {"clean stop", syscall.SIGTERM}} {
		cmd.Process.Signal(stop.sig)
		cmd.Wait()
		if kernel {
			if got := index(); got != idx {
				t.Fatalf("%s: the device's index %d -> %d", stop.name, idx, got)
			}
			if !l.PingFar() {
				t.Errorf("%s: no traffic through the tunnel while no daemon runs", stop.name)
			}
		}
		t0 = time.Now()
		cmd = start()
		tu, _ := healthy("after " + stop.name)
		t.Logf("%s, start again -> tunnel healthy: %s (kernel WireGuard %v)", stop.name, time.Since(t0).Round(time.Millisecond), kernel)
		if n := l.Stub.AddKeys(); n != 1 {
			t.Errorf("%s: %d addKey requests, want 1 (the registration re-adopted)", stop.name, n)
		}
		if tu.PeerIP != first.PeerIP || !tu.RegisteredSince.Equal(*first.RegisteredSince) {
			t.Errorf("%s: registration %+v, want the first one %+v", stop.name, tu, first)
		}
		if kernel && index() != idx {
			t.Errorf("%s: the device was recreated", stop.name)
		}
		if !l.PingFar() {
			t.Errorf("%s: no traffic through the tunnel after the restart", stop.name)
		}
	}
	l.NoLeaks(t, "kill -9 and restarts")

	// State on disk: private, in a private directory.
	for _, p := range []string{filepath.Join(l.StateDir, "pia"), filepath.Join(l.StateDir, "pia", l.Dev+".json"), filepath.Join(l.StateDir, "pia", l.Dev+".key")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %v; want nothing for group and others", p, fi.Mode().Perm())
		}
	}

	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	out := l.Node.Exec(t, bin, "teardown", "--state-dir", l.StateDir, "--socket", socket)
	// (A userspace device ended with the daemon that ran it.)
	if kernel && !strings.Contains(out, "- wireguard "+l.Dev) || index() != -1 {
		t.Errorf("teardown did not remove the device:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(l.StateDir, "pia", l.Dev+".json")); !os.IsNotExist(err) {
		t.Errorf("teardown left the registration: %v", err)
	}
}
