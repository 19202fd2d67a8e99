package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/agent/api"
)

// serve starts an HTTP server on a unix socket in a temporary directory and
// returns the socket's path.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

var (
	t0     = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	status = &api.Status{
		Version: "v1", Node: "node-a", ConfigFile: "/etc/nodeagent/nodeagent.yaml", ConfigHash: "abc123",
		Started: t0, Ready: true,
		Conditions: []api.Condition{{Type: api.CondReady, Status: api.True, Reason: "Converged", LastTransitionTime: t0}},
		LastSync:   &api.Sync{Time: t0, DurationMS: 41.5, Trigger: "start", Changes: 3, Count: 1},
		Subsystems: []api.Subsystem{{Name: "links", Changes: 3}},
		Pending:    []api.Object{},
		Failed:     []api.Object{},
		WireGuard:  []api.WireGuardDevice{},
	}
	peers = []api.WireGuardDevice{{Name: "wg0", Implementation: "kernel", PublicKey: "pub", ListenPort: 51820,
		Peers: []api.WireGuardPeer{{PublicKey: "peer", Name: "laptop", HandshakeAgeSeconds: -1, AllowedIPs: []string{"10.90.0.2/32"}}}}}
)

// fakeDaemon serves canned replies and records what it was sent.
func fakeDaemon(t *testing.T, got *[]string) http.Handler {
	mux := http.NewServeMux()
	record := func(r *http.Request) {
		*got = append(*got, r.Method+" "+r.Host+" "+r.URL.Path+" origin="+r.Header.Get("Origin"))
	}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { record(r); reply(w, 200, status) })
	mux.HandleFunc("GET /v1/plan", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		reply(w, 200, api.Plan{Lines: []string{"+ link shim0"}})
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		reply(w, 200, api.Reload{Applied: true, ConfigHash: "def456"})
	})
	mux.HandleFunc("GET /v1/peers", func(w http.ResponseWriter, r *http.Request) { record(r); reply(w, 200, peers) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { record(r); w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		reply(w, http.StatusServiceUnavailable, api.Error{Error: "not ready: Converged=False"})
	})
	return mux
}

func TestClientEndpoints(t *testing.T) {
	var got []string
	c := api.NewClient(serve(t, fakeDaemon(t, &got)))
	defer c.CloseIdleConnections()
	ctx := context.Background()

	s, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(status, s); d != "" {
		t.Errorf("Status (-want +got):\n%s", d)
	}
	p, err := c.Plan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&api.Plan{Lines: []string{"+ link shim0"}}, p); d != "" {
		t.Errorf("Plan (-want +got):\n%s", d)
	}
	r, err := c.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(&api.Reload{Applied: true, ConfigHash: "def456"}, r); d != "" {
		t.Errorf("Reload (-want +got):\n%s", d)
	}
	devs, err := c.Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(peers, devs); d != "" {
		t.Errorf("Peers (-want +got):\n%s", d)
	}
	if err := c.Healthz(ctx); err != nil {
		t.Errorf("Healthz: %v", err)
	}
	err = c.Readyz(ctx)
	if d := cmp.Diff(&api.HTTPError{Code: 503, Message: "not ready: Converged=False"}, err); d != "" {
		t.Errorf("Readyz (-want +got):\n%s", d)
	}
	// Never an Origin (the daemon refuses those), always the placeholder host.
	want := []string{
		"GET nodeagent /v1/status origin=",
		"GET nodeagent /v1/plan origin=",
		"POST nodeagent /v1/reload origin=",
		"GET nodeagent /v1/peers origin=",
		"GET nodeagent /healthz origin=",
		"GET nodeagent /readyz origin=",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("requests (-want +got):\n%s", d)
	}
}

func TestClientHTTPErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusForbidden, api.Error{Error: "reload needs root"})
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://elsewhere.example/v1/status", http.StatusFound)
	})
	mux.HandleFunc("GET /v1/plan", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "plain text failure", http.StatusInternalServerError)
	})
	mux.HandleFunc("GET /v1/peers", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("{not json")) })
	c := api.NewClient(serve(t, mux))
	defer c.CloseIdleConnections()
	ctx := context.Background()

	_, reloadErr := c.Reload(ctx)
	_, statusErr := c.Status(ctx)
	_, planErr := c.Plan(ctx)
	tests := []struct {
		name string
		err  error
		want *api.HTTPError
	}{
		{"403 with an api.Error body", reloadErr, &api.HTTPError{Code: 403, Message: "reload needs root"}},
		// The redirect is not followed: elsewhere.example is never asked.
		{"redirect", statusErr, &api.HTTPError{Code: 302, Message: "redirect to http://elsewhere.example/v1/status (not followed)"}},
		{"text body", planErr, &api.HTTPError{Code: 500, Message: "plain text failure"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var herr *api.HTTPError
			if !errors.As(tt.err, &herr) {
				t.Fatalf("error %v (%T), want an *api.HTTPError", tt.err, tt.err)
			}
			if d := cmp.Diff(tt.want, herr); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if errors.Is(tt.err, api.ErrUnreachable) {
				t.Errorf("%v is ErrUnreachable; the daemon answered", tt.err)
			}
		})
	}
	if got, want := reloadErr.Error(), "403 Forbidden: reload needs root"; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	if _, err := c.Peers(ctx); err == nil || !strings.Contains(err.Error(), "GET /v1/peers: decoding the reply") {
		t.Errorf("bad JSON: %v", err)
	}
}

func TestClientUnreachable(t *testing.T) {
	dir := t.TempDir()
	// A socket file nobody listens on: connect is refused.
	refused := filepath.Join(dir, "refused.sock")
	l, err := net.Listen("unix", refused)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	tests := []struct {
		name   string
		socket string
		errno  syscall.Errno
	}{
		{"missing", filepath.Join(dir, "missing.sock"), syscall.ENOENT},
		{"refused", refused, syscall.ECONNREFUSED},
	}
	if os.Geteuid() != 0 {
		// Root connects regardless of the socket's mode.
		denied := filepath.Join(dir, "denied")
		os.Mkdir(denied, 0o700)
		dl, err := net.Listen("unix", filepath.Join(denied, "s.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer dl.Close()
		os.Chmod(denied, 0)
		defer os.Chmod(denied, 0o700)
		tests = append(tests, struct {
			name   string
			socket string
			errno  syscall.Errno
		}{"denied", filepath.Join(denied, "s.sock"), syscall.EACCES})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := api.NewClient(tt.socket)
			_, err := c.Status(context.Background())
			if !errors.Is(err, api.ErrUnreachable) {
				t.Fatalf("error %v, want ErrUnreachable", err)
			}
			if !errors.Is(err, tt.errno) {
				t.Errorf("error %v, want it to wrap %v", err, tt.errno)
			}
			want := "cannot reach nodeagent at " + tt.socket + ": connect: " + tt.errno.Error()
			if err.Error() != want {
				t.Errorf("text %q, want %q", err.Error(), want)
			}
			if err := c.Healthz(context.Background()); !errors.Is(err, api.ErrUnreachable) {
				t.Errorf("Healthz: %v, want ErrUnreachable", err)
			}
		})
	}
}

// TestClientContextBoundsRequest: a daemon that accepts and never answers
// holds the caller only as long as its context allows.
func TestClientContextBoundsRequest(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	sock := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	c := api.NewClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Status(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want a deadline", err)
	}
	if errors.Is(err, api.ErrUnreachable) {
		t.Errorf("%v is ErrUnreachable; the daemon accepted the connection", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Status took %v with a 100ms context", d)
	}
}
