package kube

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/config"
)

var t0 = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

const gw = "homelab.example/egress-gateway"

// TestHysteresis drives one conditional label through observations and
// checks its effective state after each.
func TestHysteresis(t *testing.T) {
	type step struct {
		at    time.Duration // after t0
		cond  *bool         // observed condition, nil: no observation
		owned *bool         // the Node's state, learnt at this step
		want  bool          // label in the desired set after settling
		next  time.Duration // when the next change is due, -1: none
	}
	yes, no := new(bool), new(bool)
	*yes = true
	const hold = 30 * time.Second
	tests := []struct {
		name  string
		steps []step
	}{
		{"holds before it appears", []step{
			{at: 0, cond: yes, owned: no, want: false, next: 30 * time.Second},
			{at: 10 * time.Second, cond: yes, want: false, next: 30 * time.Second},
			{at: 30 * time.Second, want: true, next: -1},
		}},
		{"flapping faster than hold never changes", []step{
			{at: 0, cond: no, owned: no, want: false, next: -1},
			{at: 5 * time.Second, cond: yes, want: false, next: 35 * time.Second},
			{at: 20 * time.Second, cond: no, want: false, next: -1},
			{at: 40 * time.Second, cond: yes, want: false, next: 70 * time.Second},
			{at: 60 * time.Second, cond: no, want: false, next: -1},
			{at: 100 * time.Second, want: false, next: -1},
		}},
		{"a label the Node carries stays through a short failure", []step{
			{at: 0, cond: no, owned: yes, want: true, next: 30 * time.Second},
			{at: 20 * time.Second, cond: yes, want: true, next: -1},
			{at: 60 * time.Second, want: true, next: -1},
		}},
		{"a label the Node carries goes after a long failure", []step{
			{at: 0, cond: no, owned: yes, want: true, next: 30 * time.Second},
			{at: 31 * time.Second, want: false, next: -1},
		}},
		{"conditions seen while the API server was down count", []step{
			{at: 0, cond: yes, want: false, next: -1}, // Node not read yet
			{at: 10 * time.Minute, owned: no, want: true, next: -1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := hysteresis{}
			h.configure([]config.ConditionalLabel{{Key: gw, Value: "true", When: "wireguard/wg-pia/healthy"}})
			cfg := Config{Enabled: true, Conditional: []config.ConditionalLabel{{Key: gw, Value: "true", When: "wireguard/wg-pia/healthy"}}}
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				if s.cond != nil {
					h.observe(map[string]bool{"wireguard/wg-pia/healthy": *s.cond}, now)
				}
				if s.owned != nil {
					h.init(map[string]bool{gw: *s.owned})
				}
				next := h.settle(now, hold)
				_, got := desiredState(cfg, Snapshot{}, h).Labels[gw]
				wantNext := time.Time{}
				if s.next >= 0 {
					wantNext = t0.Add(s.next)
				}
				if got != s.want || !next.Equal(wantNext) {
					t.Errorf("step %d (t0+%s): label %v, next %v; want %v, %v", i, s.at, got, next, s.want, wantNext)
				}
			}
		})
	}
}

func TestHysteresisConfigure(t *testing.T) {
	h := hysteresis{}
	h.configure([]config.ConditionalLabel{{Key: "a", When: "converged"}, {Key: "b", When: "converged"}})
	h.init(map[string]bool{"a": true, "b": true})
	h.configure([]config.ConditionalLabel{{Key: "a", When: "converged"}, {Key: "b", When: "checks/arp-reachable"}, {Key: "c", When: "converged"}})
	got := map[string]bool{}
	for k, tr := range h {
		got[k] = tr.effKnown
	}
	// a keeps its state; b's condition changed and c is new: both start
	// over and learn the Node's state again.
	want := map[string]bool{"a": true, "b": false, "c": false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("effKnown after reconfigure (-want +got):\n%s", diff)
	}
}

