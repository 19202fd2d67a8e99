package config

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"time"
)

// Gateway is a role that one node of several holds at a time: the VLAN's
// egress gateway. Every candidate node has the same section; who may hold
// the role is decided by a Kubernetes Lease (client-go's leader election),
// who does hold it by the wire: the holder claims the gateway addresses
// only after the Lease is its own and a duplicate-address probe finds no
// other node answering for them, and gives them up when it hears another
// node answer. What the role takes along moves with it: the gateway
// addresses on the shim, the WireGuard devices listed (a PIA tunnel with
// its forwarded port and hook), and the labels. The kill-switch tables,
// rules and nftables kill switch stay on every candidate, closed while it
// does not hold the role.
type Gateway struct {
	// Name names the role (required): a lowercase DNS label, such as
	// vlan50-egress. It names the Lease unless lease.name does, and the
	// role in status and metrics.
	Name string `yaml:"name"`
	// Lease is the Kubernetes Lease that elects the holder.
	Lease GatewayLease `yaml:"lease"`
	// Link is the link the gateway addresses live on (required): a VLAN or
	// macvlan the config declares, the shim the VLAN's pods route by.
	Link string `yaml:"link"`
	// Addresses are the gateway addresses (required, at least one; IPv4
	// and IPv6 prefixes, such as 10.10.50.1/24), held by the holder alone.
	// They are not also in the link's own addresses, and no other link
	// has them.
	Addresses []string `yaml:"addresses"`
	// WireGuard are devices the config declares that only the holder
	// brings up: a PIA device registers (and forwards its port, and runs
	// its hook) on the holder only, while a standby keeps its token and
	// server list fresh so that a take-over is one registration. Default:
	// none.
	WireGuard []string `yaml:"wireguard"`
	// Labels are labels on the holder's Node only, key to value, as in
	// kubernetes.labels and not also there. They leave a Node before they
	// reach the next holder's, also when the holder died (the new holder
	// removes them from the old holder's Node with the Lease's
	// credentials). Default: none.
	Labels map[string]string `yaml:"labels"`
	// Preferred is a node that holds the role whenever it is a candidate
	// that can. Default: none, any candidate.
	Preferred GatewayPreferred `yaml:"preferred"`
	// Probe is the duplicate-address probe of a claim and the
	// announcements after it (dad's fields). A candidate probes the wire
	// just before it takes the Lease, and once more after: a claim need
	// not take RFC 5227's seconds. Default: 1 probe, 200ms of listening,
	// 3 announcements 100ms apart.
	Probe DAD `yaml:"probe"`
}

// GatewayLease is the Lease a gateway role is elected by.
type GatewayLease struct {
	// Namespace is the Lease's namespace. Default: nodeagent.
	Namespace string `yaml:"namespace"`
	// Name is the Lease's name. Default: the role's name.
	Name string `yaml:"name"`
	// Kubeconfig is the credentials the Lease is read and written with
	// (required, an absolute path, readable by root only): a ServiceAccount
	// allowed exactly that Lease, as packaging/examples/gateway-rbac.yaml
	// ships it. Not the node's own identity: the NodeRestriction admission
	// plugin lets a node write no Lease but its own heartbeat in
	// kube-node-lease.
	Kubeconfig string `yaml:"kubeconfig"`
	// Duration is how long a holder that stops renewing keeps the Lease
	// before a standby may take it, 2s-5m. Default: 15s.
	Duration time.Duration `yaml:"duration"`
	// RenewDeadline is how long the holder keeps retrying a renewal, 1s-5m,
	// below duration. Default: 10s.
	RenewDeadline time.Duration `yaml:"renewDeadline"`
	// RetryPeriod is how often candidates try the Lease, 100ms-1m, at most
	// renewDeadline/1.2. Default: 2s.
	RetryPeriod time.Duration `yaml:"retryPeriod"`
}

// GatewayPreferred is the node a gateway role prefers.
type GatewayPreferred struct {
	// Node is the preferred node's name. Default: none.
	Node string `yaml:"node"`
	// TakeBack makes the holder hand the role to the preferred node once
	// that node is back as a candidate; without it the preferred node only
	// wins elections it takes part in. Default: false.
	TakeBack bool `yaml:"takeBack"`
}

