package packaging

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// promtool is Debian's (the prometheus package; make test installs it).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is missing (make test installs the prometheus package)")
		}
		t.Skip("needs promtool (Debian's prometheus package; make test installs it)")
	}
	return p
}

// TestAlertRules: the shipped rules load, and their unit tests (every
// alert fires when it should, stays silent on a healthy node) pass.
func TestAlertRules(t *testing.T) {
	pt := promtool(t)
	for _, args := range [][]string{{"check", "rules", "nodeagent-alerts.yml"}, {"test", "rules", "nodeagent-alerts.test.yml"},
		// The example left out of the shipped alerts: a peer idle past its
		// own pattern fires, a weekly, a new and a disabled one do not.
		{"check", "rules", "nodeagent-peer-idle.example.yml"}, {"test", "rules", "nodeagent-peer-idle.example.test.yml"}} {
		cmd := exec.Command(pt, args...)
		cmd.Dir = "monitoring"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}
}

// TestAlertsHaveRunbooks: every alert says what happened and what to do.
func TestAlertsHaveRunbooks(t *testing.T) {
	b, err := os.ReadFile("monitoring/nodeagent-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := strings.Count(string(b), "- alert: ")
	if alerts < 10 || strings.Count(string(b), "summary: ") != alerts || strings.Count(string(b), "runbook: ") != alerts {
		t.Errorf("%d alerts, %d summaries, %d runbooks", alerts, strings.Count(string(b), "summary: "), strings.Count(string(b), "runbook: "))
	}
}

// dashboardExprs returns every PromQL expression of the dashboard, with
// its template variable $instance matching everything.
func dashboardExprs(t testing.TB, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			out = append(out, strings.ReplaceAll(tg.Expr, "$instance", ".*"))
		}
	}
	return out
}

func TestDashboardParses(t *testing.T) {
	exprs := dashboardExprs(t, "monitoring/nodeagent-dashboard.json")
	if len(exprs) < 10 {
		t.Errorf("%d queries", len(exprs))
	}
}
