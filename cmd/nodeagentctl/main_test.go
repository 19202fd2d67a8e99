package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/spf13/pflag"
)

// now is the clock of every test: ages in the expected text are relative
// to it.
var now = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

// Statuses the fake daemon serves.
var (
	wg0 = api.WireGuardDevice{
		Name: "wg0", Implementation: "kernel", PublicKey: "SRVpubKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", ListenPort: 51820, LivePeers: 1,
		Peers: []api.WireGuardPeer{
			{PublicKey: "LAPpubKeyBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB=", Name: "laptop", Endpoint: "203.0.113.5:51234",
				LastHandshake: ptr(now.Add(-12 * time.Second)), HandshakeAgeSeconds: 12, RxBytes: 1536, TxBytes: 3 << 20,
				AllowedIPs: []string{"10.90.0.2/32"}, Live: true},
			{PublicKey: "PHNpubKeyCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC=", HandshakeAgeSeconds: -1, AllowedIPs: []string{"10.90.0.3/32", "fd90::3/128"}},
		},
	}
	readyStatus = &api.Status{
		Version: "v0.5.0", Node: "node-a", ConfigFile: "/etc/nodeagent/nodeagent.yaml", ConfigHash: "3f2a9c1b",
		Started: now.Add(-2 * time.Hour), Ready: true,
		Conditions: []api.Condition{
			{Type: api.CondReady, Status: api.True, Reason: "Converged", LastTransitionTime: now.Add(-119 * time.Minute)},
			{Type: api.CondConverged, Status: api.True, Reason: "Synced", Message: "3 changes", LastTransitionTime: now.Add(-119 * time.Minute)},
			{Type: api.CondConfigLoaded, Status: api.True, LastTransitionTime: now.Add(-2 * time.Hour)},
		},
		LastSync:   &api.Sync{Time: now.Add(-12 * time.Second), DurationMS: 41.2, Trigger: "resync", Changes: 0, Count: 17},
		Subsystems: []api.Subsystem{{Name: "links", Changes: 0}, {Name: "wireguard", Changes: 0}},
		Pending:    []api.Object{},
		Failed:     []api.Object{},
		WireGuard:  []api.WireGuardDevice{wg0},
	}
	degradedStatus = &api.Status{
		Version: "v0.5.0", Node: "node-a", ConfigFile: "/etc/nodeagent/nodeagent.yaml", ConfigHash: "3f2a9c1b",
		Started: now.Add(-50 * time.Hour), Ready: true, Degraded: true,
		Conditions: []api.Condition{
			{Type: api.CondReady, Status: api.True, Reason: "Converged", LastTransitionTime: now.Add(-49 * time.Hour)},
			{Type: api.CondSafeApply, Status: api.False, Reason: "RolledBack", Message: "probe gateway-ping failed after the change", LastTransitionTime: now.Add(-303 * time.Second)},
		},
		LastSync:   &api.Sync{Time: now.Add(-5 * time.Minute), DurationMS: 1204.5, Trigger: "config", Changes: 2, Count: 40},
		Subsystems: []api.Subsystem{{Name: "routes", Changes: 2}},
		Pending:    []api.Object{{Subsystem: "routes", Message: "route default table 150: pending: dev wg-pia does not exist"}},
		Failed:     []api.Object{},
		WireGuard:  []api.WireGuardDevice{},
		LastRejected: &api.Rejected{Time: now.Add(-10 * time.Minute), File: "/etc/nodeagent/nodeagent.yaml",
			Errors: []string{"/etc/nodeagent/nodeagent.yaml:4: vlans[0].id: 4095 is outside 1-4094"}},
		LastRollback: &api.Rollback{Time: now.Add(-303 * time.Second), Probe: "gateway-ping", Message: "10.10.50.1: 100% loss", ConfigHash: "9d8e7f6a"},
		Warnings:     []string{"/etc/nodeagent/nodeagent.yaml:12: vlans[0].addresses[0]: macvlan pods on enp1s0.50 cannot reach 10.10.50.1 on enp1s0.50 itself; put it on vlan50-shim"},
	}
	notReadyStatus = &api.Status{
		Version: "v0.5.0", Node: "node-b", ConfigFile: "/etc/nodeagent/nodeagent.yaml", ConfigHash: "77aa",
		Started: now.Add(-30 * time.Second),
		Conditions: []api.Condition{
			{Type: api.CondReady, Status: api.False, Reason: "SyncFailed", LastTransitionTime: now.Add(-30 * time.Second)},
			{Type: api.CondConverged, Status: api.False, Reason: "SyncFailed", Message: "link enp1s0.50: parent enp1s0 is down", LastTransitionTime: now.Add(-30 * time.Second)},
		},
		Subsystems: []api.Subsystem{{Name: "links", Changes: 0, Error: "link enp1s0.50: parent enp1s0 is down"}},
		Pending:    []api.Object{},
		Failed:     []api.Object{{Subsystem: "links", Message: "link enp1s0.50: parent enp1s0 is down"}},
		WireGuard:  []api.WireGuardDevice{},
	}
)

