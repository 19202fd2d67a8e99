package packaging

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestEnvironmentFile: the unit reads /etc/default/nodeagent (optional:
// "-"), the package ships it as a conffile, and as shipped it sets nothing
// (no metrics listener until the operator asks for one) while showing how
// to set NODEAGENT_METRICS. The package VM test sets it and scrapes.
func TestEnvironmentFile(t *testing.T) {
	unit, err := os.ReadFile("../systemd/nodeagent.service")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^EnvironmentFile=-/etc/default/nodeagent$`).Match(unit) {
		t.Error("systemd/nodeagent.service does not read EnvironmentFile=-/etc/default/nodeagent")
	}
	nfpm, err := os.ReadFile("nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^  - src: packaging/etc/default/nodeagent\n    dst: /etc/default/nodeagent\n    type: config\|noreplace\n`).Match(nfpm) {
		t.Error("nfpm.yaml does not ship packaging/etc/default/nodeagent as the conffile /etc/default/nodeagent")
	}
	b, err := os.ReadFile("etc/default/nodeagent")
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			t.Errorf("etc/default/nodeagent:%d sets %q; as shipped it must set nothing", i+1, l)
		}
	}
	for _, want := range []string{"#NODEAGENT_METRICS=127.0.0.1:9477\n", "systemctl restart nodeagent"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("etc/default/nodeagent lacks %q", want)
		}
	}
}
