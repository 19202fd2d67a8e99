package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/agent/api"
)

// childEnv switches the test binary into a client that reports what it got;
// TestNonRootClient runs it as nobody.
const childEnv = "NODEAGENT_APISERVER_TEST_CHILD"

func TestMain(m *testing.M) {
	if sock := os.Getenv(childEnv); sock != "" {
		os.Exit(runChild(sock))
	}
	os.Exit(m.Run())
}

// childResult is one request the child made.
type childResult struct {
	Code int    `json:"code"`
	Body string `json:"body"`
	Err  string `json:"err"`
}

func runChild(sock string) int {
	c := unixClient(sock)
	out := map[string]childResult{}
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/status"},
		{"POST", "/v1/reload"},
		{"POST", "/v1/port/retry"},
	} {
		var r childResult
		code, body, err := do(c, req.method, req.path, nil)
		r.Code, r.Body = code, body
		if err != nil {
			r.Err = err.Error()
		}
		out[req.method+" "+req.path] = r
	}
	json.NewEncoder(os.Stdout).Encode(out)
	return 0
}

// requireRoot skips t unless it runs as root. These tests are cheap (no
// namespaces), so unlike testenv.RequireRoot they also run under -short, and
// they do not pull netcfg into this package's test build.
func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root to %s; CI runs as root", why)
	}
}

// fakeBackend serves canned answers and counts reloads.
type fakeBackend struct {
	// planHook, when set, runs inside Plan (to hold a request in flight).
	planHook func(context.Context)

	mu      sync.Mutex
	status  api.Status
	plan    api.Plan
	reload  api.Reload
	healthy bool
	reloads int
}

func (f *fakeBackend) Status() api.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

func (f *fakeBackend) Plan(ctx context.Context) api.Plan {
	if f.planHook != nil {
		f.planHook(ctx)
	}
	return f.plan
}

func (f *fakeBackend) Reload(ctx context.Context) api.Reload {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloads++
	return f.reload
}

func (f *fakeBackend) Healthy() bool { return f.healthy }

func (f *fakeBackend) RetryPortHook(ctx context.Context, device string) api.PortRetry {
	if device != "" && device != "wg-pia" {
		return api.PortRetry{Error: device + " is not a PIA device"}
	}
	return api.PortRetry{Devices: []string{"wg-pia"}}
}

func (f *fakeBackend) reloadCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reloads
}

func unixClient(sock string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
		},
	}
}

func do(c *http.Client, method, path string, hdr http.Header) (int, string, error) {
	req, err := http.NewRequest(method, "http://nodeagent"+path, nil)
	if err != nil {
		return 0, "", err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// serve runs Serve on l until the test ends and checks it returns cleanly.
func serve(t *testing.T, l net.Listener, b Backend) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, b, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
}

// start listens on a fresh socket as root's test would and serves b.
func start(t *testing.T, b Backend) (sock string, c *http.Client) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "nodeagent.sock")
	l, err := Listen(Options{Socket: sock, Group: existingGroup(t)})
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	serve(t, l, b)
	return sock, unixClient(sock)
}

// existingGroup is a group to give the socket: nodeagent when the package
// created it, else one every Debian system has. Without root the socket
// cannot be given a group, so it is a missing one: Listen then falls back to
// 0600, which the test's own client can still use.
func existingGroup(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		return "no-such-group-nodeagent-test"
	}
	for _, g := range []string{"nodeagent", "daemon", "nogroup"} {
		if _, err := user.LookupGroup(g); err == nil {
			return g
		}
	}
	t.Skip("no nodeagent, daemon or nogroup group to test with")
	return ""
}

func marshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

