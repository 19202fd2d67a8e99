package metrics

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// getPort asks h for GET /v1/portforward and returns the port it answers.
func getPort(t *testing.T, h http.Handler) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/portforward", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/portforward: %d %q\n%s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("GET /v1/portforward: %v\n%s", err, rec.Body)
	}
	// gluetun's shape exactly: {"port":N,"ports":[N]} ([] without a
	// port), nothing else.
	p, ok := body["port"].(float64)
	ports, ok2 := body["ports"].([]any)
	if !ok || !ok2 || len(body) != 2 || p == 0 && len(ports) != 0 || p != 0 && (len(ports) != 1 || ports[0] != p) {
		t.Fatalf("GET /v1/portforward answered %s, want {\"port\":N,\"ports\":[N]}", rec.Body)
	}
	return int(p)
}

// TestPortForward: /v1/portforward follows SetForwardedPort: 0 with no
// port, the port once bound, the new one after a change, 0 again when it
// is lost; with several devices, the first by name that has one.
func TestPortForward(t *testing.T) {
	m := New()
	h := m.PortForwardHandler("")
	steps := []struct {
		dev  string
		port int
		want int
	}{
		{"", 0, 0},
		{"wgpia", 0, 0}, // port forwarding on, no port bound yet
		{"wgpia", 47001, 47001},
		{"wgpia", 51820, 51820},
		{"wgzz", 40000, 51820},
		{"wgaa", 0, 51820},
		{"wgaa", 42000, 42000},
		{"wgaa", 0, 51820},
		{"wgpia", 0, 40000},
		{"wgzz", 0, 0},
	}
	for _, s := range steps {
		if s.dev != "" {
			m.SetForwardedPort(s.dev, s.port)
		}
		if got := getPort(t, h); got != s.want {
			t.Errorf("after %s=%d: port %d, want %d", s.dev, s.port, got, s.want)
		}
		if got := m.ForwardedPort(); got != s.want {
			t.Errorf("after %s=%d: ForwardedPort %d, want %d", s.dev, s.port, got, s.want)
		}
	}

	// Read-only.
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "/v1/portforward", strings.NewReader(`{"port":1}`)))
		if rec.Code != http.StatusMethodNotAllowed || !strings.Contains(rec.Header().Get("Allow"), "GET") {
			t.Errorf("%s /v1/portforward: %d, Allow %q; want 405 naming GET", method, rec.Code, rec.Header().Get("Allow"))
		}
	}
	if got := m.ForwardedPort(); got != 0 {
		t.Errorf("a POST changed the port to %d", got)
	}
}

// TestPortForwardServed: the endpoint is on the metrics listener.
func TestPortForwardServed(t *testing.T) {
	m := New()
	m.SetForwardedPort("wgpia", 47001)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.ServeListener(ctx, l, nil) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("ServeListener did not return after cancel")
		}
	}()
	base := "http://" + l.Addr().String()
	for _, path := range []string{"/v1/portforward", "/v1/openvpn/portforwarded"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != `{"port":47001,"ports":[47001]}` {
			t.Errorf("GET %s: %s %s", path, resp.Status, body)
		}
	}
	resp, err := http.Post(base+"/v1/portforward", "application/json", strings.NewReader(`{"port":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/portforward: %s, want 405", resp.Status)
	}
}

// TestPortForwardAPIKey: with a key, both paths answer only a request
// that carries it, as X-API-Key (gluetun's header) or as a bearer token;
// without it, or with another, 401 and no port.
func TestPortForwardAPIKey(t *testing.T) {
	m := New()
	m.SetForwardedPort("wgpia", 47001)
	h := m.PortForwardHandler("s3cret-key")
	for _, c := range []struct {
		name   string
		header [2]string
		code   int
	}{
		{"none", [2]string{}, 401},
		{"X-API-Key", [2]string{"X-API-Key", "s3cret-key"}, 200},
		{"bearer", [2]string{"Authorization", "Bearer s3cret-key"}, 200},
		{"another key", [2]string{"X-API-Key", "s3cret-kez"}, 401},
		{"a prefix of it", [2]string{"X-API-Key", "s3cret"}, 401},
		{"basic auth", [2]string{"Authorization", "Basic czNjcmV0LWtleQ=="}, 401},
	} {
		for _, path := range PortPaths {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			if c.header[0] != "" {
				req.Header.Set(c.header[0], c.header[1])
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.code || c.code == 401 && strings.Contains(rec.Body.String(), "47001") {
				t.Errorf("%s %s: %d %s, want %d", c.name, path, rec.Code, rec.Body, c.code)
			}
		}
	}
}

// TestReadAPIKey: the key file is held to a key file's rules, and its
// line to what a header can carry; no error quotes it.
func TestReadAPIKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), mode)
		os.Chmod(p, mode)
		return p
	}
	if k, err := ReadAPIKey(write("good", "s3cret-key\n", 0o600)); err != nil || k != "s3cret-key" {
		t.Errorf("good: %q %v", k, err)
	}
	for name, f := range map[string]string{
		"open":   write("open", "s3cret-key\n", 0o644),
		"empty":  write("empty", "\n", 0o600),
		"spaces": write("spaces", "s3cret key\n", 0o600),
		"two":    write("two", "s3cret\nkey\n", 0o600),
	} {
		if _, err := ReadAPIKey(f); err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v, want an error that does not quote the key", name, err)
		}
	}
}
