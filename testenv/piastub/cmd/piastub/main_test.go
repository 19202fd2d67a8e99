package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// The command as the VM test and people start it: built, run in a
// namespace of the test's, as a process.

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "piastub")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// stubNamespaces are the names under /run/netns the command gives its
// namespaces.
func stubNamespaces(t *testing.T) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir("/run/netns")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "na-piastub-") {
			out[e.Name()] = true
		}
	}
	return out
}

var linkNetns = regexp.MustCompile(`link-netns (\S+)`)

// peerNamespace is the name of the namespace holding the peer of the veth
// tostub in ns, as ip(8) finds it under /run/netns ("" if it finds none).
func peerNamespace(ns *testenv.NetNS) (name string, exists bool) {
	out, err := ns.TryExec("ip", "-o", "link", "show", "tostub")
	if err != nil {
		return "", false
	}
	if m := linkNetns.FindStringSubmatch(out); m != nil {
		return m[1], true
	}
	return "", true
}

// removeLeaks deletes, when the test ends, the namespaces a failed stub
// left behind it: tostub's peer's and the one linked to that (its
// internet).
func removeLeaks(t *testing.T, ns *testenv.NetNS) {
	t.Cleanup(func() {
		name, _ := peerNamespace(ns)
		if name == "" {
			return
		}
		if out, err := exec.Command("ip", "-n", name, "-o", "link", "show", "inet0").CombinedOutput(); err == nil {
			if m := linkNetns.FindSubmatch(out); m != nil {
				exec.Command("ip", "netns", "del", string(m[1])).Run()
			}
		}
		exec.Command("ip", "netns", "del", name).Run()
	})
}

// A setup that fails after making the stub's namespaces and its link in
// the calling namespace (here: the route to the stub's addresses exists
// already) removes them all before the command exits.
func TestSetupFailureLeavesNothing(t *testing.T) {
	testenv.RequireRoot(t)
	bin := build(t)
	x := testenv.NewNetNS(t)
	x.Exec(t, "ip", "route", "add", "blackhole", piastub.Prefix.String())
	removeLeaks(t, x)
	before := stubNamespaces(t)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+x.Name, bin, t.TempDir()).CombinedOutput()
	if err == nil {
		t.Fatalf("the stub set up with its route taken:\n%s", out)
	}
	if ctx.Err() != nil {
		t.Fatalf("the stub did not exit:\n%s", out)
	}
	if !strings.Contains(string(out), "ip route add "+piastub.Prefix.String()) {
		t.Errorf("the error does not name the failed step:\n%s", out)
	}
	if name, exists := peerNamespace(x); exists {
		t.Errorf("after a failed setup tostub is still in the calling namespace, its peer in %q: the stub's namespace outlived the process\n%s", name, out)
	}
	for name := range stubNamespaces(t) {
		if !before[name] {
			t.Errorf("after a failed setup /run/netns/%s is left", name)
		}
	}
}

// stub is the command running.
type stub struct {
	pid    int
	output func() string
	// done is closed when the process has ended; err is then its exit
	// status where the test is its parent.
	done chan struct{}
	err  error
}

