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
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/agent/portfwd"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/debroot"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// The forwarded port delivered to the download clients users run today,
// each the real program from Debian's archive in the VLAN pod's namespace
// at 10.10.50.10, behind its WebUI or RPC login, with the shipped hook
// (packaging/examples/hooks) as onChange: bookworm's from the host,
// trixie's and sid's from cached roots (testenv/debroot) under chroot.

// The pod the client runs in: the seeds' download client on VLAN 50.
const (
	qbtAddr = "10.10.50.10"
	qbtUser = "nodeagent"
	// qbtFirstPort is the port a client's config starts with, and is
	// reset to: not the forwarded one.
	qbtFirstPort = 6881
)

// client kinds.
const (
	kindQBittorrent  = "qbittorrent"
	kindTransmission = "transmission"
)

// dlClient is one download client: which, from where, and how it is run
// and asked.
type dlClient struct {
	t    *testing.T
	kind string
	// root is the cached root it runs from ("" for the host's);
	// version its package's version there.
	root, version string
	ns            *testenv.NetNS
	// dir is its profile (qBittorrent) or config directory
	// (Transmission) on the host; inside is where the client sees it.
	dir, inside string
	password    string
	hash        string // qBittorrent's WebUI\Password_PBKDF2
	// apiKey: qBittorrent 5.2's API key, and no password at all.
	apiKey string
	cmd    *exec.Cmd
	exited chan struct{}
	out    *testenv.SyncBuffer
}

func (c *dlClient) name() string { return c.kind + " " + c.version }

// webui is the URL the hook and the test's own client use.
func (c *dlClient) webui() string {
	if c.kind == kindTransmission {
		return "http://" + qbtAddr + ":9091"
	}
	return "http://" + qbtAddr + ":8080"
}