func TestEndpoints(t *testing.T) {
	hs := time.Date(2025, 6, 1, 11, 59, 0, 0, time.UTC)
	wg := []api.WireGuardDevice{{
		Name: "wg0", Implementation: "kernel", PublicKey: "srv=", ListenPort: 51820, LivePeers: 1,
		Peers: []api.WireGuardPeer{{PublicKey: "alice=", LastHandshake: &hs, HandshakeAgeSeconds: 60, AllowedIPs: []string{"10.90.0.2/32"}, Live: true}},
	}}
	ready := api.Status{
		Version: "test", Node: "node1", Ready: true, WireGuard: wg,
		Conditions: []api.Condition{{Type: api.CondReady, Status: api.True}, {Type: api.CondConverged, Status: api.True}},
	}
	notReady := api.Status{
		Node:       "node1",
		Conditions: []api.Condition{{Type: api.CondReady, Status: api.False, Reason: "FirstSyncPending"}, {Type: api.CondConverged, Status: api.Unknown}},
	}
	degraded := api.Status{
		Node: "node1", Ready: true, Degraded: true,
		Conditions: []api.Condition{
			{Type: api.CondReady, Status: api.True},
			{Type: api.CondKillSwitchArmed, Status: api.False, Reason: "TableMissing", Message: "nodeagent-ks not in the kernel"},
			{Type: api.CondSafeApply, Status: api.False, Message: "rolled back"},
		},
	}
	plan := api.Plan{Lines: []string{"+ route 0.0.0.0/0 dev wg-pia table 150"}, Error: "wireguard: wg-pia: no key"}

	tests := []struct {
		name     string
		backend  fakeBackend
		method   string
		path     string
		wantCode int
		wantBody string
		// wantAllow is the Allow header of a 405.
		wantAllow string
	}{
		{name: "status", backend: fakeBackend{status: ready}, method: "GET", path: "/v1/status", wantCode: 200, wantBody: marshal(t, ready)},
		{name: "status head", backend: fakeBackend{status: ready}, method: "HEAD", path: "/v1/status", wantCode: 200, wantBody: ""},
		{name: "plan", backend: fakeBackend{plan: plan}, method: "GET", path: "/v1/plan", wantCode: 200, wantBody: marshal(t, plan)},
		{name: "peers", backend: fakeBackend{status: ready}, method: "GET", path: "/v1/peers", wantCode: 200, wantBody: marshal(t, wg)},
		{name: "peers none", backend: fakeBackend{status: notReady}, method: "GET", path: "/v1/peers", wantCode: 200, wantBody: "[]\n"},
		{name: "healthz", backend: fakeBackend{healthy: true}, method: "GET", path: "/healthz", wantCode: 200, wantBody: "ok\n"},
		{name: "healthz loop dead", backend: fakeBackend{}, method: "GET", path: "/healthz", wantCode: 503,
			wantBody: marshal(t, api.Error{Error: "the reconcile loop is not running"})},
		{name: "readyz", backend: fakeBackend{status: ready}, method: "GET", path: "/readyz", wantCode: 200, wantBody: "ok\n"},
		{name: "readyz not ready", backend: fakeBackend{status: notReady}, method: "GET", path: "/readyz", wantCode: 503,
			wantBody: marshal(t, api.Error{Error: "not ready: Ready=False (FirstSyncPending); Converged=Unknown"})},
		{name: "readyz degraded", backend: fakeBackend{status: degraded}, method: "GET", path: "/readyz", wantCode: 503,
			wantBody: marshal(t, api.Error{Error: "degraded: KillSwitchArmed=False (TableMissing: nodeagent-ks not in the kernel); SafeApply=False (rolled back)"})},
		{name: "readyz no conditions", backend: fakeBackend{}, method: "GET", path: "/readyz", wantCode: 503,
			wantBody: marshal(t, api.Error{Error: "not ready"})},
		{name: "status by POST", method: "POST", path: "/v1/status", wantCode: 405, wantAllow: "GET, HEAD",
			wantBody: marshal(t, api.Error{Error: "POST /v1/status: method not allowed (use GET)"})},
		{name: "reload by GET", method: "GET", path: "/v1/reload", wantCode: 405, wantAllow: "POST",
			wantBody: marshal(t, api.Error{Error: "GET /v1/reload: method not allowed (use POST)"})},
		{name: "healthz by DELETE", method: "DELETE", path: "/healthz", wantCode: 405, wantAllow: "GET, HEAD",
			wantBody: marshal(t, api.Error{Error: "DELETE /healthz: method not allowed (use GET)"})},
		{name: "unknown", method: "GET", path: "/v1/secrets", wantCode: 404, wantBody: marshal(t, api.Error{Error: "no such endpoint: /v1/secrets"})},
		{name: "trailing slash", method: "GET", path: "/v1/status/", wantCode: 404, wantBody: marshal(t, api.Error{Error: "no such endpoint: /v1/status/"})},
		{name: "root", method: "GET", path: "/", wantCode: 404, wantBody: marshal(t, api.Error{Error: "no such endpoint: /"})},
	}
	for i := range tests {
		tt := &tests[i] // by pointer: fakeBackend holds a mutex
		t.Run(tt.name, func(t *testing.T) {
			_, c := start(t, &tt.backend)
			req, _ := http.NewRequest(tt.method, "http://nodeagent"+tt.path, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantCode {
				t.Errorf("%s %s: %d, want %d", tt.method, tt.path, resp.StatusCode, tt.wantCode)
			}
			if diff := cmp.Diff(tt.wantBody, string(body)); diff != "" {
				t.Errorf("%s %s body (-want +got):\n%s", tt.method, tt.path, diff)
			}
			if got := resp.Header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tt.wantAllow)
			}
			wantType := "application/json"
			if tt.wantBody == "ok\n" {
				wantType = "text/plain; charset=utf-8"
			}
			if got := resp.Header.Get("Content-Type"); tt.method != "HEAD" && got != wantType {
				t.Errorf("Content-Type = %q, want %q", got, wantType)
			}
		})
	}
}

