package metrics

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
	// gluetun's shape exactly: {"port":N}, nothing else.
	p, ok := body["port"].(float64)
	if !ok || len(body) != 1 {
		t.Fatalf("GET /v1/portforward answered %s, want {\"port\":N}", rec.Body)
	}
	return int(p)
}

// TestPortForward: /v1/portforward follows SetForwardedPort: 0 with no
// port, the port once bound, the new one after a change, 0 again when it
// is lost; with several devices, the first by name that has one.
func TestPortForward(t *testing.T) {
	m := New()
	h := m.PortForwardHandler()
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
	resp, err := http.Get(base + "/v1/portforward")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != `{"port":47001}` {
		t.Errorf("GET /v1/portforward: %s %s", resp.Status, body)
	}
	resp, err = http.Post(base+"/v1/portforward", "application/json", strings.NewReader(`{"port":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /v1/portforward: %s, want 405", resp.Status)
	}
}
