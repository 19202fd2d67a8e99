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
		{api.PortHook{Port: 51000, Attempts: 3, Refused: 3, Held: true, LastRun: at(-time.Minute), LastExit: "exit 77", LastTookSeconds: func() *float64 { v := 0.42; return &v }(),
			LastError: "exit status 77: qbittorrent-port: login refused"},
			"  port hook:         credentials refused 3 times in a row: not run again until fixed and `nodeagentctl port --retry`, 3 failed attempts\n" +
				"  hook last run:     2026-12-01 08:59:00 UTC (1m0s ago), exit 77, took 0.4s\n" +
				"  hook error:        exit status 77: qbittorrent-port: login refused\n"},
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

// TestRenderPortLost: a lost port is shown lost, with since when and the
// last good bind; trouble not yet a loss is shown as such.
func TestRenderPortLost(t *testing.T) {
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	var b strings.Builder
	renderPIA(&b, api.PIATunnel{Device: "wg-pia", Phase: "healthy", Healthy: true, LastBind: at(-30 * time.Minute),
		PortLost: &api.PortLost{Port: 47047, Since: now.Add(-time.Minute)}}, now)
	if want := "  forwarded port:    lost: 47047 since 2026-12-01 08:59:00 UTC (1m0s ago) (last good bind 2026-12-01 08:30:00 UTC (30m0s ago)); no DNAT, file or metric until a port is bound again\n"; !strings.Contains(b.String(), want) {
		t.Errorf("lost:\n%s\nwant a line\n%s", b.String(), want)
	}
	b.Reset()
	renderPIA(&b, api.PIATunnel{Device: "wg-pia", Phase: "healthy", Healthy: true, ForwardedPort: 47047, LastBind: at(-16 * time.Minute), PortTroubleSince: at(-time.Minute)}, now)
	if want := "  port trouble:      not kept bound since 2026-12-01 08:59:00 UTC (1m0s ago) (lost after 15 minutes of it)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("trouble:\n%s\nwant a line\n%s", b.String(), want)
	}
}
