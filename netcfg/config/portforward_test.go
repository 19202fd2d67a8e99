package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPortHookFields: every and hookTimeout default to 5m and 30s, every
// 0 is kept (no periodic run), and both are bounded and need onChange.
func TestPortHookFields(t *testing.T) {
	const base = "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward:\n        enabled: true\n"
	const hook = "        onChange: [/usr/local/bin/qbt-set-port]\n"
	c, err := parseTest(t, base+hook)
	if err != nil {
		t.Fatal(err)
	}
	if pf := c.WireGuard[0].PIA.PortForward; pf.HookEvery() != 5*time.Minute || pf.HookTimeoutOrDefault() != 30*time.Second {
		t.Errorf("defaults: every %s, hookTimeout %s", pf.HookEvery(), pf.HookTimeoutOrDefault())
	}
	c, err = parseTest(t, base+hook+"        every: 0s\n        hookTimeout: 2m\n")
	if err != nil {
		t.Fatal(err)
	}
	if pf := c.WireGuard[0].PIA.PortForward; pf.HookEvery() != 0 || pf.HookTimeoutOrDefault() != 2*time.Minute {
		t.Errorf("every 0s, hookTimeout 2m read as %s, %s", pf.HookEvery(), pf.HookTimeoutOrDefault())
	}
	for _, tc := range []struct{ src, want string }{
		{hook + "        every: 1s\n", "wireguard[0].pia.portForward.every: 1s is outside 5s-24h"},
		{hook + "        every: 25h\n", "wireguard[0].pia.portForward.every: 25h0m0s is outside 5s-24h"},
		{hook + "        hookTimeout: 500ms\n", "wireguard[0].pia.portForward.hookTimeout: 500ms is outside 1s-10m"},
		{hook + "        hookTimeout: 11m\n", "wireguard[0].pia.portForward.hookTimeout: 11m0s is outside 1s-10m"},
		{"        every: 1m\n", "wireguard[0].pia.portForward.every: set, but there is no onChange to run"},
		{"        hookTimeout: 10s\n", "wireguard[0].pia.portForward.hookTimeout: set, but there is no onChange to run"},
	} {
		_, err := parseTest(t, base+tc.src)
		got := errorStrings(t, err)
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasSuffix(s, tc.want) }) {
			t.Errorf("%q: errors %q, want one ending %q", tc.src, got, tc.want)
		}
	}
}
