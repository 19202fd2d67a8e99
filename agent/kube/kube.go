// Package kube labels and annotates the node's own Node object, with the
// node's own identity, by server-side apply.
//
// The Labeler runs in its own goroutine beside the reconcile loop and never
// blocks it: at cold boot the API server is usually not up yet, so links,
// routes, nftables and WireGuard converge first and labelling catches up,
// retrying with a capped backoff. Its state is the LabelsSynced condition.
//
// Ownership follows DESIGN.md §4: labels and annotations are written by
// server-side apply with field manager "nodeagent" and without force. A
// label that leaves the desired set leaves the Node, because SSA removes
// the fields a manager owned and no longer applies. A label another
// manager (kubectl, the kubelet, another controller) owns is not changed
// unless the config adopts it: an apply that would take it over
// conflicts, the key is dropped from the apply, the rest is applied, and
// LabelsSynced says Conflict and names it.
//
// Adoption is explicit per key (kubernetes.adoptLabels, Config.Adopt). A
// wanted, adopted key that the Node carries and another manager owns is
// taken over before the apply by the one write that is not an apply: a
// patch of metadata.managedFields alone, conditional on the
// resourceVersion read, that drops every other manager's claim on the key
// and gives it to nodeagent's apply entry, the value untouched, so the
// label is never absent. The apply that follows sets nodeagent's value,
// and from then on the key is nodeagent's alone: it leaves the Node when it
// leaves the config. adopt.go says why it takes exactly these two writes.
//
// The default credentials are the k3s kubelet's kubeconfig, so the agent is
// system:node:<name>: the Node authorizer and the NodeRestriction admission
// plugin let it modify its own Node only, and only labels outside the
// kubernetes.io and k8s.io namespaces (netcfg/config rejects the others at
// load). Annotations are not restricted.
package kube

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/config"
)

// FieldManager is the server-side apply field manager of every write.
const FieldManager = "nodeagent"

// DefaultKubeconfig is the k3s kubelet's kubeconfig: the node's own
// identity, system:node:<name>.
const DefaultKubeconfig = "/var/lib/rancher/k3s/agent/kubelet.kubeconfig"

// Annotations nodeagent sets on its Node.
const (
	// AnnotationStatus is Snapshot.Summary, a one-line status.
	AnnotationStatus = "nodeagent.io/status"
	// AnnotationWireGuardLivePeers is how many peers of the node's
	// WireGuard servers have an endpoint and a handshake younger than 3
	// minutes, summed over the servers: nonzero on the node the router
	// really forwards the VPN port to.
	AnnotationWireGuardLivePeers = "nodeagent.io/wireguard-live-peers"
	// AnnotationWireGuardLive is the same per server device, sorted by
	// name: "wg0=2/5" means 2 of its 5 peers are live.
	AnnotationWireGuardLive = "nodeagent.io/wireguard-live"
	// AnnotationPIAPort is the port PIA forwards to the node: the number
	// for one PIA device with a port, "wg-pia=47047,wg-pia2=51000" (sorted
	// by device) for several; absent while there is none.
	AnnotationPIAPort = "nodeagent.io/pia-forwarded-port"
)

// Defaults of Config fields left at zero.
const (
	DefaultMinBackoff = time.Second
	DefaultMaxBackoff = time.Minute
	DefaultResync     = 5 * time.Minute
	// maxSummary bounds AnnotationStatus; the Node is read by every
	// scheduler and agent in the cluster.
	maxSummary = 256
)

// Reasons of the LabelsSynced condition.
const (
	ReasonSynced        = "Synced"
	ReasonDisabled      = "Disabled"
	ReasonPending       = "Pending"
	ReasonNoCredentials = "NoCredentials"
	ReasonUnreachable   = "Unreachable"
	ReasonForbidden     = "Forbidden"
	ReasonUnauthorized  = "Unauthorized"
	ReasonNodeNotFound  = "NodeNotFound"
	ReasonConflict      = "Conflict"
	ReasonInvalid       = "Invalid"
	ReasonAPIError      = "APIError"
)

