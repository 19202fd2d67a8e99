package sysctl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/host"
)

// fakeRoot builds a /proc/sys look-alike from path → content.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func syncOnce(t *testing.T, h *host.Host, d Desired) (Plan, error) {
	t.Helper()
	ctx := context.Background()
	o, err := Observe(ctx, h.Snapshot(), d)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	p := MakePlan(d, o)
	_, rep := Apply(ctx, h.Snapshot(), p)
	err = rep.Err()
	return p, err
}

// TestFakeTree runs Observe and Apply against a directory tree, so glob
// expansion, '/' in interface names and pending keys are covered without
// root.
func TestFakeTree(t *testing.T) {
	h, err := host.Current()
	if err != nil {
		t.Skipf("no netlink handle: %v", err)
	}
	defer h.Close()
	root := fakeRoot(t, map[string]string{
		"net/ipv4/ip_forward":                        "0\n",
		"net/ipv4/ip_local_port_range":               "32768\t60999\n",
		"net/ipv4/conf/all/rp_filter":                "0\n",
		"net/ipv4/conf/nodeagent-x9.50/rp_filter":    "0\n",
		"net/ipv6/conf/all/forwarding":               "0\n",
		"net/ipv6/conf/default/forwarding":           "0\n",
		"net/ipv6/conf/nodeagent-x9.50/forwarding":   "1\n",
		"net/ipv6/conf/nodeagent-x9.50/disable_ipv6": "0\n",
	})
	d := Desired{Root: root, Values: map[string]string{
		"net.ipv4.ip_forward":                        "1",
		"net.ipv4.ip_local_port_range":               "20000 40000",
		"net.ipv4.conf.nodeagent-x9/50.rp_filter":    "2",
		"net.ipv4.conf.nodeagent-absent.rp_filter":   "2",
		"net.ipv6.conf.*.forwarding":                 "1",
		"net.ipv4.conf.nodeagent-x9/50.no_such_knob": "1",
	}}
	p, err := syncOnce(t, h, d)
	want := `~ sysctl net.ipv4.ip_forward 0 -> 1
~ sysctl net.ipv4.ip_local_port_range "32768 60999" -> "20000 40000"
~ sysctl net.ipv6.conf.all.forwarding 0 -> 1
~ sysctl net.ipv6.conf.default.forwarding 0 -> 1
! sysctl net.ipv4.conf.nodeagent-absent.rp_filter: pending: no such key yet (interface nodeagent-absent not present)
! sysctl net.ipv4.conf.nodeagent-x9/50.no_such_knob: no such key
~ sysctl net.ipv4.conf.nodeagent-x9/50.rp_filter 0 -> 2
`
	if diff := cmp.Diff(want, p.String()); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	if !isPending(err) || !strings.Contains(err.Error(), "no_such_knob: no such key") {
		t.Fatalf("want a pending and a no-such-key error, got %v", err)
	}
	for p, v := range map[string]string{
		"net/ipv4/ip_forward":                     "1\n",
		"net/ipv4/ip_local_port_range":            "20000 40000\n",
		"net/ipv4/conf/nodeagent-x9.50/rp_filter": "2\n",
		"net/ipv6/conf/default/forwarding":        "1\n",
	} {
		if b, _ := os.ReadFile(filepath.Join(root, p)); string(b) != v {
			t.Errorf("%s = %q, want %q", p, b, v)
		}
	}
	if got := h.Writes(); got != 5 {
		t.Errorf("%d writes, want 5", got)
	}

	// Without the broken keys the next sync is a no-op.
	delete(d.Values, "net.ipv4.conf.nodeagent-absent.rp_filter")
	delete(d.Values, "net.ipv4.conf.nodeagent-x9/50.no_such_knob")
	before := h.Writes()
	if p, err := syncOnce(t, h, d); err != nil || !p.Empty() || h.Writes() != before {
		t.Fatalf("second sync was not a no-op: plan %q, err %v, %d writes", p, err, h.Writes()-before)
	}
}