// Defaults of a gateway role.
const (
	DefaultGatewayLeaseNamespace = "nodeagent"
	DefaultGatewayLeaseDuration  = 15 * time.Second
	DefaultGatewayRenewDeadline  = 10 * time.Second
	DefaultGatewayRetryPeriod    = 2 * time.Second
	DefaultGatewayProbes         = 1
	DefaultGatewayProbeInterval  = 100 * time.Millisecond
	DefaultGatewayProbeWait      = 200 * time.Millisecond
	DefaultGatewayAnnouncements  = 3
)

// dns1123LabelRE is a lowercase DNS label: a namespace's or a role's name.
var dns1123LabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// gatewayDefaults fills the role's fields left at zero.
func gatewayDefaults(g *Gateway, pos positions) {
	if g == nil {
		return
	}
	l := &g.Lease
	if l.Namespace == "" {
		l.Namespace = DefaultGatewayLeaseNamespace
	}
	if l.Name == "" {
		l.Name = g.Name
	}
	if l.Duration == 0 {
		l.Duration = DefaultGatewayLeaseDuration
	}
	if l.RenewDeadline == 0 {
		l.RenewDeadline = DefaultGatewayRenewDeadline
	}
	if l.RetryPeriod == 0 {
		l.RetryPeriod = DefaultGatewayRetryPeriod
	}
	if g.Probe.Probes == 0 {
		g.Probe.Probes = DefaultGatewayProbes
	}
	if g.Probe.Interval == 0 {
		g.Probe.Interval = DefaultGatewayProbeInterval
	}
	if g.Probe.Wait == 0 {
		g.Probe.Wait = DefaultGatewayProbeWait
	}
	if _, written := pos["gateway.probe.announcements"]; g.Probe.Announcements == 0 && !written {
		g.Probe.Announcements = DefaultGatewayAnnouncements
	}
}