// Config is what the Labeler applies and how.
type Config struct {
	// Enabled is false when the config asks for no labelling (see
	// config.Kubernetes.Enabled). A Labeler that was enabled and is
	// disabled by SetConfig removes what it had applied, then idles.
	Enabled bool
	// Kubeconfig is the credentials' file. "" means the in-cluster service
	// account inside a pod, else DefaultKubeconfig. It is read at each
	// connection attempt, because at cold boot k3s has not written it yet.
	Kubeconfig string
	// RESTConfig, when set, is used instead of Kubeconfig.
	RESTConfig *rest.Config
	// NodeName is the Node to label: node.name, or the hostname.
	NodeName string
	// Labels are always on the Node.
	Labels map[string]string
	// Conditional labels are on the Node while their When holds.
	Conditional []config.ConditionalLabel
	// Adopt are the keys of Labels and Conditional that nodeagent takes
	// over from another field manager (see adopt.go); any other key
	// another manager owns with another value is a conflict left alone.
	Adopt []string
	// Hold is how long a condition must hold, or fail, before its label
	// follows; it also spaces out annotation-only updates, so a flapping
	// peer count does not write the Node on every sync.
	Hold time.Duration
	// WireGuardServers are the WireGuard devices whose live peers are
	// annotated: those with a listenPort that are not PIA tunnels.
	WireGuardServers []string
	// MinBackoff and MaxBackoff bound the retry delay after a failure
	// (default 1s and 1m).
	MinBackoff, MaxBackoff time.Duration
	// Resync is how often an unchanged desired state is applied again, to
	// repair a label removed by hand or a re-registered Node (default 5m).
	Resync time.Duration
}

// FromConfig returns the Labeler config for c. The node name is
// node.name, else the lowercased hostname, as the kubelet registers it.
func FromConfig(c *config.Config) (Config, error) {
	k := c.Kubernetes
	name := c.Node.Name
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return Config{}, fmt.Errorf("node name: %w", err)
		}
		name = strings.ToLower(h)
	}
	kc := Config{
		Enabled:    k.Enabled(),
		Kubeconfig: k.Kubeconfig,
		NodeName:   name,
		Hold:       k.Hold,
	}
	if len(k.Labels) > 0 {
		kc.Labels = make(map[string]string, len(k.Labels))
		for key, v := range k.Labels {
			kc.Labels[key] = v
		}
	}
	kc.Conditional = append(kc.Conditional, k.ConditionalLabels...)
	kc.Adopt = slices.Clone(k.AdoptLabels)
	for _, w := range c.WireGuard {
		if w.ListenPort != 0 && w.PIA == nil {
			kc.WireGuardServers = append(kc.WireGuardServers, w.Name)
		}
	}
	return kc, nil
}

func (c Config) minBackoff() time.Duration { return orDefault(c.MinBackoff, DefaultMinBackoff) }
func (c Config) maxBackoff() time.Duration { return orDefault(c.MaxBackoff, DefaultMaxBackoff) }
func (c Config) resync() time.Duration     { return orDefault(c.Resync, DefaultResync) }

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// clientKey identifies the credentials and target of c: a change of either
// needs a new client.
func (c Config) clientKey() string {
	if c.RESTConfig != nil {
		return fmt.Sprintf("rest:%p", c.RESTConfig)
	}
	return "file:" + c.Kubeconfig
}

