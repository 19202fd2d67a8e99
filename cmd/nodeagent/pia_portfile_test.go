package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
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
	socket := labSocket(t, l)
	cmd := runLab(t, l, socket, nil)
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
	out, err := exec.Command("ip", "netns", "exec", l.Node.Name, binary(t), "teardown", "--socket", socket, "--state-dir", l.StateDir).CombinedOutput()
	if err != nil {
		t.Fatalf("teardown: %v\n%s", err, out)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("teardown left the port file %s (%v)", file, err)
	}
}

// TestStopEndsAHangingHook is issue 39's acceptance 5 (second part), with
// the daemon binary: SIGTERM to nodeagent run while its onChange hangs
// (it ignores SIGTERM, and its child does too): the daemon ends the
// hook's process group (SIGTERM, then SIGKILL) and exits only once the
// group is gone; nothing of it is orphaned.
func TestStopEndsAHangingHook(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	pgidFile := filepath.Join(l.Dir, "hook.pgid")
	hook := filepath.Join(l.Dir, "hang.sh")
	os.WriteFile(hook, []byte("#!/bin/sh\ntrap '' TERM\nps -o pgid= $$ | tr -d ' ' > "+pgidFile+".tmp && mv "+pgidFile+".tmp "+pgidFile+"\nsleep 600 &\nwhile :; do sleep 1; done\n"), 0o755)
	l.PIA = "      portForward:\n        enabled: true\n        onChange: [" + hook + "]\n        hookTimeout: 10m\n"
	l.WriteConfig(t, "stub_ams")
	var log testenv.SyncBuffer
	cmd := runLab(t, l, labSocket(t, l), &log)
	var pgid int
	for t0 := time.Now(); pgid == 0 && time.Since(t0) < 90*time.Second; time.Sleep(100 * time.Millisecond) {
		if b, err := os.ReadFile(pgidFile); err == nil {
			pgid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	if pgid == 0 {
		t.Fatalf("the hook did not start within 90s\n%s", log.String())
	}
	time.Sleep(500 * time.Millisecond) // its sleep 600 started
	if syscall.Kill(-pgid, 0) != nil {
		t.Fatalf("the hook's group %d is not there", pgid)
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		// The group's processes are reaped by the daemon (the leader) and
		// by init (the orphaned sleep): kill(-pgid, 0) finds none only
		// once they are all gone.
		alive := syscall.Kill(-pgid, 0) == nil
		t.Logf("SIGTERM -> the daemon exited after %s (%v); the hook's group %d alive after it: %v", time.Since(start).Round(10*time.Millisecond), err, pgid, alive)
		if err != nil {
			t.Errorf("the daemon's exit: %v\n%s", err, log.String())
		}
		if alive {
			syscall.Kill(-pgid, syscall.SIGKILL)
			t.Errorf("the hook's process group %d outlived the daemon", pgid)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon did not exit within 30s of SIGTERM\n%s", log.String())
	}
	if !strings.Contains(log.String(), "stopping") {
		t.Errorf("no clean stop in the log:\n%s", log.String())
	}
}

// sidecar runs, in ns (a pod on the VLAN), a loop such as the sidecars
// written for gluetun's control server run: ask path every half second,
// take "port" from the JSON, and log each new one (with header, when not
// "", as curl sends it). It stops with the test.
func sidecar(t *testing.T, ns, url, header, log string) {
	t.Helper()
	h := ""
	if header != "" {
		h = "-H '" + header + "'"
	}
	script := fmt.Sprintf(`last=
while :; do
  p=$(curl -s --max-time 2 %s %s | sed -n 's/^{"port":\([0-9]*\),"ports":\[[0-9,]*\]}$/\1/p')
  if [ -n "$p" ] && [ "$p" != "$last" ]; then echo "$p" >> %s; last=$p; fi
  sleep 0.5
done`, h, url, log)
	cmd := exec.Command("ip", "netns", "exec", ns, "sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
}

// TestSidecarsFollowThePort is issue 39's acceptance 6, with the daemon
// binary and its metrics listener on the VLAN's shim address
// (10.10.50.1:9477, where a pod reaches it): a sidecar that reads
// /v1/openvpn/portforwarded and one that reads /v1/portforward, as the
// ones written for gluetun do, follow the port through a server restart;
// then, the daemon restarted with --metrics-api-key-file, the same with
// the key (X-API-Key for one, a bearer token for the other), while a
// request without it is refused.
func TestSidecarsFollowThePort(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is missing (make test installs it)")
	}
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.PIA = "      portForward: true"
	l.WriteConfig(t, "stub_ams")
	socket := labSocket(t, l)
	const listen = "10.10.50.1:9477"
	keyFile := filepath.Join(l.Dir, "api.key")
	const key = "gluetun-style-k3y"
	os.WriteFile(keyFile, []byte(key+"\n"), 0o600)
	var cmd *exec.Cmd
	start := func(args ...string) {
		cmd = runLab(t, l, socket, nil, append([]string{"--metrics", listen}, args...)...)
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	c := api.NewClient(socket)
	port := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s, err := c.Status(ctx)
		if err != nil || len(s.PIA) != 1 {
			return 0
		}
		return s.PIA[0].ForwardedPort
	}
	wait := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		for t0 := time.Now(); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Since(t0) > within {
				t.Fatalf("timed out after %s waiting for %s", within, what)
			}
		}
	}
	logs := func(name string) string { return filepath.Join(l.Dir, name+".log") }
	seen := func(name string) []string {
		b, _ := os.ReadFile(logs(name))
		return strings.Fields(string(b))
	}
	follows := func(names []string, want int) {
		t.Helper()
		wait(fmt.Sprintf("the sidecars %v on port %d", names, want), 20*time.Second, func() bool {
			for _, n := range names {
				s := seen(n)
				if len(s) == 0 || s[len(s)-1] != strconv.Itoa(want) {
					return false
				}
			}
			return true
		})
	}
	restart := func(names []string) {
		t.Helper()
		old := port()
		l.Stub.Servers[0].Restart()
		wait("a new port", 90*time.Second, func() bool { p := port(); return p != 0 && p != old })
		t0 := time.Now()
		follows(names, port())
		t.Logf("server restart: port %d -> %d; the sidecars %v followed within %s", old, port(), names, time.Since(t0).Round(100*time.Millisecond))
	}

	// Without a key.
	start()
	wait("the port bound", 90*time.Second, func() bool { return port() != 0 })
	plain := []string{"openvpn-plain", "portforward-plain"}
	sidecar(t, l.LAN.Name, "http://"+listen+"/v1/openvpn/portforwarded", "", logs(plain[0]))
	sidecar(t, l.LAN.Name, "http://"+listen+"/v1/portforward", "", logs(plain[1]))
	follows(plain, port())
	restart(plain)

	// With a key: the keyless sidecars see nothing new, the others follow.
	stop()
	start("--metrics-api-key-file", keyFile)
	wait("the port after the restart", 90*time.Second, func() bool { return port() != 0 })
	keyed := []string{"openvpn-key", "portforward-bearer"}
	sidecar(t, l.LAN.Name, "http://"+listen+"/v1/openvpn/portforwarded", "X-API-Key: "+key, logs(keyed[0]))
	sidecar(t, l.LAN.Name, "http://"+listen+"/v1/portforward", "Authorization: Bearer "+key, logs(keyed[1]))
	follows(keyed, port())
	for _, path := range []string{"/v1/portforward", "/v1/openvpn/portforwarded"} {
		out, _ := l.LAN.TryExec("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", "http://"+listen+path)
		if out != "401" {
			t.Errorf("GET %s without the key: HTTP %s, want 401", path, out)
		}
	}
	before := len(seen(plain[0]))
	restart(keyed)
	if n := len(seen(plain[0])); n != before {
		t.Errorf("the keyless sidecar read %d new ports from a listener that asks for a key", n-before)
	}
	stop()
}

// labSocket is the lab's socket path, in a directory of its own (where
// the daemon puts pia/DEV.port too); NODEAGENT_RT_TABLES goes to the lab.
func labSocket(t *testing.T, l *piastub.Lab) string {
	socket := filepath.Join(l.Dir, "run", "s.sock")
	os.MkdirAll(filepath.Dir(socket), 0o755)
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(l.Dir, "rt_tables.conf"))
	return socket
}

// runLab starts `nodeagent run` on the lab in its node's namespace, with
// stderr to stderr (when not nil) and args added; it is killed at the
// test's end if still running.
func runLab(t *testing.T, l *piastub.Lab, socket string, stderr io.Writer, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", l.Node.Name, binary(t), "run", "-c", l.Config, "--socket", socket, "--state-dir", l.StateDir}, args...)...)
	cmd.Stderr = stderr
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
