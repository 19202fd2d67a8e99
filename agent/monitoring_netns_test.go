package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// TestPrometheusAlertsOnTheTunnel: Debian's Prometheus, in the node's
// namespace, scrapes the daemon with the shipped alerting rules loaded.
// promtool check metrics finds nothing in the scrape; every dashboard
// query is accepted against it; breaking the tunnel at the stub takes
// NodeagentTunnelUnhealthy to pending, then firing, through Prometheus's
// own API, and recovering resolves it. (The rules' for: durations are cut
// to 3 s for the test; the expressions are the shipped ones.)
func TestPrometheusAlertsOnTheTunnel(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no Prometheus")
	}
	testenv.RequireRoot(t)
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is missing (make test installs Debian's prometheus package)")
	}
	promtool, _ := exec.LookPath("promtool")
	rules, err := os.ReadFile("../packaging/monitoring/nodeagent-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	l.PIA = "      portForward: true"
	l.WriteConfig(t, "stub_ams")
	r := startPIA(t, l, pia.Timers{})
	waitHealthy(t, r, 60*time.Second)

	ml, err := l.Node.Host.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go r.d.Metrics().ServeListener(ctx, ml, nil)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: l.Node.Host.DialContext}}

	// promtool check metrics on the daemon's own scrape.
	resp, err := client.Get("http://" + ml.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scrape, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	chk := exec.Command(promtool, "check", "metrics")
	chk.Stdin = bytes.NewReader(scrape)
	if out, err := chk.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	dir := t.TempDir()
	fast := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(rules, []byte("$1 3s"))
	os.WriteFile(filepath.Join(dir, "rules.yml"), fast, 0o644)
	os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules.yml]
scrape_configs:
  - job_name: nodeagent
    static_configs: [{targets: ["%s"]}]
`, ml.Addr())), 0o644)
	pl, _ := net.Listen("tcp", "127.0.0.1:0") // a free port number; closed for Prometheus to take
	addr := pl.Addr().String()
	pl.Close()
	cmd := exec.Command("ip", "netns", "exec", l.Node.Name, prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	var plog bytes.Buffer
	cmd.Stdout, cmd.Stderr = &plog, &plog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", plog.String())
		}
	})
	api := func(path string, q url.Values, v any) error {
		resp, err := client.Get("http://" + addr + path + "?" + q.Encode())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var env struct {
			Status string
			Error  string
			Data   json.RawMessage
		}
		if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
			return err
		}
		if env.Status != "success" {
			return fmt.Errorf("%s: %s", env.Status, env.Error)
		}
		return json.Unmarshal(env.Data, v)
	}
	query := func(q string) (int, error) {
		var res struct{ Result []json.RawMessage }
		err := api("/api/v1/query", url.Values{"query": {q}}, &res)
		return len(res.Result), err
	}
	waitFor(t, "Prometheus scraping the daemon", 60*time.Second, func() bool {
		n, err := query(`up{job="nodeagent"} == 1`)
		return err == nil && n == 1
	})
	waitFor(t, "a tunnel_healthy sample", 20*time.Second, func() bool {
		n, err := query(`nodeagent_tunnel_healthy == 1`)
		return err == nil && n == 1
	})

	// Every dashboard query is accepted against the live data.
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	b, _ := os.ReadFile("../packaging/monitoring/nodeagent-dashboard.json")
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	queries, empty := 0, 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			n, err := query(strings.ReplaceAll(tg.Expr, "$instance", ".*"))
			if err != nil {
				t.Errorf("dashboard %q: %s: %v", p.Title, tg.Expr, err)
			}
			queries++
			if n == 0 {
				empty++
			}
		}
	}
	t.Logf("%d dashboard queries accepted (%d with no series yet, such as rates over fresh counters)", queries, empty)

	alert := func() string {
		var res struct {
			Alerts []struct {
				Labels map[string]string
				State  string
			}
		}
		if err := api("/api/v1/alerts", nil, &res); err != nil {
			return "error: " + err.Error()
		}
		for _, a := range res.Alerts {
			if a.Labels["alertname"] == "NodeagentTunnelUnhealthy" && a.Labels["device"] == l.Dev {
				return a.State
			}
		}
		return ""
	}
	if s := alert(); s != "" {
		t.Fatalf("NodeagentTunnelUnhealthy is %s with the tunnel healthy", s)
	}
	for _, s := range l.Stub.Servers {
		s.Down()
	}
	start := time.Now()
	var states []string
	waitFor(t, "NodeagentTunnelUnhealthy firing", 90*time.Second, func() bool {
		s := alert()
		if len(states) == 0 || states[len(states)-1] != s {
			states = append(states, s)
		}
		return s == "firing"
	})
	t.Logf("tunnel broken at the stub -> alert firing after %s; states seen %q", time.Since(start).Round(100*time.Millisecond), states)
	if !strings.Contains(strings.Join(states, ","), "pending") {
		t.Errorf("the alert went %q, never pending", states)
	}
	for _, s := range l.Stub.Servers {
		s.Up()
	}
	waitFor(t, "NodeagentTunnelUnhealthy resolved", 90*time.Second, func() bool { return alert() == "" })
}
