package packaging

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// kube-prometheus-stack's side of the monitoring: the scrape manifests and
// the rules as a PrometheusRule.
const (
	serviceMonitorFile = "monitoring/nodeagent-servicemonitor.yaml"
	prometheusRuleFile = "monitoring/nodeagent-prometheusrule.yaml"
	alertsFile         = "monitoring/nodeagent-alerts.yml"
)

// prometheusRuleHeader is what the generated PrometheusRule holds above
// the rules file's groups.
const prometheusRuleHeader = `# nodeagent's alerting rules as a PrometheusRule, for kube-prometheus-stack.
# GENERATED from nodeagent-alerts.yml, which is the one to edit; the test
# that keeps them equal rewrites this file with
#   NODEAGENT_UPDATE_GOLDEN=1 go test -run TestPrometheusRule ./packaging
# Shipped as /usr/share/doc/nodeagent/examples/monitoring/nodeagent-prometheusrule.yaml:
#   kubectl apply -f nodeagent-prometheusrule.yaml
# The targets come from nodeagent-servicemonitor.yaml (job "nodeagent").
# Apply it as it is (kubectl, Argo CD): Helm's templating would take the
# {{ $labels.... }} of the annotations for its own.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: nodeagent
  namespace: monitoring
  labels:
    # EDIT: the label your Prometheus selects rules by; the chart's default
    # is release: <its Helm release name>.
    release: kube-prometheus-stack
spec:
`

// prometheusRule renders the rules file as a PrometheusRule: its header
// comment dropped, its groups indented under spec.
func prometheusRule(rules []byte) []byte {
	var b strings.Builder
	b.WriteString(prometheusRuleHeader)
	body := string(rules)
	for strings.HasPrefix(body, "#") {
		_, body, _ = strings.Cut(body, "\n")
	}
	for _, l := range strings.SplitAfter(body, "\n") {
		if strings.TrimSpace(l) != "" {
			b.WriteString("  ")
		}
		b.WriteString(l)
	}
	return []byte(b.String())
}

// TestPrometheusRule: the shipped PrometheusRule is the rules file, so the
// two cannot drift: byte for byte as generated, and its spec.groups the
// same YAML as the file's groups, which promtool checks.
func TestPrometheusRule(t *testing.T) {
	rules := mustRead(t, alertsFile)
	want := prometheusRule(rules)
	if os.Getenv("NODEAGENT_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(prometheusRuleFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatalf("%v (NODEAGENT_UPDATE_GOLDEN=1 writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not %s as generated; NODEAGENT_UPDATE_GOLDEN=1 go test -run TestPrometheusRule ./packaging rewrites it", prometheusRuleFile, alertsFile)
	}
	var pr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name, Namespace string
			Labels          map[string]string
		}
		Spec struct {
			Groups any `yaml:"groups"`
		}
	}
	var file struct {
		Groups any `yaml:"groups"`
	}
	if err := yaml.Unmarshal(got, &pr); err != nil {
		t.Fatalf("%s: %v", prometheusRuleFile, err)
	}
	if err := yaml.Unmarshal(rules, &file); err != nil {
		t.Fatal(err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Labels["release"] == "" {
		t.Errorf("%s: %s %s %+v", prometheusRuleFile, pr.APIVersion, pr.Kind, pr.Metadata)
	}
	if pr.Spec.Groups == nil || !reflect.DeepEqual(pr.Spec.Groups, file.Groups) {
		t.Errorf("%s's spec.groups differ from %s's groups", prometheusRuleFile, alertsFile)
	}
	// promtool on the spec as Prometheus will load it.
	pt, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("needs promtool for the last check (Debian's prometheus package)")
	}
	spec, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "spec.yml")
	os.WriteFile(p, spec, 0o644)
	if out, err := exec.Command(pt, "check", "rules", p).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the PrometheusRule's spec: %v\n%s", err, out)
	}
}

// TestServiceMonitor: the scrape manifests hang together: the ServiceMonitor
// selects the Service by its labels in its namespace and scrapes its port
// by name, the Endpoints share the Service's name and port, carry each
// node's name, and the job (the Service's name) is one the rules match.
func TestServiceMonitor(t *testing.T) {
	type port struct {
		Name       string
		Port       int
		TargetPort int `yaml:"targetPort"`
		Protocol   string
	}
	type meta struct {
		Name, Namespace string
		Labels          map[string]string
	}
	var svc struct {
		Kind     string
		Metadata meta
		Spec     struct {
			ClusterIP string `yaml:"clusterIP"`
			Selector  map[string]string
			Ports     []port
		}
	}
	var eps struct {
		Kind     string
		Metadata meta
		Subsets  []struct {
			Addresses []struct {
				IP       string
				NodeName string `yaml:"nodeName"`
			}
			Ports []port
		}
	}
	var sm struct {
		Kind     string
		Metadata meta
		Spec     struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			}
			NamespaceSelector struct {
				MatchNames []string `yaml:"matchNames"`
			} `yaml:"namespaceSelector"`
			Endpoints []struct {
				Port, Path, Interval string
				Relabelings          []map[string]any
			}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(mustRead(t, serviceMonitorFile)))
	for _, into := range []any{&svc, &eps, &sm} {
		if err := dec.Decode(into); err != nil {
			t.Fatalf("%s: %v", serviceMonitorFile, err)
		}
	}
	if svc.Kind != "Service" || eps.Kind != "Endpoints" || sm.Kind != "ServiceMonitor" {
		t.Fatalf("%s holds %s, %s, %s", serviceMonitorFile, svc.Kind, eps.Kind, sm.Kind)
	}
	if svc.Spec.Selector != nil || svc.Metadata.Name != eps.Metadata.Name || svc.Metadata.Namespace != eps.Metadata.Namespace {
		t.Errorf("the Service needs no selector and the Endpoints its name and namespace: %+v %+v", svc.Metadata, eps.Metadata)
	}
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Metadata.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the Service lacks", k, v)
		}
	}
	if len(sm.Spec.NamespaceSelector.MatchNames) != 1 || sm.Spec.NamespaceSelector.MatchNames[0] != svc.Metadata.Namespace || sm.Metadata.Labels["release"] == "" {
		t.Errorf("the ServiceMonitor looks in %v (the Service is in %s), labels %v", sm.Spec.NamespaceSelector.MatchNames, svc.Metadata.Namespace, sm.Metadata.Labels)
	}
	if len(svc.Spec.Ports) != 1 || len(eps.Subsets) != 1 || len(eps.Subsets[0].Ports) != 1 || len(sm.Spec.Endpoints) != 1 ||
		sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name || eps.Subsets[0].Ports[0].Name != svc.Spec.Ports[0].Name ||
		eps.Subsets[0].Ports[0].Port != svc.Spec.Ports[0].TargetPort || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ports: Service %+v, Endpoints %+v, ServiceMonitor %+v", svc.Spec.Ports, eps.Subsets, sm.Spec.Endpoints)
	}
	for _, a := range eps.Subsets[0].Addresses {
		if _, err := netip.ParseAddr(a.IP); err != nil || a.NodeName == "" {
			t.Errorf("endpoint address %+v: an IP and its Node's name", a)
		}
	}
	// The job is the Service's name; NodeagentDown must see it.
	if !strings.Contains(svc.Metadata.Name, "nodeagent") || !strings.Contains(string(mustRead(t, alertsFile)), `up{job=~".*nodeagent.*"}`) {
		t.Errorf("the job %q is not one NodeagentDown matches", svc.Metadata.Name)
	}
}