// fake is a daemon serving canned replies.
type fake struct {
	mu sync.Mutex
	// polls counts GET /v1/status.
	polls int
	// status returns the reply to the nth GET /v1/status (n from 1).
	status func(n int) *api.Status
	plan   api.Plan
	// reloadCode and reload are POST /v1/reload's reply.
	reloadCode int
	reload     any
	peers      []api.WireGuardDevice
	// retryCode and retry are POST /v1/port/retry's reply; retried the
	// devices asked for.
	retryCode int
	retry     any
	retried   []string
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	code, body := http.StatusOK, any(nil)
	switch r.Method + " " + r.URL.Path {
	case "GET /v1/status":
		f.polls++
		body = f.status(f.polls)
	case "GET /v1/plan":
		body = f.plan
	case "POST /v1/reload":
		code, body = f.reloadCode, f.reload
	case "GET /v1/peers":
		body = f.peers
	case "POST /v1/port/retry":
		f.retried = append(f.retried, r.URL.Query().Get("device"))
		code, body = f.retryCode, f.retry
	default:
		code, body = http.StatusNotFound, api.Error{Error: "no such endpoint"}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}

func (f *fake) pollCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.polls
}

func always(s *api.Status) func(int) *api.Status { return func(int) *api.Status { return s } }

// listen serves h on sock until the test ends.
func listen(t *testing.T, sock string, h http.Handler) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// daemon starts f on a fresh socket and returns the socket.
func daemon(t *testing.T, f *fake) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	listen(t, sock, f)
	return sock
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs nodeagentctl with env as its whole environment.
func run(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	c := &cli{stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] }, now: func() time.Time { return now }, poll: 10 * time.Millisecond}
	code := c.run(context.Background(), args)
	return result{code, out.String(), errb.String()}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// missingLines reports which of want are missing from text as whole lines.
func missingLines(text string, want []string) []string {
	have := strings.Split(text, "\n")
	var missing []string
	for _, w := range want {
		if !slices.Contains(have, w) {
			missing = append(missing, w)
		}
	}
	return missing
}

func TestStatus(t *testing.T) {
	tests := []struct {
		name   string
		status *api.Status
		code   int
		lines  []string
	}{
		{"ready", readyStatus, 0, []string{
			"       Node: node-a",
			"      State: ready",
			"     Config: /etc/nodeagent/nodeagent.yaml (hash 3f2a9c1b)",
			"  Last sync: 2026-12-01 08:59:48 UTC (12s ago), trigger resync, took 41ms, 0 changes, sync #17",
			"    Started: 2026-12-01 07:00:00 UTC (2h0m ago)",
			"  Converged     True    Synced     1h59m  3 changes",
			"  ConfigLoaded  True    -          2h0m",
			"  wg0 (kernel), public key SRVpubKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=, listening on 51820, 1/2 peers live",
			"    laptop       live   203.0.113.5:51234  12s ago    1.50 KiB  3.00 MiB  10.90.0.2/32",
			"    PHNpubKeyC…  idle   -                  never      0 B       0 B       10.90.0.3/32,fd90::3/128",
		}},
		{"degraded", degradedStatus, 1, []string{
			"      State: ready, degraded (SafeApply=False)",
			"  Last sync: 2026-12-01 08:55:00 UTC (5m0s ago), trigger config, took 1.205s, 2 changes, sync #40",
			"    Started: 2026-11-29 07:00:00 UTC (2d2h ago)",
			"  SafeApply  False   RolledBack  5m3s  probe gateway-ping failed after the change",
			"Pending:",
			"  routes  route default table 150: pending: dev wg-pia does not exist",
			"Warnings (the config validates, but):",
			"  /etc/nodeagent/nodeagent.yaml:12: vlans[0].addresses[0]: macvlan pods on enp1s0.50 cannot reach 10.10.50.1 on enp1s0.50 itself; put it on vlan50-shim",
			"Last rejected reload: 2026-12-01 08:50:00 UTC (10m0s ago), /etc/nodeagent/nodeagent.yaml",
			"  /etc/nodeagent/nodeagent.yaml:4: vlans[0].id: 4095 is outside 1-4094",
			"Last rollback: 2026-12-01 08:54:57 UTC (5m3s ago), probe gateway-ping failed after the change; config 9d8e7f6a is not retried until it changes",
			"  10.10.50.1: 100% loss",
		}},
		{"not ready", notReadyStatus, 1, []string{
			"       Node: node-b",
			"      State: not ready (Ready=False, Converged=False)",
			"  Last sync: none yet",
			"  links  0        link enp1s0.50: parent enp1s0 is down",
			"Failed:",
			"  links  link enp1s0.50: parent enp1s0 is down",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := daemon(t, &fake{status: always(tt.status)})
			r := run(t, nil, "status", "--socket", sock)
			if r.code != tt.code {
				t.Fatalf("want exit %d, got %v", tt.code, r)
			}
			if m := missingLines(r.stdout, tt.lines); len(m) > 0 {
				t.Errorf("missing lines %q in\n%s", m, r.stdout)
			}
			if r.stderr != "" {
				t.Errorf("stderr: %s", r.stderr)
			}
			// -o json: the same exit code, and exactly the served struct.
			r = run(t, nil, "status", "-o", "json", "--socket", sock)
			if r.code != tt.code {
				t.Fatalf("-o json: want exit %d, got %v", tt.code, r)
			}
			var got api.Status
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("-o json: %v\n%s", err, r.stdout)
			}
			if d := cmp.Diff(tt.status, &got); d != "" {
				t.Errorf("-o json (-served +printed):\n%s", d)
			}
			if !strings.HasPrefix(r.stdout, "{\n  \"version\"") {
				t.Errorf("-o json is not indented:\n%s", r.stdout)
			}
		})
	}
}

