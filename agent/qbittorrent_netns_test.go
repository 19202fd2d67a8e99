package agent

import (
	"bufio"
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// The pod qBittorrent runs as: the seeds' download client on VLAN 50.
const (
	qbtAddr  = "10.10.50.10"
	qbtWebUI = "http://" + qbtAddr + ":8080"
	qbtUser  = "nodeagent"
	// qbtFirstPort is the port qBittorrent's config starts with, and is
	// reset to: not the forwarded one.
	qbtFirstPort = 6881
)

// qbittorrent is Debian's qbittorrent-nox in the lab's VLAN namespace,
// its WebUI on 10.10.50.10:8080 behind a password.
type qbittorrent struct {
	t       *testing.T
	ns      *testenv.NetNS
	profile string
	bin     string
	hash    string // the WebUI password's PBKDF2 entry
	cmd     *exec.Cmd
	exited  chan struct{}
	out     *syncBuffer
}

// qbtPasswordEntry is qBittorrent's WebUI\Password_PBKDF2 for password:
// PBKDF2-HMAC-SHA512, 100000 rounds, a 16-byte salt, 64 bytes.
func qbtPasswordEntry(t *testing.T, password string) string {
	salt := make([]byte, 16)
	rand.Read(salt)
	key, err := pbkdf2.Key(sha512.New, password, salt, 100000, 64)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`"@ByteArray(%s:%s)"`, base64.StdEncoding.EncodeToString(salt), base64.StdEncoding.EncodeToString(key))
}

// writeConfig writes qBittorrent's config with listen port port: the
// legal notice accepted (4.5 asks on a terminal otherwise), the WebUI on
// the pod's address with a password, and nothing that talks to the world
// by itself (DHT, LSD, PeX, UPnP).
func (q *qbittorrent) writeConfig(port int) {
	dir := filepath.Join(q.profile, "qBittorrent", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		q.t.Fatal(err)
	}
	conf := fmt.Sprintf(`[LegalNotice]
Accepted=true

[BitTorrent]
Session\Port=%d
Session\DHTEnabled=false
Session\LSDEnabled=false
Session\PeXEnabled=false

[Network]
PortForwardingEnabled=false

[Preferences]
WebUI\Address=%s
WebUI\Port=8080
WebUI\Username=%s
WebUI\Password_PBKDF2=%s
WebUI\LocalHostAuth=true
`, port, qbtAddr, qbtUser, q.hash)
	if err := os.WriteFile(filepath.Join(dir, "qBittorrent.conf"), []byte(conf), 0o600); err != nil {
		q.t.Fatal(err)
	}
}

// start runs qbittorrent-nox in the namespace (as root: 4.5.2 allows it).
func (q *qbittorrent) start() {
	q.t.Helper()
	q.cmd = exec.Command("ip", "netns", "exec", q.ns.Name, q.bin, "--profile="+q.profile)
	q.cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + q.profile, "LC_ALL=C.UTF-8"}
	q.cmd.Stdout, q.cmd.Stderr = q.out, q.out
	q.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := q.cmd.Start(); err != nil {
		q.t.Fatal(err)
	}
	q.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(q.cmd, q.exited)
}

// stop ends qbittorrent-nox (it saves its config on the way out).
func (q *qbittorrent) stop() {
	q.t.Helper()
	if q.cmd == nil {
		return
	}
	syscall.Kill(-q.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-q.exited:
	case <-time.After(20 * time.Second):
		syscall.Kill(-q.cmd.Process.Pid, syscall.SIGKILL)
		<-q.exited
		q.t.Error("qbittorrent-nox did not stop within 20s of SIGTERM")
	}
	q.cmd = nil
}

// qbtAPI is the test's own WebUI client, from the node's namespace.
type qbtAPI struct {
	ns       *testenv.NetNS
	password string
	c        *http.Client
}

func newQbtAPI(ns *testenv.NetNS, password string) *qbtAPI {
	jar, _ := cookiejar.New(nil)
	return &qbtAPI{ns: ns, password: password, c: &http.Client{Jar: jar, Timeout: 3 * time.Second,
		Transport: &http.Transport{DialContext: ns.Host.DialContext, DisableKeepAlives: true}}}
}

