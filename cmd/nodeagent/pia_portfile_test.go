package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// TestPIATeardownRemovesPortFile (issue 29 §3): the forwarded port's file
// beside the socket (pia/DEV.port) outlived `nodeagent teardown`, so a
// reader took a port that reached nothing. The daemon binary forwards a
// port and writes the file; after a clean stop and teardown (with the
// same --socket) the file is gone.
func TestPIATeardownRemovesPortFile(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.PIA = "      portForward: true"
	l.WriteConfig(t, "stub_ams")
	bin := binary(t)
	socket := filepath.Join(l.Dir, "run", "s.sock")
	os.MkdirAll(filepath.Dir(socket), 0o755)
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(l.Dir, "rt_tables.conf"))
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
	file := filepath.Join(filepath.Dir(socket), "pia", l.Dev+".port")
	c := api.NewClient(socket)
	port := 0
	for t0 := time.Now(); port == 0 && time.Since(t0) < 90*time.Second; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := c.Status(ctx)
		cancel()
		if err == nil && len(s.PIA) == 1 && s.PIA[0].ForwardedPort != 0 {
			if b, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(s.PIA[0].ForwardedPort) {
				port = s.PIA[0].ForwardedPort
			}
		}
	}
	if port == 0 {
		t.Fatal("no forwarded port in status and in the port file within 90s")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the port file went with the daemon's stop (%v): teardown is not what is tested", err)
	}
	out, err := exec.Command("ip", "netns", "exec", l.Node.Name, bin, "teardown", "--socket", socket, "--state-dir", l.StateDir).CombinedOutput()
	if err != nil {
		t.Fatalf("teardown: %v\n%s", err, out)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("teardown left the port file %s (%v)", file, err)
	}
}