func TestReloadAsRoot(t *testing.T) {
	requireRoot(t, "be a uid 0 peer")
	want := api.Reload{Applied: false, Errors: []string{"/etc/nodeagent/nodeagent.yaml:3: vlans[0].id: 5000 is outside 1-4094"}, ConfigHash: "abc"}
	b := &fakeBackend{reload: want}
	_, c := start(t, b)
	code, body, err := do(c, "POST", "/v1/reload", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A rejected config is a successful call whose body says why.
	if code != 200 {
		t.Errorf("POST /v1/reload as root: %d, want 200; body %s", code, body)
	}
	if diff := cmp.Diff(marshal(t, want), body); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	if n := b.reloadCount(); n != 1 {
		t.Errorf("backend reloaded %d times, want 1", n)
	}
}

// TestPortRetry: POST /v1/port/retry as root runs the named device's hook
// (or every device's); a device that is not a PIA device is 409 with why;
// a name that is no interface name is refused before the daemon is asked.
func TestPortRetry(t *testing.T) {
	requireRoot(t, "be a uid 0 peer")
	_, c := start(t, &fakeBackend{})
	for _, x := range []struct {
		path string
		code int
		want any
	}{
		{"/v1/port/retry", 200, api.PortRetry{Devices: []string{"wg-pia"}}},
		{"/v1/port/retry?device=wg-pia", 200, api.PortRetry{Devices: []string{"wg-pia"}}},
		{"/v1/port/retry?device=wg0", 409, api.PortRetry{Error: "wg0 is not a PIA device"}},
		{"/v1/port/retry?device=a%2Fb", 400, api.Error{Error: "device: not an interface name"}},
	} {
		code, body, err := do(c, "POST", x.path, nil)
		if err != nil || code != x.code || body != marshal(t, x.want) {
			t.Errorf("POST %s: %d %s (%v), want %d %s", x.path, code, body, err, x.code, marshal(t, x.want))
		}
	}
}

func TestReloadWithoutPeerCredentials(t *testing.T) {
	// Over a transport without SO_PEERCRED (here TCP) nobody is root:
	// the check fails closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBackend{}
	serve(t, l, b)
	resp, err := http.Post("http://"+l.Addr().String()+"/v1/reload", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || string(body) != marshal(t, api.Error{Error: "reload needs root"}) {
		t.Errorf("POST /v1/reload without credentials: %d %s, want 403 reload needs root", resp.StatusCode, body)
	}
	if n := b.reloadCount(); n != 0 {
		t.Errorf("backend reloaded %d times, want 0", n)
	}
}

func TestBrowserRequestsRefused(t *testing.T) {
	b := &fakeBackend{status: api.Status{Ready: true}, healthy: true}
	_, c := start(t, b)
	for _, h := range []struct{ name, value string }{
		{"Origin", "http://evil.example"},
		{"Origin", "null"},
		{"Origin", ""},
		{"Referer", "http://127.0.0.1:8080/"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Mode", "no-cors"},
	} {
		for _, req := range []struct{ method, path string }{
			{"GET", "/v1/status"}, {"POST", "/v1/reload"}, {"GET", "/healthz"}, {"GET", "/nowhere"}, {"OPTIONS", "/v1/reload"},
		} {
			code, body, err := do(c, req.method, req.path, http.Header{h.name: {h.value}})
			if err != nil {
				t.Fatal(err)
			}
			want := marshal(t, api.Error{Error: "requests with a " + h.name + " header are refused: the API is not for browsers"})
			if code != 403 || body != want {
				t.Errorf("%s %s with %s: %q: %d %s, want 403 %s", req.method, req.path, h.name, h.value, code, body, want)
			}
		}
	}
	if n := b.reloadCount(); n != 0 {
		t.Errorf("backend reloaded %d times, want 0", n)
	}
}

func TestRequestLimits(t *testing.T) {
	b := &fakeBackend{}
	_, c := start(t, b)

	req, _ := http.NewRequest("POST", "http://nodeagent/v1/reload", strings.NewReader(strings.Repeat("x", maxBodyBytes+1)))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %s, want 413", resp.Status)
	}

	code, _, err := do(c, "GET", "/v1/status", http.Header{"X-Big": {strings.Repeat("x", 2*maxHeaderBytes)}})
	// The server answers 431 and drops the connection; the client may see
	// the reset while reading the short body, or (racing it) before the
	// status line. Either way the request never reached a handler.
	if code != http.StatusRequestHeaderFieldsTooLarge && !(code == 0 && errors.Is(err, syscall.ECONNRESET)) {
		t.Errorf("oversized header: %d, %v, want 431", code, err)
	}
	if n := b.reloadCount(); n != 0 {
		t.Errorf("backend reloaded %d times, want 0", n)
	}
}

func TestRequestsLoggedAtDebug(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	l, err := Listen(Options{Socket: sock, Group: existingGroup(t)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, &fakeBackend{}, log) }()
	if _, _, err := do(unixClient(sock), "GET", "/v1/status", nil); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	want := `level=DEBUG msg="API request" method=GET path=/v1/status status=200`
	if !strings.Contains(logs.String(), want) || !strings.Contains(logs.String(), "peer_uid="+strconv.Itoa(os.Getuid())) {
		t.Errorf("log lacks %q with peer_uid; log:\n%s", want, logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

func TestListenModeAndGroup(t *testing.T) {
	requireRoot(t, "give the socket a group")
	group := existingGroup(t)
	g, _ := user.LookupGroup(group)
	gid, _ := strconv.Atoi(g.Gid)

	t.Run("group exists", func(t *testing.T) {
		// The parent directory does not exist yet: Listen creates it.
		dir := filepath.Join(t.TempDir(), "run", "nodeagent")
		sock := filepath.Join(dir, "nodeagent.sock")
		l, err := Listen(Options{Socket: sock, Group: group})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		checkFile(t, sock, fs.ModeSocket|0o660, gid)
		checkFile(t, dir, fs.ModeDir|0o750, gid)
		if got := l.Addr().String(); got != sock {
			t.Errorf("Addr() = %q, want %q", got, sock)
		}
		// Nothing of the private bind directory is left behind.
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 {
			t.Errorf("socket directory holds %v, want only the socket", ents)
		}
	})
	t.Run("group missing", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "nodeagent.sock")
		var logs bytes.Buffer
		l, err := Listen(Options{Socket: sock, Group: "no-such-group-nodeagent-test", Log: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		checkFile(t, sock, fs.ModeSocket|0o600, os.Getgid())
		if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "only root can use the API") {
			t.Errorf("no warning about the missing group; log:\n%s", logs.String())
		}
	})
}

func checkFile(t *testing.T, path string, mode fs.FileMode, gid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != mode {
		t.Errorf("%s: mode %v, want %v", path, got, mode)
	}
	if got := int(fi.Sys().(*syscall.Stat_t).Gid); got != gid {
		t.Errorf("%s: gid %d, want %d", path, got, gid)
	}
}

func TestListenStaleAndLive(t *testing.T) {
	group := existingGroup(t)
	t.Run("stale socket replaced", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "nodeagent.sock")
		// A crashed daemon's socket: the file remains, nobody listens.
		old, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		old.SetUnlinkOnClose(false)
		old.Close()

		l, err := Listen(Options{Socket: sock, Group: group})
		if err != nil {
			t.Fatalf("Listen over a stale socket: %v", err)
		}
		serve(t, l, &fakeBackend{healthy: true})
		if code, _, err := do(unixClient(sock), "GET", "/healthz", nil); err != nil || code != 200 {
			t.Errorf("GET /healthz on the new socket: %d, %v", code, err)
		}
	})
	t.Run("live socket refused", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "nodeagent.sock")
		first, err := Listen(Options{Socket: sock, Group: group})
		if err != nil {
			t.Fatal(err)
		}
		b := &fakeBackend{healthy: true}
		serve(t, first, b)
		before, _ := os.Lstat(sock)

		second, err := Listen(Options{Socket: sock, Group: group})
		if err == nil {
			second.Close()
			t.Fatal("second Listen on a live socket succeeded")
		}
		if !strings.Contains(err.Error(), "another server is listening") {
			t.Errorf("second Listen: %v, want another server is listening", err)
		}
		after, _ := os.Lstat(sock)
		if !os.SameFile(before, after) {
			t.Error("the live server's socket file was replaced")
		}
		if code, _, err := do(unixClient(sock), "GET", "/healthz", nil); err != nil || code != 200 {
			t.Errorf("first server after the refused Listen: %d, %v", code, err)
		}
	})
	t.Run("not a socket", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "nodeagent.sock")
		if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
			t.Fatal(err)
		}
		if l, err := Listen(Options{Socket: path, Group: group}); err == nil {
			l.Close()
			t.Fatal("Listen over a regular file succeeded")
		}
		if b, _ := os.ReadFile(path); string(b) != "precious" {
			t.Errorf("regular file clobbered: %q", b)
		}
	})
}

func TestShutdownRemovesSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nodeagent.sock")
	l, err := Listen(Options{Socket: sock, Group: existingGroup(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, &fakeBackend{healthy: true}, nil) }()
	if code, _, err := do(unixClient(sock), "GET", "/healthz", nil); err != nil || code != 200 {
		t.Fatalf("GET /healthz: %d, %v", code, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket still there after shutdown: %v", err)
	}
}

func TestShutdownFinishesRequestsInFlight(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nodeagent.sock")
	l, err := Listen(Options{Socket: sock, Group: existingGroup(t)})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var ctxErr error
	b := &fakeBackend{plan: api.Plan{Lines: []string{"~ nothing"}}, planHook: func(ctx context.Context) {
		close(entered)
		<-release
		ctxErr = ctx.Err()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, b, nil) }()

	type result struct {
		code int
		err  error
	}
	got := make(chan result, 1)
	go func() {
		code, _, err := do(unixClient(sock), "GET", "/v1/plan", nil)
		got <- result{code, err}
	}()
	<-entered
	cancel() // the daemon stops while a plan is being computed
	time.Sleep(50 * time.Millisecond)
	close(release)

	if r := <-got; r.err != nil || r.code != 200 {
		t.Errorf("GET /v1/plan across shutdown: %d, %v, want 200", r.code, r.err)
	}
	if ctxErr != nil {
		t.Errorf("request context ended by shutdown: %v", ctxErr)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket still there after shutdown: %v", err)
	}
}

func TestCloseLeavesReplacedSocket(t *testing.T) {
	// If another server has taken the path over (say an operator removed a
	// wedged daemon's socket and started a new one), closing the old
	// listener must not delete the new server's socket.
	sock := filepath.Join(t.TempDir(), "nodeagent.sock")
	l, err := Listen(Options{Socket: sock, Group: existingGroup(t)})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(sock)
	other, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("the other server's socket was removed: %v", err)
	}
}

