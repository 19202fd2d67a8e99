package config

import (
	"slices"
	"testing"
)

// TestAdoptLabels: kubernetes.adoptLabels lists keys of labels or of
// conditionalLabels, each once; anything else is an error at its path.
func TestAdoptLabels(t *testing.T) {
	const base = "kubernetes:\n" +
		"  labels:\n    homelab.example/vpn-ingress: \"true\"\n" +
		"  conditionalLabels:\n    - {key: homelab.example/egress, value: \"true\", when: converged}\n"
	c, err := parseTest(t, base+"  adoptLabels: [homelab.example/vpn-ingress, homelab.example/egress]\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"homelab.example/vpn-ingress", "homelab.example/egress"}; !slices.Equal(c.Kubernetes.AdoptLabels, want) {
		t.Errorf("adoptLabels = %q, want %q", c.Kubernetes.AdoptLabels, want)
	}
	c, err = parseTest(t, base)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kubernetes.AdoptLabels != nil {
		t.Errorf("adoptLabels default = %q, want none", c.Kubernetes.AdoptLabels)
	}

	for _, tc := range []struct{ name, src, want string }{
		{"unknown key", "  adoptLabels: [homelab.example/vpn-ingress, homelab.example/rack]\n",
			`nodeagent.yaml:6: kubernetes.adoptLabels[1]: "homelab.example/rack" is neither a key of kubernetes.labels nor of kubernetes.conditionalLabels; only a label nodeagent keeps can be adopted`},
		{"empty key", "  adoptLabels:\n    - \"\"\n",
			`nodeagent.yaml:7: kubernetes.adoptLabels[0]: empty; list keys of kubernetes.labels or kubernetes.conditionalLabels`},
		{"duplicate", "  adoptLabels:\n    - homelab.example/egress\n    - homelab.example/egress\n",
			`nodeagent.yaml:8: kubernetes.adoptLabels[1]: duplicate "homelab.example/egress"; first at kubernetes.adoptLabels[0] (line 7)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTest(t, base+tc.src)
			if got := errorStrings(t, err); !slices.Equal(got, []string{tc.want}) {
				t.Errorf("errors %q\nwant [%q]", got, tc.want)
			}
		})
	}
	// Without any labels, the key names nothing nodeagent keeps.
	_, err = parseTest(t, "kubernetes:\n  kubeconfig: /etc/k.yaml\n  adoptLabels: [homelab.example/x]\n")
	want := `nodeagent.yaml:3: kubernetes.adoptLabels[0]: "homelab.example/x" is neither a key of kubernetes.labels nor of kubernetes.conditionalLabels; only a label nodeagent keeps can be adopted`
	if got := errorStrings(t, err); !slices.Equal(got, []string{want}) {
		t.Errorf("errors %q\nwant [%q]", got, want)
	}
}