// TestRenderStatus pins the whole report of the richest status, so a
// change of layout is a visible diff.
func TestRenderStatus(t *testing.T) {
	s := *degradedStatus
	s.WireGuard = []api.WireGuardDevice{wg0, {Name: "wg-pia", Peers: []api.WireGuardPeer{}, Problems: []string{"pia: login failed:\tHTTP 401"}}}
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	s.PIA = []api.PIATunnel{{
		Device: "wg-pia", Phase: "addKey", Region: "nl_amsterdam", ServerCN: "amsterdam401", ServerIP: "198.18.1.2",
		ServerVIP: "10.10.0.1", PeerIP: "10.10.0.3", RegisteredSince: at(-2 * time.Hour), LastHandshake: at(-200 * time.Second),
		HandshakeAgeSeconds: 200, NextTokenRefresh: at(21 * time.Hour), ServerList: "fetched 2026-12-01T08:00:00Z",
		LastError: "the last handshake with amsterdam401 was 3m20s ago", LastErrorAt: at(-time.Second), RetryAt: at(2 * time.Second),
	}}
	var b bytes.Buffer
	if err := renderStatus(&b, &s, now); err != nil {
		t.Fatal(err)
	}
	want := `       Node: node-a
      State: ready, degraded (SafeApply=False)
    Version: v0.5.0
     Config: /etc/nodeagent/nodeagent.yaml (hash 3f2a9c1b)
  Last sync: 2026-12-01 08:55:00 UTC (5m0s ago), trigger config, took 1.205s, 2 changes, sync #40
    Started: 2026-11-29 07:00:00 UTC (2d2h ago)

Conditions:
  TYPE       STATUS  REASON      AGE   MESSAGE
  Ready      True    Converged   2d1h
  SafeApply  False   RolledBack  5m3s  probe gateway-ping failed after the change

Subsystems:
  NAME    CHANGES  ERROR
  routes  2        -

WireGuard:
  wg0 (kernel), public key SRVpubKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=, listening on 51820, 1/2 peers live
    PEER         STATE  ENDPOINT           HANDSHAKE  RX        TX        ALLOWED IPS
    laptop       live   203.0.113.5:51234  12s ago    1.50 KiB  3.00 MiB  10.90.0.2/32
    PHNpubKeyC…  idle   -                  never      0 B       0 B       10.90.0.3/32,fd90::3/128

  wg-pia (absent), 0/0 peers live
    problem: pia: login failed: HTTP 401

PIA wg-pia: addKey, region nl_amsterdam
  server:            amsterdam401 (198.18.1.2), inside the tunnel 10.10.0.1
  peer IP:           10.10.0.3
  registered since:  2026-12-01 07:00:00 UTC (2h0m ago)
  last handshake:    3m20s ago
  next token:        2026-12-02 06:00:00 UTC (in 21h0m)
  server list:       fetched 2026-12-01T08:00:00Z
  last error:        2026-12-01 08:59:59 UTC (1s ago): the last handshake with amsterdam401 was 3m20s ago
  retry:             2026-12-01 09:00:02 UTC (in 2s)

Pending:
  routes  route default table 150: pending: dev wg-pia does not exist

Warnings (the config validates, but):
  /etc/nodeagent/nodeagent.yaml:12: vlans[0].addresses[0]: macvlan pods on enp1s0.50 cannot reach 10.10.50.1 on enp1s0.50 itself; put it on vlan50-shim

Last rejected reload: 2026-12-01 08:50:00 UTC (10m0s ago), /etc/nodeagent/nodeagent.yaml
  /etc/nodeagent/nodeagent.yaml:4: vlans[0].id: 4095 is outside 1-4094

Last rollback: 2026-12-01 08:54:57 UTC (5m3s ago), probe gateway-ping failed after the change; config 9d8e7f6a is not retried until it changes
  10.10.50.1: 100% loss
`
	if d := cmp.Diff(want, b.String()); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestFormatting(t *testing.T) {
	tests := []struct{ got, want string }{
		{compact(0), "0s"},
		{compact(59*time.Second + 999*time.Millisecond), "59s"},
		{compact(61 * time.Second), "1m1s"},
		{compact(3*time.Hour + 5*time.Minute + 59*time.Second), "3h5m"},
		{compact(49 * time.Hour), "2d1h"},
		{ago(now.Add(3*time.Second), now), "in 3s"},
		{ageShort(time.Time{}, now), "-"},
		{stamp(time.Time{}, now), "-"},
		{humanBytes(0), "0 B"},
		{humanBytes(1023), "1023 B"},
		{humanBytes(1024), "1.00 KiB"},
		{humanBytes(5 << 30), "5.00 GiB"},
		{humanBytes(3 << 50), "3072.00 TiB"},
		{millis(0.35), "350µs"},
		{millis(41.6), "42ms"},
		{shortKey("short"), "short"},
		{clean("a\tb\x1b[31mc\n"), "a b [31mc "},
	}
	for i, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%d: got %q, want %q", i, tt.got, tt.want)
		}
	}
}