// startChild starts the stub as the test's child, under ip netns exec.
func startChild(t *testing.T, bin, ns, dir string) *stub {
	var out bytes.Buffer
	var mu sync.Mutex
	cmd := exec.Command("ip", "netns", "exec", ns, bin, dir)
	cmd.Stdout, cmd.Stderr = lockedWriter{&mu, &out}, lockedWriter{&mu, &out}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &stub{pid: cmd.Process.Pid, done: make(chan struct{}), output: func() string { mu.Lock(); defer mu.Unlock(); return out.String() }}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	return s
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// startOrphan starts the stub under ip netns exec from a shell that exits
// at once, as `cmd &` in a script that ends does: the stub's parent is
// gone before it looks for the host's mount namespace.
func startOrphan(t *testing.T, bin, ns, dir string) *stub {
	return orphan(t, `ip netns exec "$1" "$2" "$3" >"$4" 2>&1 & echo $!`, bin, ns, dir)
}

// startSetsid is startOrphan in a session of its own: neither an
// ancestor nor the session leader is in the mount namespace the stub was
// started from.
func startSetsid(t *testing.T, bin, ns, dir string) *stub {
	return orphan(t, `setsid ip netns exec "$1" "$2" "$3" >"$4" 2>&1 & echo $!`, bin, ns, dir)
}

// orphan starts the stub with script, which prints its pid.
func orphan(t *testing.T, script, bin, ns, dir string) *stub {
	log := filepath.Join(t.TempDir(), "log")
	out, err := exec.Command("sh", "-c", script, "sh", ns, bin, dir, log).Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("pid %q: %v", out, err)
	}
	s := &stub{pid: pid, done: make(chan struct{}), output: func() string { b, _ := os.ReadFile(log); return string(b) }}
	go func() {
		defer close(s.done)
		for {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				return
			}
			if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && f[0] == "Z" {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return s
}

// stop sends SIGTERM and waits up to 30 s (then kills).
func (s *stub) stop() error {
	syscall.Kill(s.pid, syscall.SIGTERM)
	select {
	case <-s.done:
		return s.err
	case <-time.After(30 * time.Second):
		syscall.Kill(s.pid, syscall.SIGKILL)
		<-s.done
		return context.DeadlineExceeded
	}
}

// Started under `ip netns exec`, the stub's namespaces are still named
// under /run/netns for everyone (not in that command's private mount
// namespace), the calling namespace reaches the stub, and SIGTERM removes
// everything; also when the stub's parent is gone by the time it starts.
func TestNamespacesVisibleUnderIPNetnsExec(t *testing.T) {
	testenv.RequireRoot(t)
	bin := build(t)
	for _, tc := range []struct {
		name  string
		start func(t *testing.T, bin, ns, dir string) *stub
	}{{"child", startChild}, {"orphan", startOrphan}, {"orphan in a session of its own", startSetsid}} {
		t.Run(tc.name, func(t *testing.T) { visible(t, bin, tc.start) })
		// A sandbox where pid 1's mount namespace is out of reach: the
		// stub finds the one that names its network namespace.
		t.Run(tc.name+", pid 1 out of reach", func(t *testing.T) {
			t.Setenv("PIASTUB_INIT_MNT_NS", "/nonexistent")
			visible(t, bin, tc.start)
		})
	}
}

func visible(t *testing.T, bin string, start func(t *testing.T, bin, ns, dir string) *stub) {
	x := testenv.NewNetNS(t)
	removeLeaks(t, x)
	dir := t.TempDir()
	s := start(t, bin, x.Name, dir)
	var once sync.Once
	var stopErr error
	stop := func() error { once.Do(func() { stopErr = s.stop() }); return stopErr }
	t.Cleanup(func() { stop() })

	deadline := time.After(60 * time.Second)
	for ready := false; !ready; {
		select {
		case <-s.done:
			t.Fatalf("the stub exited: %v\n%s", s.err, s.output())
		case <-deadline:
			t.Fatalf("the stub was not ready within 60 s:\n%s", s.output())
		case <-time.After(50 * time.Millisecond):
			_, err := os.Stat(filepath.Join(dir, "ready"))
			ready = err == nil
		}
	}

	name, _ := peerNamespace(x)
	if name == "" {
		o, _ := x.TryExec("ip", "-o", "link", "show", "tostub")
		t.Fatalf("ip(8) finds the namespace of tostub's peer under no name in /run/netns:\n%s", o)
	}
	env, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "PIA_STUB_NS="+name+"\n") {
		t.Errorf("env does not name the stub's namespace %s:\n%s", name, env)
	}
	if o, err := exec.Command("ip", "-n", name, "-o", "addr", "show", "dev", "lo").CombinedOutput(); err != nil || !strings.Contains(string(o), piastub.WWW.String()) {
		t.Errorf("the stub's namespace %s as seen from here: %v\n%s", name, err, o)
	}

	// The calling namespace reaches the stub by PIA's list host's name.
	ca, err := os.ReadFile(filepath.Join(dir, "stub-web-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return x.Host.DialContext(ctx, network, piastub.WWW.String()+":443")
		},
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
	resp, err := c.Get("https://serverlist.piaservers.net/vpninfo/servers/v6")
	if err != nil {
		t.Fatalf("the list from the calling namespace: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the list from the calling namespace: HTTP %d", resp.StatusCode)
	}

	if err := stop(); err != nil {
		t.Errorf("after SIGTERM: %v\n%s", err, s.output())
	}
	if _, err := os.Stat("/run/netns/" + name); !os.IsNotExist(err) {
		t.Errorf("after SIGTERM /run/netns/%s: %v", name, err)
	}
	if _, exists := peerNamespace(x); exists {
		t.Errorf("after SIGTERM tostub is still in the calling namespace")
	}
	if _, err := os.Stat(filepath.Join(dir, "ready")); !os.IsNotExist(err) {
		t.Errorf("after SIGTERM %s/ready is still there", dir)
	}
}