// TestNonRootClient runs real unprivileged clients: the test binary re-execs
// itself as nobody. In the socket's group it may read but not reload; outside
// it, it cannot connect at all.
func TestNonRootClient(t *testing.T) {
	requireRoot(t, "run the client as nobody and give the socket a group")
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no nobody user: %v", err)
	}
	nogroup, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skipf("no nogroup group: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nogroup.Gid)

	// go test builds the binary in a 0700 directory nobody cannot enter;
	// copy it next to the socket, in a directory nobody can traverse.
	dir, err := os.MkdirTemp("", "nodeagent-apiserver-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "apiserver.test")
	copyExecutable(t, bin)

	sock := filepath.Join(dir, "nodeagent.sock")
	l, err := Listen(Options{Socket: sock, Group: nogroup.Name})
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBackend{status: api.Status{Node: "node1", Ready: true}, reload: api.Reload{Applied: true}}
	serve(t, l, b)

	child := func(t *testing.T, gid int) map[string]childResult {
		t.Helper()
		cmd := exec.Command(bin)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), childEnv+"="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child as %d:%d: %v\n%s", uid, gid, err, stderr.String())
		}
		var res map[string]childResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("child output %q: %v", out, err)
		}
		return res
	}

	t.Run("in the group", func(t *testing.T) {
		res := child(t, gid)
		want := map[string]childResult{
			"GET /v1/status":      {Code: 200, Body: marshal(t, b.Status())},
			"POST /v1/reload":     {Code: 403, Body: marshal(t, api.Error{Error: "reload needs root"})},
			"POST /v1/port/retry": {Code: 403, Body: marshal(t, api.Error{Error: "port/retry needs root"})},
		}
		if diff := cmp.Diff(want, res); diff != "" {
			t.Errorf("as nobody:nogroup (-want +got):\n%s", diff)
		}
	})
	t.Run("outside the group", func(t *testing.T) {
		daemon, err := user.LookupGroup("daemon")
		if err != nil {
			t.Skipf("no daemon group: %v", err)
		}
		other, _ := strconv.Atoi(daemon.Gid)
		res := child(t, other)
		for req, r := range res {
			if r.Code != 0 || !strings.Contains(r.Err, "permission denied") {
				t.Errorf("%s as nobody:daemon: %d %q, want permission denied", req, r.Code, r.Err)
			}
		}
	})
	if n := b.reloadCount(); n != 0 {
		t.Errorf("backend reloaded %d times for nobody, want 0", n)
	}
}

func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
