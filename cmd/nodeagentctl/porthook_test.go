package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodeagent/nodeagent/agent/api"
)

// TestRenderPortHook: the PIA section shows the port hook's state, its
// last run and exit status, the first line of its error and its attempts.
func TestRenderPortHook(t *testing.T) {
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	for _, tc := range []struct {
		h    api.PortHook
		want string
	}{
		{api.PortHook{}, "  port hook:         no port yet\n"},
		{api.PortHook{Port: 47123, Delivered: true, LastRun: at(-time.Minute), LastExit: "exit 0", NextRun: at(4 * time.Minute)},
			"  port hook:         delivered port 47123\n" +
				"  hook last run:     2026-12-01 08:59:00 UTC (1m0s ago), exit 0\n" +
				"  hook next run:     2026-12-01 09:04:00 UTC (in 4m0s)\n"},
		{api.PortHook{Port: 47123, Attempts: 3, LastRun: at(-10 * time.Second), LastExit: "timeout", LastError: "timed out after 30s: waiting\tfor qbittorrent", NextRun: at(10 * time.Second)},
			"  port hook:         failing, 3 failed attempts\n" +
				"  hook last run:     2026-12-01 08:59:50 UTC (10s ago), timeout\n" +
				"  hook error:        timed out after 30s: waiting for qbittorrent\n" +
				"  hook next run:     2026-12-01 09:00:10 UTC (in 10s)\n"},
		{api.PortHook{Lost: true, Delivered: true}, "  port hook:         told the port is lost\n"},
		{api.PortHook{Port: 51000, Running: true}, "  port hook:         running\n"},
	} {
		var b strings.Builder
		h := tc.h
		renderPIA(&b, api.PIATunnel{Device: "wg-pia", Phase: "healthy", Healthy: true, Region: "nl_amsterdam", PortHook: &h}, now)
		got := b.String()
		if i := strings.Index(got, "  port hook:"); i >= 0 {
			got = got[i:]
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%+v (-want +got):\n%s", tc.h, d)
		}
	}
}
