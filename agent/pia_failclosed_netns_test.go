package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// Issue 29 §3 against the real daemon in the lab: DNS fails closed when
// the provider cannot run.

// TestPIABrokenProviderRedirectsDNS: a PIA device whose provider cannot
// start (its caFile is missing) dropped the DNS redirect, so the VLAN's
// DNS to the node was answered by the node's own resolver. The redirect
// stays, to PIA's default resolver, where the kill switch holds it back:
// no answer, nothing at the node's resolver, nothing on the WAN.
func TestPIABrokenProviderRedirectsDNS(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.PIA = "      dns:\n        for: [10.10.50.0/24]"
	l.Files.CAFile = filepath.Join(l.Dir, "no-such-ca.crt")
	l.WriteConfig(t, "stub_ams")
	own := serveDNSOn(t, l.Node, "10.10.50.1:53")
	// The node's resolver hears the VLAN before the daemon runs: what
	// follows is not a lab that cannot reach it anyway.
	dnsQuery(l.LAN, "10.10.50.1", piastub.TestName)
	waitFor(t, "the node's resolver hearing the VLAN", 5*time.Second, func() bool { return own() > 0 })
	heard := own()

	// A broken device fails every sync, so the daemon never reports
	// ready: started without waiting for it.
	r := startUnready(t, l, fastPIA)
	waitFor(t, "the provider reported broken", 30*time.Second, func() bool {
		tu := tunnel(r)
		return tu.Phase == "broken" && strings.Contains(tu.LastError, "caFile")
	})
	waitFor(t, "the kill switch in place", 30*time.Second, func() bool {
		ruleset, _ := l.Node.TryExec("nft", "list", "table", "inet", "nodeagent")
		return strings.Contains(ruleset, "nodeagent kill switch")
	})
	for _, server := range []string{"10.10.50.1", "192.0.2.2", "9.9.9.9"} {
		if a, err := dnsQuery(l.LAN, server, piastub.TestName); err == nil {
			t.Errorf("with no provider, a query to %s was answered: %v", server, a)
		}
	}
	if n := own() - heard; n != 0 {
		t.Errorf("with no provider the node's own resolver heard %d VLAN queries", n)
	}
	if n := l.DNSLeaks(t); n != 0 {
		t.Errorf("%d DNS packets reached the WAN", n)
	}
	if ruleset := l.Node.Exec(t, "nft", "list", "table", "inet", "nodeagent"); !strings.Contains(ruleset, "dnat ip to "+pia.DefaultDNS.String()) {
		t.Errorf("no DNS redirect to %s in the ruleset:\n%s", pia.DefaultDNS, ruleset)
	}
	l.NoLeaks(t, "a broken provider")
}

// startUnready runs the daemon on the lab until the test ends, as
// startPIA does, without waiting for it to report ready.
func startUnready(t *testing.T, l *piastub.Lab, timers pia.Timers) *running {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	r := &running{log: &testenv.SyncBuffer{}, done: make(chan error, 1), socket: filepath.Join(dir, "nodeagent.sock")}
	d, err := NewDaemon(RunOptions{
		Options: Options{Config: l.Config, TablesFile: filepath.Join(dir, "rt_tables.conf"), StateDir: l.StateDir},
		Socket:  r.socket, SocketGroup: "nogroup", Host: l.Node.Host, Version: "test", PIATimers: timers,
		Log: slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	r.d = d
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("daemon log:\n%s", r.log.String())
		}
	})
	return r
}