func (a *qbtAPI) login() error {
	resp, err := a.c.PostForm(qbtWebUI+"/api/v2/auth/login", url.Values{"username": {qbtUser}, "password": {a.password}})
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "Ok." {
		return fmt.Errorf("login: %s %q", resp.Status, b)
	}
	return nil
}

// listenPort reads qBittorrent's listen_port, logging in when needed.
func (a *qbtAPI) listenPort() (int, error) {
	for try := 0; ; try++ {
		resp, err := a.c.Get(qbtWebUI + "/api/v2/app/preferences")
		if err != nil {
			return 0, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusForbidden && try == 0 {
			if err := a.login(); err != nil {
				return 0, err
			}
			continue
		}
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("preferences: %s", resp.Status)
		}
		var p struct {
			ListenPort *int `json:"listen_port"`
		}
		if err := json.Unmarshal(b, &p); err != nil || p.ListenPort == nil {
			return 0, fmt.Errorf("preferences without listen_port: %v", err)
		}
		return *p.ListenPort, nil
	}
}

// qbtRun is one run of the hook, as its wrapper logged it.
type qbtRun struct {
	at   time.Time
	port int
	lost string
	rc   int
	out  string
}

func qbtHookRuns(t *testing.T, log string) []qbtRun {
	f, err := os.Open(log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []qbtRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 5)
		if len(f) < 4 {
			continue
		}
		sec, _ := strconv.ParseFloat(f[0], 64)
		port, _ := strconv.Atoi(f[1])
		rc, _ := strconv.Atoi(strings.TrimPrefix(f[3], "rc="))
		r := qbtRun{at: time.Unix(0, int64(sec*1e9)), port: port, lost: f[2], rc: rc}
		if len(f) == 5 {
			r.out = f[4]
		}
		out = append(out, r)
	}
	return out
}

// qbtAccepted reports whether a TCP connection from ns to addr is
// accepted: something listens behind it (a port nothing listens on is
// reset, a dropped one times out).
func qbtAccepted(ns *testenv.NetNS, addr string) bool {
	ok := false
	ns.Host.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			ok = true
			c.Close()
		}
		return nil
	})
	return ok
}