// Snapshot is what the daemon observed in one sync. The Labeler keeps the
// latest; the caller must not modify it after Update.
type Snapshot struct {
	// Conditions are keyed by config.When.String(), like
	// "wireguard/wg-pia/healthy", "vlan/enp1s0.50/up",
	// "checks/arp-reachable" and "converged". A missing key is false.
	Conditions map[string]bool
	// WireGuard is every configured WireGuard device with its peers.
	WireGuard []api.WireGuardDevice
	// PIAPorts are the PIA devices' forwarded ports (devices without one
	// left out).
	PIAPorts map[string]int
	// Summary is a one-line status for AnnotationStatus. Keep it free of
	// counters and times: every change is a write to the Node.
	Summary string
	// At is when it was observed (default: when Update is called).
	At time.Time
}

// Labeler keeps the node's Node object labelled. Its methods are safe for
// concurrent use; Run must be called exactly once.
type Labeler struct {
	log  *slog.Logger
	wake chan struct{}
	now  func() time.Time
	// newClient builds the API client; tests replace it.
	newClient func(Config) (*nodeClient, error)
	// client is built from clientKey's credentials; only Run's goroutine
	// touches these.
	client    *nodeClient
	clientKey string

	mu sync.Mutex
	// cfg is the config to apply; cfgChanged tells Run to retry at once.
	cfg        Config
	cfgChanged bool
	snap       Snapshot
	hasSnap    bool
	hyst       hysteresis
	cond       api.Condition
}

// New returns a Labeler for cfg. It does nothing until Run.
func New(cfg Config, log *slog.Logger) *Labeler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Labeler{
		log:       log.With("subsystem", "kube"),
		wake:      make(chan struct{}, 1),
		now:       time.Now,
		newClient: newClient,
		cfg:       cfg,
		hyst:      hysteresis{},
	}
	l.hyst.configure(cfg.Conditional)
	if cfg.Enabled {
		l.cond = api.Condition{Type: api.CondLabelsSynced, Status: api.False, Reason: ReasonPending,
			Message: fmt.Sprintf("node %s not labelled yet", cfg.NodeName), LastTransitionTime: l.now()}
	} else {
		l.cond = disabledCondition(l.now())
	}
	return l
}

func disabledCondition(at time.Time) api.Condition {
	return api.Condition{Type: api.CondLabelsSynced, Status: api.True, Reason: ReasonDisabled,
		Message: "no kubernetes labels configured", LastTransitionTime: at}
}

// Update records the latest snapshot and wakes Run. It never blocks on the
// API server: the latest snapshot wins.
func (l *Labeler) Update(s Snapshot) {
	l.mu.Lock()
	if s.At.IsZero() {
		s.At = l.now()
	}
	l.snap, l.hasSnap = s, true
	l.hyst.observe(s.Conditions, s.At)
	l.mu.Unlock()
	l.kick()
}

// SetConfig replaces the config, as on a daemon reload, and wakes Run to
// apply it at once (a pending backoff is cut short). Conditional labels
// whose When is unchanged keep their hysteresis state.
func (l *Labeler) SetConfig(cfg Config) {
	l.mu.Lock()
	l.cfg = cfg
	l.cfgChanged = true
	l.hyst.configure(cfg.Conditional)
	if l.hasSnap {
		l.hyst.observe(l.snap.Conditions, l.snap.At)
	}
	l.mu.Unlock()
	l.kick()
}

// Condition returns the LabelsSynced condition.
func (l *Labeler) Condition() api.Condition {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cond
}

func (l *Labeler) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// setCondition records the LabelsSynced condition, moving
// LastTransitionTime only when the status changes, and logs changes.
func (l *Labeler) setCondition(status, reason, msg string) {
	l.mu.Lock()
	old := l.cond
	l.cond.Type, l.cond.Reason, l.cond.Message = api.CondLabelsSynced, reason, msg
	if old.Status != status {
		l.cond.Status = status
		l.cond.LastTransitionTime = l.now()
	}
	l.mu.Unlock()
	if old.Status == status && old.Reason == reason && old.Message == msg {
		return
	}
	if status == api.True {
		l.log.Info("labels synced", "reason", reason, "message", msg)
	} else {
		l.log.Warn("labels not synced", "reason", reason, "message", msg)
	}
}