// TestUnreachable: a missing socket is reported with the next step (the
// unit's status); with -o json the error is a JSON object on stdout too.
func TestUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	reason := "cannot reach nodeagent at " + sock + ": connect: no such file or directory"
	hint := "is the daemon running, on this socket? See: systemctl status nodeagent"
	for _, args := range [][]string{{"status"}, {"status", "-o", "json"}, {"plan"}, {"reload"}, {"peers"}, {"peers", "-o", "json"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := run(t, nil, append(args, "--socket", sock)...)
			want := "nodeagentctl: " + reason + "\nnodeagentctl: " + hint + "\n"
			if r.code != 2 || r.stderr != want {
				t.Errorf("want exit 2 and stderr %q, got %v", want, r)
			}
			if !slices.Contains(args, "json") {
				if r.stdout != "" {
					t.Errorf("stdout %q, want none", r.stdout)
				}
				return
			}
			var got map[string]string
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("-o json: stdout is not a JSON object: %v\n%s", err, r.stdout)
			}
			if diff := cmp.Diff(map[string]string{"error": reason, "hint": hint}, got); diff != "" {
				t.Errorf("-o json error object (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUnreachableNotPermitted: a caller the socket's permissions keep out
// is told about the nodeagent group, not only "permission denied".
func TestUnreachableNotPermitted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run as nobody")
	}
	// Under /tmp itself, not t.TempDir (whose parent is 0700): nobody
	// must reach the binary, and be refused by the socket alone.
	dir, err := os.MkdirTemp("", "nodeagentctl-perm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	sock := filepath.Join(dir, "s.sock")
	listen(t, sock, &fake{status: always(readyStatus)})
	os.Chmod(sock, 0o660)
	self, _ := os.Executable()
	bin := filepath.Join(dir, "nodeagentctl")
	b, _ := os.ReadFile(self)
	os.WriteFile(bin, b, 0o755)
	cmd := exec.Command(bin, "status", "-o", "json", "--socket", sock)
	cmd.Env = append(os.Environ(), asCtl+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("want exit 2, got %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	for _, w := range []string{"permission denied", "the nodeagent group", "sudo usermod -aG nodeagent"} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("stderr lacks %q:\n%s", w, errb.String())
		}
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || !strings.Contains(got["hint"], "nodeagent group") {
		t.Errorf("-o json: want an error object with the hint, got %v:\n%s", err, out.String())
	}
}

func TestSocketSelection(t *testing.T) {
	good := daemon(t, &fake{status: always(readyStatus)})
	bad := filepath.Join(t.TempDir(), "missing.sock")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
	}{
		{"flag before the command", nil, []string{"--socket", good, "status"}, 0},
		{"flag after the command", nil, []string{"status", "--socket", good}, 0},
		{"flag with =", nil, []string{"status", "--socket=" + good}, 0},
		{"environment", map[string]string{"NODEAGENT_SOCKET": good}, []string{"status"}, 0},
		{"flag beats environment", map[string]string{"NODEAGENT_SOCKET": bad}, []string{"status", "--socket", good}, 0},
		{"environment beats default", map[string]string{"NODEAGENT_SOCKET": bad}, []string{"status"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := run(t, tt.env, tt.args...); r.code != tt.code {
				t.Errorf("want exit %d, got %v", tt.code, r)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name           string
		plan           api.Plan
		code           int
		stdout, stderr string
	}{
		{"changes", api.Plan{Lines: []string{"+ link shim0 (macvlan bridge on enp1s0, up)", "~ route default table 150"}}, 0,
			"+ link shim0 (macvlan bridge on enp1s0, up)\n~ route default table 150\n", ""},
		{"no changes", api.Plan{}, 0, "no changes\n", ""},
		{"a warning", api.Plan{Warnings: []string{"f.yaml:3: vlans[0].addresses[0]: macvlan pods on v cannot reach 10.0.0.1 on v itself; put it on s"}}, 0,
			"warning: f.yaml:3: vlans[0].addresses[0]: macvlan pods on v cannot reach 10.0.0.1 on v itself; put it on s\nno changes\n", ""},
		{"incomplete", api.Plan{Lines: []string{"+ link shim0"}, Error: "nftables: netlink: permission denied"}, 1,
			"+ link shim0\n", "nodeagentctl: plan incomplete: nftables: netlink: permission denied\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, nil, "plan", "--socket", daemon(t, &fake{plan: tt.plan}))
			if d := cmp.Diff(result{tt.code, tt.stdout, tt.stderr}, r, cmp.AllowUnexported(result{})); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestReload(t *testing.T) {
	tests := []struct {
		name           string
		code           int
		reply          any
		exit           int
		stdout, stderr string
	}{
		{"accepted", 200, api.Reload{Applied: true, ConfigHash: "4b5c"}, 0, "reloaded (config 4b5c)\n", ""},
		{"rejected", 200, api.Reload{ConfigHash: "3f2a", Errors: []string{"nodeagent.yaml:4: vlans[0].id: 4095 is outside 1-4094", "nodeagent.yaml:5: vlans[0].mtuu: unknown field"}}, 1, "",
			"nodeagentctl: reload rejected; the running config (3f2a) stays:\n  nodeagent.yaml:4: vlans[0].id: 4095 is outside 1-4094\n  nodeagent.yaml:5: vlans[0].mtuu: unknown field\n"},
		{"not root", 403, api.Error{Error: "reload needs root (uid 1000)"}, 1, "",
			"nodeagentctl: reload needs root; run it with sudo (the daemon said 403 Forbidden: reload needs root (uid 1000))\n"},
		{"daemon failure", 500, api.Error{Error: "reload: config changed while reading"}, 1, "",
			"nodeagentctl: reload: 500 Internal Server Error: reload: config changed while reading\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, nil, "reload", "--socket", daemon(t, &fake{reloadCode: tt.code, reload: tt.reply}))
			if d := cmp.Diff(result{tt.exit, tt.stdout, tt.stderr}, r, cmp.AllowUnexported(result{})); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestPeers(t *testing.T) {
	devs := []api.WireGuardDevice{wg0}
	sock := daemon(t, &fake{peers: devs})
	r := run(t, nil, "peers", "--socket", sock)
	want := `wg0 (kernel), public key SRVpubKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=, listening on 51820, 1/2 peers live
  PEER         STATE  ENDPOINT           HANDSHAKE  RX        TX        ALLOWED IPS
  laptop       live   203.0.113.5:51234  12s ago    1.50 KiB  3.00 MiB  10.90.0.2/32
  PHNpubKeyC…  idle   -                  never      0 B       0 B       10.90.0.3/32,fd90::3/128
`
	if d := cmp.Diff(result{0, want, ""}, r, cmp.AllowUnexported(result{})); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	r = run(t, nil, "peers", "-o", "json", "--socket", sock)
	var got []api.WireGuardDevice
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil {
		t.Fatalf("-o json: %v, %v", err, r)
	}
	if d := cmp.Diff(devs, got); d != "" {
		t.Errorf("-o json (-served +printed):\n%s", d)
	}
	if r := run(t, nil, "peers", "-o", "json", "--socket", daemon(t, &fake{})); r.stdout != "[]\n" {
		t.Errorf("no devices, -o json: %v", r)
	}
	if r := run(t, nil, "peers", "--socket", daemon(t, &fake{})); r.stdout != "no WireGuard devices\n" {
		t.Errorf("no devices: %v", r)
	}
}

// flipping serves notReady for the first n polls, then s.
func flipping(n int, s *api.Status) func(int) *api.Status {
	return func(poll int) *api.Status {
		if poll <= n {
			return notReadyStatus
		}
		return s
	}
}

func TestWait(t *testing.T) {
	killSwitchOff := *readyStatus
	killSwitchOff.Conditions = append(slices.Clone(readyStatus.Conditions),
		api.Condition{Type: api.CondKillSwitchArmed, Status: api.False, Reason: "TableMissing", LastTransitionTime: now})
	tests := []struct {
		name    string
		status  func(int) *api.Status
		args    []string
		code    int
		polls   int // at least
		stdout  string
		stderrs []string
	}{
		{"ready after 3 polls", flipping(3, readyStatus), []string{"--for=ready"}, 0, 4, "ready\n", nil},
		{"ready is the default", flipping(2, readyStatus), nil, 0, 3, "ready\n", nil},
		{"condition flips", flipping(2, readyStatus), []string{"--for", "condition/Converged"}, 0, 3, "Converged=True (Synced: 3 changes)\n", nil},
		{"condition case-insensitive", always(readyStatus), []string{"--for=condition/converged=true"}, 0, 1, "Converged=True (Synced: 3 changes)\n", nil},
		{"condition False", always(&killSwitchOff), []string{"--for=condition/KillSwitchArmed=False"}, 0, 1, "KillSwitchArmed=False (TableMissing)\n", nil},
		// Degraded is ready (a skipped peer file must not keep k3s from
		// starting), and not healthy.
		{"degraded is ready", always(degradedStatus), []string{"--timeout=100ms"}, 0, 1,
			"ready (degraded: SafeApply=False (RolledBack: probe gateway-ping failed after the change))\n", nil},
		{"degraded is not healthy", always(degradedStatus), []string{"--for=healthy", "--timeout=100ms"}, 1, 2, "", []string{
			"nodeagentctl: timed out after 100ms waiting for healthy: SafeApply=False (RolledBack: probe gateway-ping failed after the change)\n"}},
		{"healthy", flipping(2, readyStatus), []string{"--for=healthy"}, 0, 3, "healthy\n", nil},
		{"timeout names the reason", always(notReadyStatus), []string{"--for=ready", "--timeout=100ms"}, 1, 2, "", []string{
			"nodeagentctl: timed out after 100ms waiting for ready: Converged=False (SyncFailed: link enp1s0.50: parent enp1s0 is down)\n"}},
		{"condition not reported", always(readyStatus), []string{"--for=condition/TunnelHealthy", "--timeout=100ms"}, 1, 2, "", []string{
			"nodeagentctl: timed out after 100ms waiting for condition/TunnelHealthy=True: condition TunnelHealthy is not reported\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fake{status: tt.status}
			r := run(t, nil, append([]string{"wait", "--socket", daemon(t, f)}, tt.args...)...)
			if r.code != tt.code || r.stdout != tt.stdout {
				t.Fatalf("want exit %d and stdout %q, got %v", tt.code, tt.stdout, r)
			}
			for _, w := range tt.stderrs {
				if r.stderr != w {
					t.Errorf("stderr %q, want %q", r.stderr, w)
				}
			}
			if p := f.pollCount(); p < tt.polls {
				t.Errorf("%d polls, want at least %d", p, tt.polls)
			}
		})
	}
}

// TestWaitWhileUnreachable: at boot the socket appears after wait starts;
// wait keeps polling and succeeds. With no daemon at all it times out with
// exit 1 (fail closed), not 2 and never 0.
func TestWaitWhileUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	f := &fake{status: always(readyStatus)}
	srv := &http.Server{Handler: f}
	t.Cleanup(func() { srv.Close() })
	go func() {
		time.Sleep(200 * time.Millisecond)
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Error(err)
			return
		}
		srv.Serve(l)
	}()
	start := time.Now()
	r := run(t, nil, "wait", "--socket", sock, "--timeout=10s")
	if r.code != 0 || r.stdout != "ready\n" {
		t.Fatalf("want exit 0 once the daemon is up, got %v", r)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("wait returned after %v, before the daemon was up", d)
	}

	missing := filepath.Join(t.TempDir(), "missing.sock")
	r = run(t, nil, "wait", "--socket", missing, "--timeout=150ms")
	want := "nodeagentctl: timed out after 150ms waiting for ready: cannot reach nodeagent at " + missing + ": connect: no such file or directory\n" +
		"nodeagentctl: is the daemon running, on this socket? See: systemctl status nodeagent\n"
	if r.code != 1 || r.stderr != want {
		t.Errorf("want exit 1 and %q, got %v", want, r)
	}
}

// TestWaitRefused: a 4xx cannot clear up by waiting, so wait ends at once.
func TestWaitRefused(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	listen(t, sock, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(api.Error{Error: "not in group nodeagent"})
	}))
	start := time.Now()
	r := run(t, nil, "wait", "--socket", sock, "--timeout=1m")
	want := "nodeagentctl: waiting for ready: 403 Forbidden: not in group nodeagent\n"
	if r.code != 1 || r.stderr != want {
		t.Errorf("want exit 1 and %q, got %v", want, r)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a refused wait took %v", d)
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args   []string
		stderr string
	}{
		{nil, "nodeagentctl: no command"},
		{[]string{"frobnicate"}, `nodeagentctl: unknown command "frobnicate"`},
		{[]string{"status", "-o", "yaml"}, `nodeagentctl: -o "yaml": want table or json`},
		{[]string{"status", "--for=ready"}, "nodeagentctl: --for does not apply to status"},
		{[]string{"plan", "-o", "json"}, "nodeagentctl: --output does not apply to plan"},
		{[]string{"status", "extra"}, `nodeagentctl: status takes no arguments, got ["extra"]`},
		{[]string{"wait", "--timeout=0"}, "nodeagentctl: --timeout 0s: must be > 0"},
		{[]string{"wait", "--timeout=-1s"}, "nodeagentctl: --timeout -1s: must be > 0"},
		{[]string{"wait", "--timeout=soon"}, `invalid argument "soon" for "--timeout"`},
		{[]string{"wait", "--for=converged"}, `nodeagentctl: --for: "converged": want ready, healthy or condition/NAME[=STATUS]`},
		{[]string{"wait", "--for=condition/"}, `nodeagentctl: --for: "condition/": no condition name`},
		{[]string{"wait", "--for=condition/Ready=Yes"}, `nodeagentctl: --for: "condition/Ready=Yes": status "Yes": want True, False or Unknown`},
		{[]string{"completion"}, "nodeagentctl: completion takes 1 argument, got 0"},
		{[]string{"completion", "fish"}, `nodeagentctl: completion "fish": want bash or zsh`},
		{[]string{"--nosuch"}, "unknown flag: --nosuch"},
		{[]string{"status", "-output", "json"}, "nodeagentctl: -output: a long flag takes two dashes: --output (or -o)"},
		{[]string{"wait", "-timeout=2m"}, "nodeagentctl: -timeout=2m: a long flag takes two dashes: --timeout"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := run(t, nil, tt.args...)
			if r.code != 2 || !strings.Contains(r.stderr, tt.stderr) || !strings.Contains(r.stderr, "Usage:") {
				t.Errorf("want exit 2, %q and the usage on stderr, got %v", tt.stderr, r)
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"status", "--help"}} {
		if r := run(t, nil, args...); r.code != 0 || r.stdout != usage {
			t.Errorf("%q: want exit 0 and the usage, got %v", args, r)
		}
	}
	for _, args := range [][]string{{"help"}} {
		if r := run(t, nil, args...); r.code != 0 || r.stdout != usage {
			t.Errorf("%q: want exit 0 and the usage, got %v", args, r)
		}
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if r := run(t, nil, args...); r.code != 0 || r.stdout != "nodeagentctl dev\n" {
			t.Errorf("%q: %v", args, r)
		}
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh"} {
		r := run(t, nil, "completion", shell)
		if r.code != 0 || r.stdout == "" {
			t.Fatalf("completion %s: %v", shell, r)
		}
		for _, w := range []string{"status", "plan", "reload", "peers", "wait", "completion", "--socket", "--output", "--for", "--timeout", "table", "json", "ready", "condition/" + api.CondKillSwitchArmed} {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("completion %s lacks %q", shell, w)
			}
		}
		if strings.Contains(r.stdout, "@FOR") {
			t.Errorf("completion %s has an unreplaced placeholder", shell)
		}
		// The shell itself checks the syntax, where it is installed.
		if sh, err := exec.LookPath(shell); err == nil {
			script := filepath.Join(t.TempDir(), "completion."+shell)
			os.WriteFile(script, []byte(r.stdout), 0o644)
			if out, err := exec.Command(sh, "-n", script).CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v\n%s", shell, err, out)
			}
		}
	}
}

// TestBashCompletion runs the bash script's function on command lines and
// checks what it offers.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script := filepath.Join(t.TempDir(), "nodeagentctl.bash")
	os.WriteFile(script, []byte(completions["bash"]), 0o644)
	tests := []struct {
		words []string // the last is the word being completed
		want  string
	}{
		{[]string{""}, "status plan reload peers peer port wait completion version help"},
		{[]string{"peer", ""}, "add disable enable remove"},
		{[]string{"peer", "add", "phone", "--"}, "--socket --help --device --ip --description --expires --full-tunnel --via --qr --qr-png"},
		{[]string{"peer", "disable", "phone", "--"}, "--socket --help --device"},
		{[]string{"peer", "add", "phone", "--expires", ""}, "1d 7d 30d 90d 365d"},
		{[]string{"--v"}, "--version"},
		{[]string{"st"}, "status"},
		{[]string{"status", "-o", ""}, "table json"},
		{[]string{"status", "--output", "="}, "table json"},
		{[]string{"peers", "--"}, "--socket --help --output"},
		{[]string{"wait", "--"}, "--socket --help --for --timeout"},
		{[]string{"wait", "--for", "="}, strings.Join(forValues(false), " ")},
		{[]string{"wait", "--for", "=", "condition/K"}, "condition/KillSwitchArmed"},
		{[]string{"wait", "--for", "condition/Rea"}, "condition/Ready"},
		{[]string{"wait", "--for", "=", "condition/Ready", "=", ""}, "True False Unknown"},
		{[]string{"wait", "--for", "condition/Ready", "="}, "True False Unknown"},
		{[]string{"completion", ""}, "bash zsh"},
		{[]string{"status", ""}, ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.words, " "), func(t *testing.T) {
			words := append([]string{"nodeagentctl"}, tt.words...)
			quoted := make([]string, len(words))
			for i, w := range words {
				quoted[i] = "'" + w + "'"
			}
			prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
				strconv.Itoa(len(words)-1) + "\n_nodeagentctl\necho \"${COMPREPLY[*]}\"\n"
			out, err := exec.Command(bash, "--norc", "--noprofile", "-c", prog).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tt.want {
				t.Errorf("offered %q, want %q", got, tt.want)
			}
		})
	}
}

// TestManPageCoversUsage keeps docs/nodeagentctl.1 in step with --help:
// every flag the code defines is in the usage, and every command, flag and
// exit status the usage names is in the man page.
func TestManPageCoversUsage(t *testing.T) {
	man, err := os.ReadFile("../../docs/nodeagentctl.1")
	if err != nil {
		t.Fatal(err)
	}
	page := strings.ReplaceAll(string(man), `\-`, "-")
	page = strings.ReplaceAll(page, `\fR`, "")
	page = strings.ReplaceAll(page, `\fI`, "")
	page = strings.ReplaceAll(page, `\fB`, "")
	page = strings.ReplaceAll(page, ` ", " `, ", ")

	words := []string{"NODEAGENT_SOCKET", api.DefaultSocket, "fails closed", "ExecStartPre=nodeagentctl wait --for=ready --timeout=2m",
		"condition/NAME[=STATUS]", "table", "json", "bash", "zsh", pollInterval.String(), "cannot reach nodeagent at"}
	newFlagSet(&options{}).VisitAll(func(f *pflag.Flag) {
		words = append(words, "--"+f.Name)
		if f.Shorthand != "" {
			words = append(words, "-"+f.Shorthand+", --"+f.Name) // .BR -o ", " --output in the page
		}
	})
	for name := range commands {
		words = append(words, "nodeagentctl "+name)
	}
	for _, w := range words {
		if !strings.Contains(usage, w) && w != "cannot reach nodeagent at" {
			t.Errorf("usage lacks %q", w)
		}
	}
	// Every flag and command the usage names, found by pattern, so a new
	// one in the usage cannot be forgotten in the page.
	words = append(words, regexp.MustCompile(`--[a-z-]+`).FindAllString(usage, -1)...)
	for _, m := range regexp.MustCompile(`(?m)^  nodeagentctl ([a-z]+)`).FindAllStringSubmatch(usage, -1) {
		words = append(words, m[1])
	}
	for _, w := range words {
		w = strings.TrimPrefix(w, "nodeagentctl ")
		if !strings.Contains(page, w) {
			t.Errorf("man page lacks %q, which --help names", w)
		}
	}
	for _, section := range []string{".SH EXIT STATUS\n.TP\n.B 0\n", ".TP\n.B 1\n", ".TP\n.B 2\n", ".SH ENVIRONMENT"} {
		if !strings.Contains(string(man), section) {
			t.Errorf("man page lacks %q", section)
		}
	}
}

// TestPort: `nodeagentctl port` prints the number alone, exit 1 without
// one (saying why on stderr), 2 when a device must be named.
func TestPort(t *testing.T) {
	one := &api.Status{PIA: []api.PIATunnel{{Device: "wg-pia", ForwardedPort: 47047}}}
	none := &api.Status{PIA: []api.PIATunnel{{Device: "wg-pia", PortError: "bindPort at amsterdam401: HTTP 401"}}}
	two := &api.Status{PIA: []api.PIATunnel{{Device: "wg-pia", ForwardedPort: 47047}, {Device: "wg-pia2", ForwardedPort: 51000}}}
	for _, tt := range []struct {
		name         string
		status       *api.Status
		args         []string
		code         int
		stdout, errs string
	}{
		{"one", one, nil, 0, "47047\n", ""},
		{"named", two, []string{"wg-pia2"}, 0, "51000\n", ""},
		{"none yet", none, nil, 1, "", "wg-pia: none forwarded yet: bindPort at amsterdam401: HTTP 401"},
		{"unknown device", one, []string{"wg0"}, 1, "", `no PIA device "wg0"`},
		{"no PIA at all", &api.Status{}, nil, 1, "", "no PIA device"},
		{"several", two, nil, 2, "", "several PIA devices; name one"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sock := daemon(t, &fake{status: always(tt.status)})
			r := run(t, nil, append([]string{"port", "--socket", sock}, tt.args...)...)
			if r.code != tt.code || r.stdout != tt.stdout || !strings.Contains(r.stderr, tt.errs) {
				t.Errorf("got %+v, want exit %d, stdout %q, stderr containing %q", r, tt.code, tt.stdout, tt.errs)
			}
		})
	}
	if r := run(t, nil, "port", "a", "b"); r.code != exitUsage {
		t.Errorf("two arguments: %+v", r)
	}
	lost := &api.Status{PIA: []api.PIATunnel{{Device: "wg-pia", PortLost: &api.PortLost{Port: 47047, Since: now}}}}
	if r := run(t, nil, "port", "--socket", daemon(t, &fake{status: always(lost)})); r.code != 1 || !strings.Contains(r.stderr, "port 47047 lost since 2026-12-01T09:00:00Z") {
		t.Errorf("a lost port: %+v", r)
	}
}

// TestPortRetry: port --retry asks the daemon to run the hook now (of the
// device named, or of all), prints which, and says why it could not.
func TestPortRetry(t *testing.T) {
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		reply  any
		exit   int
		stdout string
		stderr string
		asked  string
	}{
		{"all", nil, 200, api.PortRetry{Devices: []string{"wg-pia"}}, 0, "wg-pia: port hook runs now (nodeagentctl status shows how it went)\n", "", ""},
		{"named", []string{"wg-pia"}, 200, api.PortRetry{Devices: []string{"wg-pia"}}, 0, "wg-pia: port hook runs now (nodeagentctl status shows how it went)\n", "", "wg-pia"},
		{"no hook", []string{"wg-pia"}, 409, api.PortRetry{Error: "wg-pia: no portForward.onChange to run"}, 1, "", "nodeagentctl: port --retry: wg-pia: no portForward.onChange to run\n", "wg-pia"},
		{"not root", nil, 403, api.Error{Error: "port/retry needs root"}, 1, "", "port/retry needs root", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fake{retryCode: tt.code, retry: tt.reply}
			r := run(t, nil, append([]string{"port", "--retry", "--socket", daemon(t, f)}, tt.args...)...)
			if r.code != tt.exit || r.stdout != tt.stdout || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("got %+v, want exit %d, stdout %q, stderr containing %q", r, tt.exit, tt.stdout, tt.stderr)
			}
			if len(f.retried) != 1 || f.retried[0] != tt.asked {
				t.Errorf("the daemon was asked for %q, want [%q]", f.retried, tt.asked)
			}
		})
	}
	if r := run(t, nil, "status", "--retry"); r.code != exitUsage {
		t.Errorf("--retry with status: %+v", r)
	}
}