// GatewayPrefixes are the role's addresses, parsed; the config must have
// validated.
func (g *Gateway) GatewayPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range g.Addresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// gateway checks the gateway role against the rest of the config.
func (v *validator) gateway(c *Config, links map[string]link, seen addrSeen) {
	g := c.Gateway
	if g == nil {
		return
	}
	if g.Name == "" {
		v.errorf("gateway.name", "required (a lowercase DNS label naming the role, such as vlan50-egress)")
	} else if len(g.Name) > 63 || !dns1123LabelRE.MatchString(g.Name) {
		v.errorf("gateway.name", "%q is not a lowercase DNS label (a-z, 0-9 and '-', at most 63)", g.Name)
	}
	l := g.Lease
	if l.Namespace != "" && (len(l.Namespace) > 63 || !dns1123LabelRE.MatchString(l.Namespace)) {
		v.errorf("gateway.lease.namespace", "%q is not a namespace name (a lowercase DNS label)", l.Namespace)
	}
	if l.Name != "" && v.written("gateway.lease.name") && (len(l.Name) > maxSubdomainLen || !dns1123RE.MatchString(l.Name)) {
		v.errorf("gateway.lease.name", "%q is not a Lease name (a lowercase DNS subdomain)", l.Name)
	}
	if l.Kubeconfig == "" {
		v.errorf("gateway.lease.kubeconfig", "required: the credentials that may read and write the role's Lease (packaging/examples/gateway-rbac.yaml makes them); the node's own identity cannot, since NodeRestriction confines a node to its own heartbeat Lease")
	} else {
		v.secretFile("gateway.lease.kubeconfig", l.Kubeconfig)
	}
	durs := []struct {
		path   string
		d      time.Duration
		lo, hi time.Duration
	}{
		{"gateway.lease.duration", l.Duration, 2 * time.Second, 5 * time.Minute},
		{"gateway.lease.renewDeadline", l.RenewDeadline, time.Second, 5 * time.Minute},
		{"gateway.lease.retryPeriod", l.RetryPeriod, 100 * time.Millisecond, time.Minute},
	}
	ok := true
	for _, d := range durs {
		if d.d != 0 && (d.d < d.lo || d.d > d.hi) {
			v.errorf(d.path, "%s is outside %s-%s", d.d, d.lo, d.hi)
			ok = false
		}
	}
	if ok && l.Duration != 0 && l.RenewDeadline != 0 && l.RenewDeadline >= l.Duration {
		v.errorf("gateway.lease.renewDeadline", "%s is not below gateway.lease.duration (%s): a holder must give up renewing before the Lease can pass to another node", l.RenewDeadline, l.Duration)
	}
	if ok && l.RenewDeadline != 0 && l.RetryPeriod != 0 && float64(l.RenewDeadline) <= 1.2*float64(l.RetryPeriod) {
		v.errorf("gateway.lease.retryPeriod", "%s is too long for gateway.lease.renewDeadline (%s): at most renewDeadline/1.2, so a renewal is retried before its deadline", l.RetryPeriod, l.RenewDeadline)
	}

	lk, declared := links[g.Link]
	switch {
	case g.Link == "":
		v.errorf("gateway.link", "required: the shim (a VLAN or macvlan of this config) the gateway addresses live on")
	case !declared:
		v.errorf("gateway.link", "no VLAN or macvlan %q is declared", g.Link)
	case lk.kind == "wireguard":
		v.errorf("gateway.link", "%q is a WireGuard device; the gateway addresses live on a VLAN or macvlan the pods reach", g.Link)
	}
	if len(g.Addresses) == 0 {
		v.errorf("gateway.addresses", "required: the addresses the VLAN's pods route by (such as 10.10.50.1/24)")
	}
	v.addresses("gateway.addresses", g.Addresses, seen)

	for i, name := range g.WireGuard {
		p := indexPath("gateway.wireguard", i)
		if !slices.ContainsFunc(c.WireGuard, func(w WireGuard) bool { return w.Name == name }) {
			v.errorf(p, "no WireGuard interface %q is declared", name)
			continue
		}
		if slices.Index(g.WireGuard, name) != i {
			v.errorf(p, "duplicate %q", name)
		}
	}
	for _, key := range sortedKeys(g.Labels) {
		p := mapKeyPath("gateway.labels", key)
		if !v.check(p, checkLabelKey(key)) || !v.check(p, checkLabelValue(g.Labels[key])) {
			continue
		}
		if hasKey(c.Kubernetes.Labels, key) || slices.ContainsFunc(c.Kubernetes.ConditionalLabels, func(cl ConditionalLabel) bool { return cl.Key == key }) {
			v.errorf(p, "%q is also in kubernetes.labels or kubernetes.conditionalLabels; the role's label is on the holder's Node only", key)
		}
	}
	if len(g.Labels) > 0 && !c.Kubernetes.Enabled() {
		v.errorf("gateway.labels", "labels need kubernetes.kubeconfig (the node's own identity labels its Node)")
	}
	if n := g.Preferred.Node; n != "" && (len(n) > maxSubdomainLen || !dns1123RE.MatchString(n)) {
		v.errorf("gateway.preferred.node", "%q is not a valid node name (a lowercase DNS subdomain)", n)
	}
	if g.Preferred.TakeBack && g.Preferred.Node == "" {
		v.errorf("gateway.preferred.takeBack", "needs gateway.preferred.node")
	}
	if g.Probe.Probes != 0 {
		v.intRange("gateway.probe.probes", g.Probe.Probes, 1, 10)
	}
	for path, d := range map[string]time.Duration{"gateway.probe.interval": g.Probe.Interval, "gateway.probe.wait": g.Probe.Wait} {
		if d != 0 && (d < time.Millisecond || d > 10*time.Second) {
			v.errorf(path, "%s is outside 1ms-10s", d)
		}
	}
	v.intRange("gateway.probe.announcements", g.Probe.Announcements, 0, 10)
}

// String names the role for logs: its name and Lease.
func (g *Gateway) String() string {
	return fmt.Sprintf("%s (Lease %s/%s)", g.Name, g.Lease.Namespace, g.Lease.Name)
}
