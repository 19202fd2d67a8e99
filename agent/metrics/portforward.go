package metrics

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// ForwardedPort is the port the /v1/portforward endpoint answers: that of
// the first device, by name, with a forwarded port bound (as
// SetForwardedPort last set it), or 0 when none has one. A node normally
// has one PIA device; with several, a client that needs another's port
// reads that device's port file or metric.
func (m *Metrics) ForwardedPort() int {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		m.forwardedPort.Collect(ch)
		close(ch)
	}()
	type devPort struct {
		dev  string
		port int
	}
	var ports []devPort
	for pm := range ch {
		var d dto.Metric
		if pm.Write(&d) != nil || d.GetGauge().GetValue() <= 0 {
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == "device" {
				ports = append(ports, devPort{l.GetValue(), int(d.GetGauge().GetValue())})
			}
		}
	}
	if len(ports) == 0 {
		return 0
	}
	return slices.MinFunc(ports, func(a, b devPort) int { return strings.Compare(a.dev, b.dev) }).port
}

// PortForwardHandler answers GET /v1/portforward and GET
// /v1/openvpn/portforwarded with {"port":N,"ports":[N]} (port 0 and
// ports [] without one), the shape of gluetun's control server, so a
// helper written for gluetun (a qBittorrent port syncer, which may call
// either path, and not follow a redirect) reads nodeagent's port
// unchanged. It is read-only: any other method is 405. With apiKey set,
// a request must carry it, as gluetun takes it (X-API-Key) or as a bearer
// token (Authorization: Bearer KEY); without it the answer is 401.
func (m *Metrics) PortForwardHandler(apiKey string) http.Handler {
	want := sha256.Sum256([]byte(apiKey))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if apiKey != "" {
			got := r.Header.Get("X-API-Key")
			if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && got == "" {
				got = strings.TrimSpace(b)
			}
			sum := sha256.Sum256([]byte(got))
			if got == "" || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="nodeagent"`)
				http.Error(w, "unauthorized: send the API key as X-API-Key or Authorization: Bearer", http.StatusUnauthorized)
				return
			}
		}
		port := m.ForwardedPort()
		body := struct {
			Port  int   `json:"port"`
			Ports []int `json:"ports"`
		}{port, []int{}}
		if port != 0 {
			body.Ports = []int{port}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(body)
	})
}

// PortPaths are the paths PortForwardHandler serves on the metrics
// listener: gluetun's current one and the older one sidecars still call.
var PortPaths = []string{"/v1/portforward", "/v1/openvpn/portforwarded"}

// maxAPIKey bounds an API key file.
const maxAPIKey = 1024

// ReadAPIKey reads the forwarded port endpoints' API key from path: a
// file root owns, that group and others may not read, without following
// a link, holding one line of visible ASCII (a header value as sent).
// Errors name the file, never its contents.
func ReadAPIKey(path string) (string, error) {
	b, err := fsafe.ReadFile(path, fsafe.Rules{MaxSize: maxAPIKey, Private: true, RootOwned: true})
	if err != nil {
		return "", err
	}
	key := strings.TrimRight(string(b), "\r\n")
	switch {
	case key == "":
		return "", fmt.Errorf("%s is empty", path)
	case strings.ContainsFunc(key, func(c rune) bool { return c <= ' ' || c > '~' }):
		return "", fmt.Errorf("%s: the key must be one line of visible ASCII characters (no spaces)", path)
	}
	return key, nil
}