// process is the client's process name as ss shows it.
func (c *dlClient) process() string {
	if c.kind == kindTransmission {
		return "transmission-da"
	}
	return "qbittorrent-nox"
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

// writeConfig writes the client's config with listen port port, nothing in
// it that talks to the world by itself (DHT, LSD, PeX, UPnP), the WebUI
// or RPC on the pod's address behind its login (no subnet bypass).
func (c *dlClient) writeConfig(port int) {
	c.t.Helper()
	if c.kind == kindTransmission {
		// Its RPC password is written in the clear; Transmission salts
		// and hashes it when it starts (and saves it so at its stop).
		conf, _ := json.MarshalIndent(map[string]any{
			"rpc-enabled": true, "rpc-bind-address": qbtAddr, "rpc-port": 9091,
			"rpc-authentication-required": true, "rpc-username": qbtUser, "rpc-password": c.password,
			"rpc-whitelist-enabled": false, "rpc-host-whitelist-enabled": true,
			"peer-port": port, "peer-port-random-on-start": false, "port-forwarding-enabled": false,
			"dht-enabled": false, "lpd-enabled": false, "pex-enabled": false,
			"download-dir": c.inside + "/downloads", "incomplete-dir-enabled": false,
		}, "", "  ")
		if err := os.WriteFile(filepath.Join(c.dir, "settings.json"), conf, 0o600); err != nil {
			c.t.Fatal(err)
		}
		return
	}
	dir := filepath.Join(c.dir, "qBittorrent", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	auth := fmt.Sprintf("WebUI\\Password_PBKDF2=%s\n", c.hash)
	if c.apiKey != "" {
		// No password at all: 5.3 makes up a temporary one, printed to
		// its output only; the key is the way in.
		auth = fmt.Sprintf("WebUI\\APIKey=%s\n", c.apiKey)
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
WebUI\LocalHostAuth=true
%s`, port, qbtAddr, qbtUser, auth)
	if err := os.WriteFile(filepath.Join(dir, "qBittorrent.conf"), []byte(conf), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

// start runs the client in the pod's namespace, as root.
func (c *dlClient) start() {
	c.t.Helper()
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + c.inside, "LC_ALL=C.UTF-8"}
	argv := []string{"/usr/bin/qbittorrent-nox", "--profile=" + c.inside}
	if c.kind == kindTransmission {
		argv = []string{"/usr/bin/transmission-daemon", "--foreground", "--config-dir", c.inside}
	}
	if c.root == "" {
		c.cmd = exec.Command("ip", append([]string{"netns", "exec", c.ns.Name}, argv...)...)
		c.cmd.Env = env
	} else {
		c.cmd = debroot.Command(c.ns.Name, c.root, c.dir, env, argv...)
	}
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(c.cmd, c.exited)
}

// stop ends the client (it saves its config on the way out).
func (c *dlClient) stop() {
	c.t.Helper()
	if c.cmd == nil {
		return
	}
	syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
		c.t.Errorf("%s did not stop within 20s of SIGTERM", c.name())
	}
	c.cmd = nil
}

// clientAPI is the test's own client of the download client's API, from
// the node's namespace: qBittorrent's WebUI (a login, or the API key) or
// Transmission's RPC (basic auth and the session-id exchange), written
// from their documentation, not from the hooks.
type clientAPI struct {
	c   *dlClient
	sid string // Transmission's X-Transmission-Session-Id
	h   *http.Client
}

func newClientAPI(ns *testenv.NetNS, c *dlClient) *clientAPI {
	jar, _ := cookiejar.New(nil)
	return &clientAPI{c: c, h: &http.Client{Jar: jar, Timeout: 3 * time.Second,
		Transport: &http.Transport{DialContext: ns.Host.DialContext, DisableKeepAlives: true}}}
}

// qbtLogin logs in: 200 "Ok." up to 5.1, 204 from 5.2.
func (a *clientAPI) qbtLogin() error {
	resp, err := a.h.PostForm(a.c.webui()+"/api/v2/auth/login", url.Values{"username": {qbtUser}, "password": {a.c.password}})
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !(resp.StatusCode == http.StatusOK && string(b) == "Ok." || resp.StatusCode == http.StatusNoContent) {
		return fmt.Errorf("login: %s %q", resp.Status, b)
	}
	return nil
}

// listenPort reads the client's own idea of its listening port.
func (a *clientAPI) listenPort() (int, error) {
	if a.c.kind == kindTransmission {
		return a.peerPort()
	}
	for try := 0; ; try++ {
		req, _ := http.NewRequest(http.MethodGet, a.c.webui()+"/api/v2/app/preferences", nil)
		if a.c.apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+a.c.apiKey)
		}
		resp, err := a.h.Do(req)
		if err != nil {
			return 0, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if (resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized) && try == 0 && a.c.apiKey == "" {
			if err := a.qbtLogin(); err != nil {
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

// peerPort is Transmission's session-get peer-port (RPC spec 2.2.1: a 409
// carries the session id to send back).
func (a *clientAPI) peerPort() (int, error) {
	for try := 0; try < 2; try++ {
		req, _ := http.NewRequest(http.MethodPost, a.c.webui()+"/transmission/rpc", strings.NewReader(`{"method":"session-get","arguments":{"fields":["peer-port"]}}`))
		req.SetBasicAuth(qbtUser, a.c.password)
		if a.sid != "" {
			req.Header.Set("X-Transmission-Session-Id", a.sid)
		}
		resp, err := a.h.Do(req)
		if err != nil {
			return 0, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusConflict {
			a.sid = resp.Header.Get("X-Transmission-Session-Id")
			continue
		}
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("session-get: %s", resp.Status)
		}
		var r struct {
			Result    string `json:"result"`
			Arguments struct {
				PeerPort *int `json:"peer-port"`
			} `json:"arguments"`
		}
		if err := json.Unmarshal(b, &r); err != nil || r.Result != "success" || r.Arguments.PeerPort == nil {
			return 0, fmt.Errorf("session-get: %q (%v)", b, err)
		}
		return *r.Arguments.PeerPort, nil
	}
	return 0, fmt.Errorf("session-get: 409 twice")
}

// hookRun is one run of the hook, as its wrapper logged it.
type hookRun struct {
	at   time.Time
	port int
	lost string
	rc   int
	out  string
}

func wrappedRuns(log string) []hookRun {
	f, err := os.Open(log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []hookRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 5)
		if len(f) < 4 {
			continue
		}
		sec, _ := strconv.ParseFloat(f[0], 64)
		port, _ := strconv.Atoi(f[1])
		rc, _ := strconv.Atoi(strings.TrimPrefix(f[3], "rc="))
		r := hookRun{at: time.Unix(0, int64(sec*1e9)), port: port, lost: f[2], rc: rc}
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

// clientCase is one client the scenario runs against.
type clientCase struct {
	name, kind, suite string
	// version is what the package's version must match: the protocol
	// the case is about (sid moves on; 5.2 and later is what matters).
	version *regexp.Regexp
	apiKey  bool
	// refused: after the scenario, the password goes wrong for 30
	// (shortened) minutes.
	refused bool
}

// TestQBittorrentPort is issue 32's scenario, and issue 39's acceptance
// 1 and 2, with Debian's real qbittorrent-nox of bookworm (4.5.2), trixie
// (5.1.0) and sid (5.3.0, the 204/401 login and QBT_SID_<port> cookie of
// 5.2 and later), each with its WebUI login on, and sid's with an API key
// and no password at all: see clientScenario. On sid's, the password
// then goes wrong for 30 minutes, shortened.
func TestQBittorrentPort(t *testing.T) {
	runClientCases(t, []clientCase{
		{name: "bookworm", kind: kindQBittorrent, suite: "bookworm", version: regexp.MustCompile(`^4\.5\.`)},
		{name: "trixie", kind: kindQBittorrent, suite: "trixie", version: regexp.MustCompile(`^5\.1\.`)},
		{name: "sid", kind: kindQBittorrent, suite: "sid", version: regexp.MustCompile(`^(5\.([2-9]|\d\d)|[6-9])\.`), refused: true},
		{name: "sid API key", kind: kindQBittorrent, suite: "sid", version: regexp.MustCompile(`^(5\.([2-9]|\d\d)|[6-9])\.`), apiKey: true},
	})
}

// TestTransmissionPort is issue 39's acceptance 3: the same scenario with
// Debian's real transmission-daemon of bookworm (3.00) and sid (4.x), its
// RPC behind basic auth, for its peer-port.
func TestTransmissionPort(t *testing.T) {
	runClientCases(t, []clientCase{
		{name: "bookworm", kind: kindTransmission, suite: "bookworm", version: regexp.MustCompile(`^3\.00`)},
		{name: "sid", kind: kindTransmission, suite: "sid", version: regexp.MustCompile(`^4\.`)},
	})
}

func runClientCases(t *testing.T, cases []clientCase) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no download clients")
	}
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is missing (make test installs it)")
	}
	for _, cc := range cases {
		t.Run(cc.name, func(t *testing.T) {
			// Two at a time (go test's -parallel is GOMAXPROCS): most of a
			// scenario is waiting for backoffs and every.
			t.Parallel()
			clientScenario(t, cc)
		})
	}
}

// clientScenario: the client listens on the forwarded port, reachable
// from the stub's internet through its own socket; a new port moves it,
// with one move per change; reset to another port and restarted, it is
// put right within every; down, the hook fails and is retried with
// backoff, PortDelivered=False with the hook's error, and delivered once
// it is back; its port is never 0; GET /v1/portforward follows the port;
// no credential appears in the log, status, metrics or the hook's output.
func clientScenario(t *testing.T, cc clientCase) {
	pkg := "qbittorrent-nox"
	if cc.kind == kindTransmission {
		pkg = "transmission-daemon"
	}
	c := &dlClient{t: t, kind: cc.kind, out: &testenv.SyncBuffer{}}
	var err error
	if cc.suite == "bookworm" {
		if _, err := exec.LookPath(pkg); err != nil {
			t.Fatalf("%s is missing (make test installs Debian's %s package)", pkg, pkg)
		}
		out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", pkg).Output()
		if err != nil {
			t.Fatal(err)
		}
		c.version = string(out)
	} else {
		c.root = debroot.Require(t, cc.suite)
		if c.version, err = debroot.Version(c.root, pkg); err != nil {
			t.Fatal(err)
		}
	}
	if !cc.version.MatchString(c.version) {
		t.Fatalf("%s's %s is %s, not the version this case is about (%s)", cc.suite, pkg, c.version, cc.version)
	}
	t.Logf("%s %s (%s)", pkg, c.version, cc.suite)
	hookName := "qbittorrent-port"
	if cc.kind == kindTransmission {
		hookName = "transmission-port"
	}
	hookPath, err := filepath.Abs("../packaging/examples/hooks/" + hookName)
	if err != nil {
		t.Fatal(err)
	}
	const every = 5 * time.Second // the least portForward.every allows
	// The refusal wait, cut from 15 minutes: above the backoff of the
	// first two failures (5 s, 10 s), as 15 minutes is above its 5-minute
	// cap, so the waits are the refusal's alone, as in the product.
	const refusedWait = 11 * time.Second

	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.LAN.Exec(t, "ip", "addr", "add", qbtAddr+"/24", "dev", "eth0")
	c.ns = l.LAN
	c.dir = filepath.Join(l.Dir, "client")
	os.MkdirAll(filepath.Join(c.dir, "downloads"), 0o755)
	c.inside = c.dir
	if c.root != "" {
		c.inside = debroot.MountDir
	}

	// The password (and key): characters a shell, a URL, JSON and curl's
	// config quote differently.
	var rnd [6]byte
	rand.Read(rnd[:])
	c.password = `qb"t\pw&=+ %$` + hex.EncodeToString(rnd[:])
	cred := filepath.Join(l.Dir, "client.cred")
	authArgs := []string{"--credentials", cred}
	if err := os.WriteFile(cred, []byte("username="+qbtUser+"\npassword="+c.password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cc.apiKey {
		c.password = ""
		rand.Read(rnd[:])
		// qBittorrent's own form: qbt_ and 28 of its characters.
		c.apiKey = "qbt_" + strings.ToUpper(hex.EncodeToString(rnd[:]))[:12] + "abcdefghjkmnpqrs"
		keyFile := filepath.Join(l.Dir, "client.key")
		authArgs = []string{"--api-key", keyFile}
		if err := os.WriteFile(keyFile, []byte(c.apiKey+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	} else if cc.kind == kindQBittorrent {
		c.hash = qbtPasswordEntry(t, c.password)
	}
	c.writeConfig(qbtFirstPort)
	c.start()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			t.Logf("%s output:\n%s", c.name(), c.out.String())
		}
	})
	webui := newClientAPI(l.Node, c)
	waitFor(t, c.name()+"'s API", 60*time.Second, func() bool { p, err := webui.listenPort(); return err == nil && p == qbtFirstPort })

	// The hook, wrapped: the daemon under test runs in the test's own
	// namespace, the hook must run in the node's (where the shim is);
	// the wrapper also logs each run with its exit status and output, and
	// gives the hook a temporary directory of its own to check.
	runLog := filepath.Join(l.Dir, "hook-runs.log")
	hookTmp := filepath.Join(l.Dir, "hook-tmp")
	os.MkdirAll(hookTmp, 0o700)
	wrapper := filepath.Join(l.Dir, "client-hook")
	os.WriteFile(wrapper, []byte(fmt.Sprintf(`#!/bin/sh
out=$(TMPDIR=%s ip netns exec %s %s --url %s %s 2>&1)
rc=$?
printf '%%s\n' "$out"
printf '%%s %%s %%s rc=%%s %%s\n' "$(date +%%s.%%N)" "$NODEAGENT_PIA_PORT" "$NODEAGENT_PIA_PORT_LOST" "$rc" "$(printf '%%s' "$out" | tr '\n' ' ')" >> %s
exit $rc
`, hookTmp, l.Node.Name, hookPath, c.webui(), strings.Join(authArgs, " "), runLog)), 0o755)
	l.PIA = fmt.Sprintf(`      portForward:
        enabled: true
        to: %s
        onChange: [%s]
        every: %s`, qbtAddr, wrapper, every)
	l.WriteConfig(t, "stub_ams")

	// The metrics listener, for GET /v1/portforward.
	// The daemon listens in its node's namespace: a free port there, and
	// a client that dials there.
	ml, err := l.Node.Host.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ml.Addr().String()
	ml.Close()
	metricsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: l.Node.Host.DialContext}}
	r := startDaemon(t, l.Node, l.Config, func(o *RunOptions) {
		o.StateDir, o.PIATimers, o.MetricsAddr = l.StateDir, fastPF, metricsAddr
		o.PortHookTimers = portfwd.HookTimers{RefusedWait: refusedWait}
	})
	portforward := func() int {
		resp, err := metricsClient.Get("http://" + metricsAddr + "/v1/portforward")
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

	// Its port, watched throughout: never 0.
	var mu sync.Mutex
	var zero []time.Time
	pollCtx, stopPoll := context.WithCancel(t.Context())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		poller := newClientAPI(l.Node, c)
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
			t.Errorf("%s's port was 0 at %d polls (first at %s)", c.name(), len(zero), zero[0].Format(time.TimeOnly))
		}
	}()

	delivered := func(port int) func() bool {
		return func() bool {
			p, err := webui.listenPort()
			return err == nil && p == port
		}
	}
	// listening: the client's own socket on port in the pod.
	listening := func(port int) bool {
		out, _ := l.LAN.TryExec("ss", "-Hltnp", fmt.Sprintf("sport = :%d", port))
		return strings.Contains(out, `"`+c.process()+`"`)
	}
	portDeliveredTrue := func() bool { c := qbtDelivered(r); return c != nil && c.Status == api.True }

	// 1. The port bound: the client listens on it, reachable from the
	// internet through the stub.
	waitFor(t, "the port bound", 60*time.Second, func() bool { return forwardedPort(r) != 0 })
	port := forwardedPort(r)
	took := waitFor(t, c.name()+" on the forwarded port", 30*time.Second, delivered(port))
	t.Logf("port %d bound -> %s's port after %s", port, c.name(), took.Round(10*time.Millisecond))
	waitFor(t, "the client's socket on the port", 10*time.Second, func() bool { return listening(port) })
	waitFor(t, "a connection from the internet accepted", 10*time.Second, func() bool { return qbtAccepted(l.Stub.Inet, public(port)) })
	if out := l.LAN.Exec(t, "ss", "-Hltnp", fmt.Sprintf("sport = :%d", port)); !strings.Contains(out, `users:(("`+c.process()+`"`) {
		t.Errorf("the port's listener in the pod is not %s's:\n%s", c.process(), out)
	}
	if p := portforward(); p != port {
		t.Errorf("GET /v1/portforward: %d, want %d", p, port)
	}
	waitFor(t, "PortDelivered", 10*time.Second, portDeliveredTrue)

	// 2. A server restart: a new port; the client moves; the old port
	// reaches nothing.
	l.Stub.Servers[0].Restart()
	waitFor(t, "a new port", 60*time.Second, func() bool { p := forwardedPort(r); return p != 0 && p != port })
	newPort := forwardedPort(r)
	took = waitFor(t, c.name()+" on the new port", 30*time.Second, delivered(newPort))
	t.Logf("new port %d -> %s's port after %s", newPort, c.name(), took.Round(10*time.Millisecond))
	waitFor(t, "the client's socket on the new port", 10*time.Second, func() bool { return listening(newPort) })
	waitFor(t, "a connection to the new port accepted", 10*time.Second, func() bool { return qbtAccepted(l.Stub.Inet, public(newPort)) })
	if qbtAccepted(l.Stub.Inet, public(port)) {
		t.Errorf("the old port %d still reaches something", port)
	}
	if listening(port) {
		t.Errorf("%s still listens on the old port %d", c.name(), port)
	}
	waitFor(t, "GET /v1/portforward on the new port", 5*time.Second, func() bool { return portforward() == newPort })
	// Runs go with the port, in order; the client was moved once per
	// change (the other runs find it there: every's re-runs).
	time.Sleep(every + time.Second)
	var ports []int
	moves := map[int]int{}
	for _, run := range wrappedRuns(runLog) {
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
	if h := tunnel(r).PortHook; h == nil || h.LastTookSeconds == nil || *h.LastTookSeconds <= 0 {
		t.Errorf("the hook's last run took no time: %+v", h)
	} else {
		t.Logf("the hook's last run took %.3fs", *h.LastTookSeconds)
	}

	// 3a. The client stopped, its config reset to another port, started:
	// put right within every. (Right after a run, so the next is every
	// away and finds it up.)
	n := len(wrappedRuns(runLog))
	waitFor(t, "a re-run after every", 2*every, func() bool { return len(wrappedRuns(runLog)) > n })
	c.stop()
	c.writeConfig(qbtFirstPort)
	c.start()
	waitFor(t, c.name()+" back on its own port", 60*time.Second, func() bool {
		p, err := webui.listenPort()
		return err == nil && (p == qbtFirstPort || p == newPort)
	})
	took = waitFor(t, c.name()+" put back on the forwarded port", every+4*time.Second, delivered(newPort))
	t.Logf("%s restarted on port %d -> back on %d after %s (every %s)", c.name(), qbtFirstPort, newPort, took.Round(10*time.Millisecond), every)
	// The run that moved it ends (it reads the port back) before the
	// client goes down again.
	waitFor(t, "the run that moved the client back", 10*time.Second, func() bool {
		runs := wrappedRuns(runLog)
		last := runs[len(runs)-1]
		return len(runs) > n && last.rc == 0 && strings.Contains(last.out, "->")
	})

	// 3b. The client down: the hook fails, retried with backoff;
	// PortDelivered=False with its error. The failures counted are those
	// since the last success: a run of every may have begun just before
	// the stop and be the first of them.
	c.stop()
	var failed []hookRun
	waitFor(t, "three failed runs", 40*time.Second, func() bool {
		failed = failed[:0]
		for _, run := range wrappedRuns(runLog) {
			if run.rc == 0 {
				failed = failed[:0]
			} else {
				failed = append(failed, run)
			}
		}
		return len(failed) >= 3
	})
	gaps := []time.Duration{failed[1].at.Sub(failed[0].at), failed[2].at.Sub(failed[1].at)}
	t.Logf("%s down: failed runs %d s apart (exit %d)", c.name(), []int{int(gaps[0].Seconds() + .5), int(gaps[1].Seconds() + .5)}, failed[0].rc)
	if gaps[0] < 4500*time.Millisecond || gaps[1] < 9*time.Second || gaps[1] > 12*time.Second {
		t.Errorf("retries %s and %s apart, want 5s then 10s", gaps[0], gaps[1])
	}
	for _, f := range failed {
		if f.rc != 1 {
			t.Errorf("a run with %s down exited %d, want 1 (transient): %s", c.name(), f.rc, f.out)
		}
	}
	dc := qbtDelivered(r)
	t.Logf("PortDelivered with %s down: %+v", c.name(), dc)
	if dc == nil || dc.Status != api.False || dc.Reason != "HookFailed" || !strings.Contains(dc.Message, "no answer") {
		t.Errorf("PortDelivered with the client down: %+v", dc)
	}
	// Back: delivered at the next attempt, within one backoff step (20 s
	// after the third failure), and the client's start.
	c.start()
	back := time.Now()
	waitFor(t, "PortDelivered again", 40*time.Second, portDeliveredTrue)
	t.Logf("%s back -> PortDelivered after %s (third failure %s before it came back)", c.name(), time.Since(back).Round(100*time.Millisecond), back.Sub(failed[2].at).Round(100*time.Millisecond))
	if p, err := webui.listenPort(); err != nil || p != newPort {
		t.Errorf("%s's port %d (%v), want %d", c.name(), p, err, newPort)
	}

	if cc.refused {
		refusedPhase(t, c, l, r, cred, runLog, refusedWait)
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
	secrets := map[string]string{"PIA private key": strings.TrimSpace(string(key)), "PIA password": "hunter2-stub", "a qBittorrent session cookie": "SID="}
	if c.password != "" {
		secrets["the client's password"] = c.password
	}
	if c.apiKey != "" {
		secrets["the API key"] = c.apiKey
	}
	for _, ck := range webui.h.Jar.Cookies(&url.URL{Scheme: "http", Host: qbtAddr + ":8080"}) {
		secrets["the test's session cookie"] = ck.Value
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

// refusedPhase is acceptance 2: the WebUI password goes wrong (the
// credentials file now holds another) for 30 minutes, shortened: the
// refusal wait is cut from 15 minutes to refusedWait in this daemon, so
// 30 minutes are two waits; and on for one more, to see the hook held.
// qBittorrent's own log says how many failed logins it counted from the
// node: never its ban threshold (5), and it never banned the node, whose
// address still logs in with the right password afterwards.
// PortDelivered says the credentials were refused. Fixed, nodeagentctl
// port --retry's request runs the hook at once.
func refusedPhase(t *testing.T, c *dlClient, l *piastub.Lab, r *running, cred, runLog string, refusedWait time.Duration) {
	qlog := filepath.Join(c.dir, "qBittorrent", "data", "logs", "qbittorrent.log")
	failures := regexp.MustCompile(`WebAPI login failure\. Reason: invalid credentials, attempt count: (\d+), IP: ([0-9.]+)`)
	banned := regexp.MustCompile(`WebAPI login failure\. Reason: IP has been banned`)
	before := len(wrappedRuns(runLog))
	if err := os.WriteFile(cred, []byte("username="+qbtUser+"\npassword=not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Every (5 s) runs it with the wrong password: refused, exit 77.
	waitFor(t, "a refused run", 15*time.Second, func() bool {
		for _, run := range wrappedRuns(runLog)[before:] {
			if run.rc == 77 {
				return true
			}
		}
		return false
	})
	// 30 minutes at 15 minutes a wait (refused at 0, 15, 30), then 15
	// more: held, no fourth.
	time.Sleep(3*refusedWait + 2*time.Second)
	var refused []hookRun
	for _, run := range wrappedRuns(runLog)[before:] {
		if run.rc == 77 {
			refused = append(refused, run)
		} else {
			t.Errorf("a run with the wrong password exited %d: %s", run.rc, run.out)
		}
	}
	var gaps []string
	for i := 1; i < len(refused); i++ {
		gap := refused[i].at.Sub(refused[i-1].at)
		gaps = append(gaps, gap.Round(100*time.Millisecond).String())
		if gap < refusedWait {
			t.Errorf("refused runs %d and %d %s apart, want at least the refusal wait %s", i-1, i, gap, refusedWait)
		}
	}
	var counts []string
	maxCount := 0
	b, _ := os.ReadFile(qlog)
	for _, m := range failures.FindAllStringSubmatch(string(b), -1) {
		counts = append(counts, m[1]+"@"+m[2])
		n, _ := strconv.Atoi(m[1])
		maxCount = max(maxCount, n)
	}
	t.Logf("wrong password for %s (45 minutes at %s a 15-minute wait): %d refused runs, %s apart; qBittorrent counted failed logins %v",
		time.Since(start).Round(100*time.Millisecond), refusedWait, len(refused), gaps, counts)
	if len(refused) != 3 {
		t.Errorf("%d refused runs in 45 (shortened) minutes, want 3: then the hook is held", len(refused))
	}
	if maxCount == 0 || maxCount >= 5 {
		t.Errorf("qBittorrent's failed-login count reached %d (its ban threshold is 5), want 1-4", maxCount)
	}
	if banned.Match(b) {
		t.Error("qBittorrent banned the node's address")
	}
	dc := qbtDelivered(r)
	t.Logf("PortDelivered with the password refused: %+v", dc)
	if dc == nil || dc.Status != api.False || dc.Reason != "CredentialsRefused" || !strings.Contains(dc.Message, "credentials refused") || !strings.Contains(dc.Message, "wrong username or password") {
		t.Errorf("PortDelivered with the password refused: %+v", dc)
	}
	if h := tunnel(r).PortHook; h == nil || !h.Held || h.Refused != 3 {
		t.Errorf("port hook after three refusals: %+v", h)
	}
	// The node's address is not banned: the right password logs in.
	if err := newClientAPI(l.Node, c).qbtLogin(); err != nil {
		t.Errorf("the node's own login with the right password: %v", err)
	}
	// Fixed: the operator's retry runs it now.
	os.WriteFile(cred, []byte("username="+qbtUser+"\npassword="+c.password+"\n"), 0o600)
	if res := r.d.RetryPortHook(t.Context(), ""); len(res.Devices) != 1 || res.Error != "" {
		t.Fatalf("port --retry: %+v", res)
	}
	took := waitFor(t, "PortDelivered after the retry", 10*time.Second, func() bool { c := qbtDelivered(r); return c != nil && c.Status == api.True })
	t.Logf("credentials fixed, port --retry -> PortDelivered after %s", took.Round(10*time.Millisecond))
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