// TestQBittorrentPort is issue 32's acceptance with Debian's real
// qbittorrent-nox in the VLAN pod's namespace at 10.10.50.10 and the
// shipped hook (packaging/examples/hooks/qbittorrent-port, logging in with
// a credentials file) as onChange: qBittorrent listens on the forwarded
// port, reachable from the stub's internet through its own socket; a new
// port moves it, with one move per change; reset to another port and
// restarted, it is put right within every; down, the hook fails and is
// retried with backoff, PortDelivered=False with the hook's error, and
// delivered once it is back; its listen_port is never 0;
// GET /v1/portforward follows the port; no credential of qBittorrent's or
// PIA's appears in the log, status, metrics or the hook's output.
func TestQBittorrentPort(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no qbittorrent-nox")
	}
	testenv.RequireRoot(t)
	bin, err := exec.LookPath("qbittorrent-nox")
	if err != nil {
		t.Fatal("qbittorrent-nox is missing (make test installs Debian's qbittorrent-nox package)")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is missing (make test installs it)")
	}
	hookPath, err := filepath.Abs("../packaging/examples/hooks/qbittorrent-port")
	if err != nil {
		t.Fatal(err)
	}
	const every = 5 * time.Second // the least portForward.every allows

	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	// The pod: 10.10.50.10 on the VLAN host's link.
	l.LAN.Exec(t, "ip", "addr", "add", qbtAddr+"/24", "dev", "eth0")

	// The WebUI password: characters a shell, a URL and curl's config
	// quote differently.
	var rnd [6]byte
	rand.Read(rnd[:])
	password := `qb"t\pw&=+ %$` + hex.EncodeToString(rnd[:])
	cred := filepath.Join(l.Dir, "qbittorrent.cred")
	if err := os.WriteFile(cred, []byte("username="+qbtUser+"\npassword="+password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q := &qbittorrent{t: t, ns: l.LAN, profile: filepath.Join(l.Dir, "qbt"), bin: bin, hash: qbtPasswordEntry(t, password), out: &syncBuffer{}}
	q.writeConfig(qbtFirstPort)
	q.start()
	t.Cleanup(func() {
		q.stop()
		if t.Failed() {
			t.Logf("qbittorrent-nox output:\n%s", q.out.String())
		}
	})
	webui := newQbtAPI(l.Node, password)
	waitFor(t, "qBittorrent's WebUI", 30*time.Second, func() bool { p, err := webui.listenPort(); return err == nil && p == qbtFirstPort })

	// The hook, wrapped: the daemon under test runs in the test's own
	// namespace, the hook must run in the node's (where the shim is);
	// the wrapper also logs each run with its exit status and output, and
	// gives the hook a temporary directory of its own to check.
	runLog := filepath.Join(l.Dir, "hook-runs.log")
	hookTmp := filepath.Join(l.Dir, "hook-tmp")
	os.MkdirAll(hookTmp, 0o700)
	wrapper := filepath.Join(l.Dir, "qbt-hook")
	os.WriteFile(wrapper, []byte(fmt.Sprintf(`#!/bin/sh
out=$(TMPDIR=%s ip netns exec %s %s --url %s --credentials %s 2>&1)
rc=$?
printf '%%s\n' "$out"
printf '%%s %%s %%s rc=%%s %%s\n' "$(date +%%s.%%N)" "$NODEAGENT_PIA_PORT" "$NODEAGENT_PIA_PORT_LOST" "$rc" "$(printf '%%s' "$out" | tr '\n' ' ')" >> %s
exit $rc
`, hookTmp, l.Node.Name, hookPath, qbtWebUI, cred, runLog)), 0o755)
	l.PIA = fmt.Sprintf(`      portForward:
        enabled: true
        to: %s
        onChange: [%s]
        every: %s
        hookTimeout: 20s`, qbtAddr, wrapper, every)
	l.WriteConfig(t, "stub_ams")

	// The metrics listener, for GET /v1/portforward.
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ml.Addr().String()
	ml.Close()
	r := startDaemon(t, l.Node, l.Config, func(o *RunOptions) {
		o.StateDir, o.PIATimers, o.MetricsAddr = l.StateDir, fastPF, metricsAddr
	})
	portforward := func() int {
		resp, err := http.Get("http://" + metricsAddr + "/v1/portforward")
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		var b struct{ Port int }
		if json.NewDecoder(resp.Body).Decode(&b) != nil {
			return -1
		}
		return b.Port
	}

	// Its listen_port, watched throughout: never 0.
	var mu sync.Mutex
	var zero []time.Time
	pollCtx, stopPoll := context.WithCancel(t.Context())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		poller := newQbtAPI(l.Node, password)
		for pollCtx.Err() == nil {
			if p, err := poller.listenPort(); err == nil && p == 0 {
				mu.Lock()
				zero = append(zero, time.Now())
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() {
		stopPoll()
		<-polled
		if len(zero) > 0 {
			t.Errorf("qBittorrent's listen_port was 0 at %d polls (first at %s)", len(zero), zero[0].Format(time.TimeOnly))
		}
	}()

	delivered := func(port int) func() bool {
		return func() bool {
			p, err := webui.listenPort()
			return err == nil && p == port
		}
	}
	// listening: qbittorrent-nox's own socket on port in the pod.
	listening := func(port int) bool {
		out, _ := l.LAN.TryExec("ss", "-Hltnp", fmt.Sprintf("sport = :%d", port))
		return strings.Contains(out, `"qbittorrent-nox"`) && strings.Contains(out, qbtAddr+"%")
	}

	// 1. The port bound: qBittorrent listens on it, reachable from the
	// internet through the stub.
	waitFor(t, "the port bound", 60*time.Second, func() bool { return forwardedPort(r) != 0 })
	port := forwardedPort(r)
	took := waitFor(t, "qBittorrent on the forwarded port", 30*time.Second, delivered(port))
	t.Logf("port %d bound -> qBittorrent's listen_port after %s", port, took.Round(10*time.Millisecond))
	waitFor(t, "qbittorrent-nox's socket on the port", 10*time.Second, func() bool { return listening(port) })
	waitFor(t, "a connection from the internet accepted", 10*time.Second, func() bool { return qbtAccepted(l.Stub.Inet, public(port)) })
	if out := l.LAN.Exec(t, "ss", "-Hltnp", fmt.Sprintf("sport = :%d", port)); !strings.Contains(out, `users:(("qbittorrent-nox"`) {
		t.Errorf("the port's listener in the pod is not qbittorrent-nox's:\n%s", out)
	}
	if p := portforward(); p != port {
		t.Errorf("GET /v1/portforward: %d, want %d", p, port)
	}
	waitFor(t, "PortDelivered", 10*time.Second, func() bool {
		c := qbtDelivered(r)
		return c != nil && c.Status == api.True
	})

	// 2. A server restart: a new port; qBittorrent moves; the old port
	// reaches nothing.
	l.Stub.Servers[0].Restart()
	waitFor(t, "a new port", 60*time.Second, func() bool { p := forwardedPort(r); return p != 0 && p != port })
	newPort := forwardedPort(r)
	took = waitFor(t, "qBittorrent on the new port", 30*time.Second, delivered(newPort))
	t.Logf("new port %d -> qBittorrent's listen_port after %s", newPort, took.Round(10*time.Millisecond))
	waitFor(t, "qbittorrent-nox's socket on the new port", 10*time.Second, func() bool { return listening(newPort) })
	waitFor(t, "a connection to the new port accepted", 10*time.Second, func() bool { return qbtAccepted(l.Stub.Inet, public(newPort)) })
	if qbtAccepted(l.Stub.Inet, public(port)) {
		t.Errorf("the old port %d still reaches something", port)
	}
	if listening(port) {
		t.Errorf("qbittorrent-nox still listens on the old port %d", port)
	}
	waitFor(t, "GET /v1/portforward on the new port", 5*time.Second, func() bool { return portforward() == newPort })
	// Runs go with the port, in order; qBittorrent was moved once per
	// change (the other runs find it there: every's re-runs).
	time.Sleep(every + time.Second)
	var ports []int
	moves := map[int]int{}
	for _, run := range qbtHookRuns(t, runLog) {
		if len(ports) == 0 || ports[len(ports)-1] != run.port {
			ports = append(ports, run.port)
		}
		if run.rc == 0 && strings.Contains(run.out, "->") {
			moves[run.port]++
		}
	}
	if fmt.Sprint(ports) != fmt.Sprint([]int{port, newPort}) || moves[port] != 1 || moves[newPort] != 1 || len(moves) != 2 {
		t.Errorf("hook runs by port %v, moves %v; want ports [%d %d], one move each:\n%s", ports, moves, port, newPort, qbtReadFile(runLog))
	}

	// 3a. qBittorrent stopped, its config reset to another port, started:
	// put right within every. (Right after a run, so the next is every
	// away and finds it up.)
	n := len(qbtHookRuns(t, runLog))
	waitFor(t, "a re-run after every", 2*every, func() bool { return len(qbtHookRuns(t, runLog)) > n })
	q.stop()
	q.writeConfig(qbtFirstPort)
	q.start()
	waitFor(t, "qBittorrent back on its own port", 30*time.Second, func() bool { p, err := webui.listenPort(); return err == nil && (p == qbtFirstPort || p == newPort) })
	took = waitFor(t, "qBittorrent put back on the forwarded port", every+2*time.Second, delivered(newPort))
	t.Logf("qBittorrent restarted on port %d -> back on %d after %s (every %s)", qbtFirstPort, newPort, took.Round(10*time.Millisecond), every)
	// The run that moved it ends (it reads the port back) before
	// qBittorrent goes down again.
	waitFor(t, "the run that moved qBittorrent back", 10*time.Second, func() bool {
		runs := qbtHookRuns(t, runLog)
		last := runs[len(runs)-1]
		return len(runs) > n && last.rc == 0 && strings.Contains(last.out, "->")
	})

	// 3b. qBittorrent down: the hook fails, retried with backoff;
	// PortDelivered=False with its error.
	// The failures counted are those since the last success: a run of
	// every may have begun just before the stop and be the first of them.
	q.stop()
	var failed []qbtRun
	waitFor(t, "three failed runs", 40*time.Second, func() bool {
		failed = failed[:0]
		for _, run := range qbtHookRuns(t, runLog) {
			if run.rc == 0 {
				failed = failed[:0]
			} else {
				failed = append(failed, run)
			}
		}
		return len(failed) >= 3
	})
	gaps := []time.Duration{failed[1].at.Sub(failed[0].at), failed[2].at.Sub(failed[1].at)}
	t.Logf("qBittorrent down: failed runs %d s apart", []int{int(gaps[0].Seconds() + .5), int(gaps[1].Seconds() + .5)})
	if gaps[0] < 4500*time.Millisecond || gaps[1] < 9*time.Second || gaps[1] > 12*time.Second {
		t.Errorf("retries %s and %s apart, want 5s then 10s", gaps[0], gaps[1])
	}
	c := qbtDelivered(r)
	t.Logf("PortDelivered with qBittorrent down: %+v", c)
	if c == nil || c.Status != api.False || c.Reason != "HookFailed" || !strings.Contains(c.Message, "login to "+qbtWebUI+" failed") && !strings.Contains(c.Message, "curl:") {
		t.Errorf("PortDelivered with qBittorrent down: %+v", c)
	}
	// Back: delivered at the next attempt, within one backoff step (20 s
	// after the third failure).
	q.start()
	back := time.Now()
	waitFor(t, "PortDelivered again", 25*time.Second, func() bool {
		c := qbtDelivered(r)
		return c != nil && c.Status == api.True
	})
	t.Logf("qBittorrent back -> PortDelivered after %s (third failure %s before it came back)", time.Since(back).Round(100*time.Millisecond), back.Sub(failed[2].at).Round(100*time.Millisecond))
	if p, err := webui.listenPort(); err != nil || p != newPort {
		t.Errorf("qBittorrent's listen_port %d (%v), want %d", p, err, newPort)
	}

	// 6. No credential anywhere.
	stopPoll()
	<-polled
	if ents, _ := os.ReadDir(hookTmp); len(ents) != 0 {
		t.Errorf("the hook left %d entries in its temporary directory (the cookie jar)", len(ents))
	}
	key, err := os.ReadFile(filepath.Join(l.StateDir, "pia", l.Dev+".key"))
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"qBittorrent's password": password, "PIA private key": strings.TrimSpace(string(key)), "PIA password": "hunter2-stub", "a qBittorrent session cookie": "SID="}
	for _, c := range webui.c.Jar.Cookies(&url.URL{Scheme: "http", Host: qbtAddr + ":8080"}) {
		secrets["the test's session cookie"] = c.Value
	}
	for i, tok := range l.Stub.IssuedTokens() {
		secrets[fmt.Sprintf("PIA token %d", i)] = tok
	}
	for i, pl := range l.Stub.IssuedPayloads() {
		secrets[fmt.Sprintf("port-forwarding payload or signature %d", i)] = pl
	}
	st, _ := json.Marshal(r.d.Status())
	var scrape strings.Builder
	mfs, _ := r.d.Metrics().Registry.Gather()
	for _, mf := range mfs {
		scrape.WriteString(mf.String())
	}
	for what, text := range map[string]string{"log": r.log.String(), "status": string(st), "metrics": scrape.String(), "hook's output": qbtReadFile(runLog)} {
		for name, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("%s appears in the %s", name, what)
			}
		}
	}
	if t.Failed() {
		t.Logf("hook runs:\n%s", qbtReadFile(runLog))
	}
}

// qbtDelivered is the daemon's PortDelivered condition, nil while absent.
func qbtDelivered(r *running) *api.Condition {
	s := r.d.Status()
	return s.Condition(api.CondPortDelivered)
}

func qbtReadFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