func TestDesiredState(t *testing.T) {
	ago := func(d time.Duration) *time.Time { x := t0.Add(-d); return &x }
	devs := []api.WireGuardDevice{
		{Name: "wg0", Peers: []api.WireGuardPeer{
			{Name: "phone", Endpoint: "198.51.100.7:4000", LastHandshake: ago(10 * time.Second)},
			{Name: "laptop", Endpoint: "198.51.100.8:4000", LastHandshake: ago(5 * time.Minute)},
			{Name: "roamed", LastHandshake: ago(10 * time.Second)}, // no endpoint
			{Name: "never", Endpoint: "198.51.100.9:4000"},
		}},
		{Name: "wg-pia", Peers: []api.WireGuardPeer{{Endpoint: "203.0.113.1:1337", LastHandshake: ago(time.Second)}}},
	}
	tests := []struct {
		name string
		cfg  Config
		snap Snapshot
		want desired
	}{
		{
			name: "disabled asks for nothing",
			cfg:  Config{Labels: map[string]string{"homelab.example/a": "1"}},
			snap: Snapshot{Summary: "converged"},
			want: desired{Labels: map[string]string{}, Annotations: map[string]string{}},
		},
		{
			name: "static labels and summary",
			cfg:  Config{Enabled: true, Labels: map[string]string{"homelab.example/vpn-ingress": "true"}},
			snap: Snapshot{Summary: "  converged,\n 3 peers  "},
			want: desired{
				Labels:      map[string]string{"homelab.example/vpn-ingress": "true"},
				Annotations: map[string]string{AnnotationStatus: "converged, 3 peers"},
			},
		},
		{
			name: "live peers of the servers only",
			cfg:  Config{Enabled: true, WireGuardServers: []string{"wg1", "wg0"}},
			snap: Snapshot{WireGuard: devs, At: t0},
			want: desired{
				Labels: map[string]string{},
				Annotations: map[string]string{
					AnnotationWireGuardLive:      "wg0=1/4,wg1=0/0",
					AnnotationWireGuardLivePeers: "1",
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := desiredState(tt.cfg, tt.snap, hysteresis{})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("desiredState (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummaryCut(t *testing.T) {
	s := strings.Repeat("é", maxSummary) // 2 bytes each
	got := summary(s)
	if len(got) > maxSummary || !strings.HasPrefix(s, got) || len(got) != maxSummary {
		t.Errorf("summary cut to %d bytes, prefix %v; want %d bytes on a character boundary", len(got), strings.HasPrefix(s, got), maxSummary)
	}
}

func TestConflicts(t *testing.T) {
	applyConflict := func(fields ...string) error {
		var causes []metav1.StatusCause
		for _, f := range fields {
			causes = append(causes, metav1.StatusCause{Type: metav1.CauseTypeFieldManagerConflict, Message: `conflict with "kubectl-label"`, Field: f})
		}
		return &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonConflict,
			Details: &metav1.StatusDetails{Causes: causes},
		}}
	}
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"labels and annotations", fmt.Errorf("label node n1: %w", applyConflict(".metadata.labels.homelab.example/vpn-ingress", ".metadata.annotations.nodeagent.io/status")), []string{
			`label homelab.example/vpn-ingress is owned by "kubectl-label" with another value`,
			`annotation nodeagent.io/status is owned by "kubectl-label" with another value`,
		}},
		{"another field is not droppable", applyConflict(".metadata.labels.a", ".spec.taints"), nil},
		{"not a conflict", errors.New("connection refused"), nil},
		{"optimistic-lock conflict", apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "n1", errors.New("changed")), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range conflicts(tt.err) {
				got = append(got, c.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("conflicts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReasonFor(t *testing.T) {
	nodes := schema.GroupResource{Resource: "nodes"}
	tests := []struct {
		err  error
		want string
	}{
		{&credentialsError{err: errors.New("open /var/lib/rancher/k3s/agent/kubelet.kubeconfig: no such file")}, ReasonNoCredentials},
		{apierrors.NewForbidden(nodes, "n2", errors.New(`node "n1" is not allowed to modify node "n2"`)), ReasonForbidden},
		{apierrors.NewUnauthorized("x"), ReasonUnauthorized},
		{fmt.Errorf("get node n1: %w", apierrors.NewNotFound(nodes, "n1")), ReasonNodeNotFound},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "n1", nil), ReasonInvalid},
		{apierrors.NewServiceUnavailable("starting"), ReasonUnreachable},
		{apierrors.NewInternalError(errors.New("etcd")), ReasonAPIError},
		{fmt.Errorf("get node n1: %w", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")), ReasonUnreachable},
	}
	for _, tt := range tests {
		if got := reasonFor(tt.err); got != tt.want {
			t.Errorf("reasonFor(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	cfg := Config{MinBackoff: time.Second, MaxBackoff: 10 * time.Second}
	var got []time.Duration
	for n := 1; n <= 6; n++ {
		// Round away the jitter (at most 10%).
		got = append(got, backoff(cfg, n).Truncate(time.Second))
	}
	want := []time.Duration{1, 2, 4, 8, 10, 10}
	for i := range want {
		want[i] *= time.Second
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backoff (-want +got):\n%s", diff)
	}
}

func TestOwned(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:kubernetes.io/hostname":{}}}}`)}},
		{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply,
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:homelab.example/a":{},"f:homelab.example/b":{}},"f:annotations":{"f:nodeagent.io/status":{}}}}`)}},
		// nodeagent never writes with Update; such an entry is not its apply.
		{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationUpdate,
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:homelab.example/c":{}}}}`)}},
	}
	labels, annotations := owned(mf, FieldManager)
	if diff := cmp.Diff(map[string]bool{"homelab.example/a": true, "homelab.example/b": true}, labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]bool{AnnotationStatus: true}, annotations); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
}

func TestFromConfig(t *testing.T) {
	c := &config.Config{
		Node: config.Node{Name: "n1"},
		WireGuard: []config.WireGuard{
			{Name: "wg0", ListenPort: 51820},
			{Name: "wg-pia", ListenPort: 1337, PIA: &config.PIA{Region: "nl"}},
			{Name: "wg-client"},
		},
		Kubernetes: config.Kubernetes{
			Labels:            map[string]string{"homelab.example/vpn-ingress": "true"},
			ConditionalLabels: []config.ConditionalLabel{{Key: gw, Value: "true", When: "wireguard/wg-pia/healthy"}},
			AdoptLabels:       []string{"homelab.example/vpn-ingress"},
			Hold:              time.Minute,
		},
	}
	got, err := FromConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Enabled:          true,
		NodeName:         "n1",
		Labels:           map[string]string{"homelab.example/vpn-ingress": "true"},
		Conditional:      []config.ConditionalLabel{{Key: gw, Value: "true", When: "wireguard/wg-pia/healthy"}},
		Adopt:            []string{"homelab.example/vpn-ingress"},
		Hold:             time.Minute,
		WireGuardServers: []string{"wg0"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FromConfig (-want +got):\n%s", diff)
	}
	c.Kubernetes = config.Kubernetes{}
	c.Node.Name = ""
	got, err = FromConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if got.Enabled || got.NodeName == "" || got.NodeName != strings.ToLower(got.NodeName) {
		t.Errorf("FromConfig without a kubernetes section = %+v; want disabled, with the lowercased hostname", got)
	}
}
