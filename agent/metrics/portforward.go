package metrics

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"

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

// PortForwardHandler answers GET /v1/portforward with {"port":N}, the
// shape of gluetun's control server, so a helper written for gluetun (a
// qBittorrent port syncer) can read nodeagent's port unchanged. It is
// read-only: any other method is 405.
func (m *Metrics) PortForwardHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(struct {
			Port int `json:"port"`
		}{m.ForwardedPort()})
	})
}
