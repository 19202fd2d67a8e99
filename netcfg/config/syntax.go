package config

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// This file holds the syntax checks for single values. Each returns a
// lowercase message, or "" when the value is fine.

// maxIfNameLen is IFNAMSIZ minus the terminating NUL.
const maxIfNameLen = 15

// checkIfName reports what is wrong with s as a Linux interface name,
// following the kernel's dev_valid_name.
func checkIfName(s string) string {
	switch {
	case s == "":
		return "required"
	case len(s) > maxIfNameLen:
		return fmt.Sprintf("%q is %d bytes; interface names are at most %d", s, len(s), maxIfNameLen)
	case s == "." || s == "..":
		return fmt.Sprintf("%q is not a valid interface name", s)
	}
	for _, r := range s {
		switch {
		case r == '/' || r == ':':
			return fmt.Sprintf("%q contains %q, which interface names may not", s, r)
		case r == ' ' || r == '\t' || r == '\n' || r == '\v' || r == '\f' || r == '\r':
			return fmt.Sprintf("%q contains whitespace, which interface names may not", s)
		case r < 0x20 || r == 0x7f:
			return fmt.Sprintf("%q contains a control character, which interface names may not", s)
		}
	}
	return ""
}

// parseHostPrefix parses an interface address: a host address with its
// prefix length, like 10.10.50.1/24 or fd00::1/64.
func parseHostPrefix(s string) (netip.Prefix, string) {
	if s == "" {
		return netip.Prefix{}, "required"
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		if a, aerr := netip.ParseAddr(s); aerr == nil {
			return netip.Prefix{}, fmt.Sprintf("%q has no prefix length; write it like %s/%d", s, a, a.BitLen())
		}
		return netip.Prefix{}, fmt.Sprintf("%q is not an address with a prefix length, like 10.10.50.1/24", s)
	}
	a := p.Addr()
	switch {
	case a.Is4In6():
		return netip.Prefix{}, fmt.Sprintf("%q is an IPv4-mapped IPv6 address; write the IPv4 address", s)
	case a.IsUnspecified():
		return netip.Prefix{}, fmt.Sprintf("%q is the unspecified address", s)
	case a.IsMulticast():
		return netip.Prefix{}, fmt.Sprintf("%q is a multicast address", s)
	}
	return p, ""
}

// parseNetPrefix parses a network prefix like 10.10.50.0/24, whose host
// bits must be zero: the kernel and nftables refuse or silently mask them,
// and either hides a typo.
func parseNetPrefix(s string) (netip.Prefix, string) {
	if s == "" {
		return netip.Prefix{}, "required"
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		if a, aerr := netip.ParseAddr(s); aerr == nil {
			return netip.Prefix{}, fmt.Sprintf("%q has no prefix length; write it like %s/%d", s, a, a.BitLen())
		}
		return netip.Prefix{}, fmt.Sprintf("%q is not a CIDR prefix, like 10.10.50.0/24", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Sprintf("%q is an IPv4-mapped IPv6 prefix; write the IPv4 prefix", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Sprintf("%q has host bits set; did you mean %s?", s, m)
	}
	return p, ""
}

// parseAddr parses a bare IP address (no prefix length).
func parseAddr(s string) (netip.Addr, string) {
	if s == "" {
		return netip.Addr{}, "required"
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Sprintf("%q is not an IP address", s)
	}
	if a.Is4In6() {
		return netip.Addr{}, fmt.Sprintf("%q is an IPv4-mapped IPv6 address; write the IPv4 address", s)
	}
	return a, ""
}

// checkAbsPath reports whether s is usable as an absolute file path.
func checkAbsPath(s string) string {
	if !filepath.IsAbs(s) {
		return fmt.Sprintf("%q is not an absolute path", s)
	}
	if strings.ContainsRune(s, 0) {
		return fmt.Sprintf("%q contains a NUL byte", s)
	}
	return ""
}

// ParseFwMark parses a firewall mark as written in a rule: decimal, hex
// with 0x, and an optional /mask ("0x10", "0x10/0xff", "16"). Without a
// mask, mask is 0xffffffff.
func ParseFwMark(s string) (mark, mask uint32, err error) {
	m, k, hasMask := strings.Cut(s, "/")
	mark, err = parseUint32(m)
	if err == nil && hasMask {
		mask, err = parseUint32(k)
	} else {
		mask = 0xffffffff
	}
	if err != nil {
		return 0, 0, fmt.Errorf("invalid fwMark %q: use 0x10, 0x10/0xff or a decimal number", s)
	}
	return mark, mask, nil
}

func parseUint32(s string) (uint32, error) {
	base := 10
	if rest, ok := strings.CutPrefix(strings.ToLower(s), "0x"); ok {
		s, base = rest, 16
	}
	// ParseUint with an explicit base rejects signs, underscores and empty strings.
	n, err := strconv.ParseUint(s, base, 32)
	return uint32(n), err
}

// When is a parsed ConditionalLabel.When: a condition the daemon derives
// from its status after every sync. The forms are
//
//	wireguard/<interface>/healthy  the device exists and has no peers or a live one
//	vlan/<name>/up                 the VLAN link is up
//	checks/arp-reachable           every checks.arpReachable address answers ARP
//	converged                      the last sync applied without failures
type When struct {
	Subsystem string // wireguard, vlan, checks; "" for converged
	Name      string // the object in that subsystem, like an interface name; "" for checks
	Condition string // healthy, up, arp-reachable, converged
}

// String formats w the way it is written in the config; it is also the key
// of the condition in agent/kube.Snapshot.Conditions.
func (w When) String() string {
	switch {
	case w.Subsystem == "":
		return w.Condition
	case w.Name == "":
		return w.Subsystem + "/" + w.Condition
	}
	return w.Subsystem + "/" + w.Name + "/" + w.Condition
}

var whenSegmentRE = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]*$`)

// whenForms is what errors about a when list as the valid forms.
const whenForms = "wireguard/<interface>/healthy, vlan/<name>/up, checks/arp-reachable or converged"

// ParseWhen parses a conditional label's when. It checks the form only;
// whether the named interface is declared is the validator's business.
func ParseWhen(s string) (When, error) {
	parts := strings.Split(s, "/")
	for _, p := range parts {
		if !whenSegmentRE.MatchString(p) {
			return When{}, fmt.Errorf("%q is not a condition; use %s", s, whenForms)
		}
	}
	var w When
	switch {
	case len(parts) == 3 && parts[0] == "wireguard" && parts[2] == "healthy",
		len(parts) == 3 && parts[0] == "vlan" && parts[2] == "up":
		w = When{Subsystem: parts[0], Name: parts[1], Condition: parts[2]}
	case len(parts) == 2 && parts[0] == "checks" && parts[1] == "arp-reachable":
		w = When{Subsystem: parts[0], Condition: parts[1]}
	case len(parts) == 1 && parts[0] == "converged":
		w = When{Condition: parts[0]}
	default:
		return When{}, fmt.Errorf("%q is not a condition nodeagent reports; use %s", s, whenForms)
	}
	return w, nil
}

// checkWGKey reports whether s is a WireGuard key: 32 bytes in standard base64.
func checkWGKey(s string) string {
	if s == "" {
		return "required"
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 32 {
		return fmt.Sprintf("%q is not a WireGuard key (32 bytes of base64, 44 characters ending in '=')", s)
	}
	return ""
}

// checkEndpoint reports whether s is host:port with a port 1-65535.
func checkEndpoint(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || strings.ContainsAny(host, " \t\r\n/") {
		return fmt.Sprintf("%q is not host:port (use [addr]:port for IPv6)", s)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Sprintf("%q has no valid port (1-65535)", s)
	}
	return ""
}

// Kubernetes label syntax, from k8s.io/apimachinery/pkg/util/validation.
var (
	labelNameRE    = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

const (
	maxLabelNameLen = 63
	maxSubdomainLen = 253
)

// checkLabelKey reports whether k is a label key the node may set on its
// own Node object: valid syntax, and allowed by the NodeRestriction
// admission plugin.
func checkLabelKey(k string) string {
	if k == "" {
		return "label key may not be empty"
	}
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		prefix, name = "", k
	}
	if hasPrefix {
		switch {
		case prefix == "":
			return fmt.Sprintf("label key %q has an empty prefix before '/'", k)
		case len(prefix) > maxSubdomainLen:
			return fmt.Sprintf("label key %q: prefix is longer than %d characters", k, maxSubdomainLen)
		case !dnsSubdomainRE.MatchString(prefix):
			return fmt.Sprintf("label key %q: prefix %q must be a lowercase DNS subdomain, like homelab.example", k, prefix)
		}
	}
	switch {
	case len(name) > maxLabelNameLen:
		return fmt.Sprintf("label key %q: name is longer than %d characters", k, maxLabelNameLen)
	case !labelNameRE.MatchString(name):
		return fmt.Sprintf("label key %q: name %q must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", k, name)
	}
	if msg := nodeRestrictionForbids(k, prefix); msg != "" {
		return msg
	}
	return ""
}

// checkLabelValue reports whether v is a valid label value (empty is allowed).
func checkLabelValue(v string) string {
	switch {
	case v == "":
		return ""
	case len(v) > maxLabelNameLen:
		return fmt.Sprintf("label value %q is longer than %d characters", v, maxLabelNameLen)
	case !labelNameRE.MatchString(v):
		return fmt.Sprintf("label value %q must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", v)
	}
	return ""
}

// kubeletLabels are the kubernetes.io labels a node may set on itself
// (k8s.io/kubelet/pkg/apis IsKubeletLabel).
var kubeletLabels = map[string]bool{
	"kubernetes.io/hostname":                   true,
	"kubernetes.io/arch":                       true,
	"kubernetes.io/os":                         true,
	"beta.kubernetes.io/arch":                  true,
	"beta.kubernetes.io/os":                    true,
	"beta.kubernetes.io/instance-type":         true,
	"node.kubernetes.io/instance-type":         true,
	"failure-domain.beta.kubernetes.io/region": true,
	"failure-domain.beta.kubernetes.io/zone":   true,
	"topology.kubernetes.io/region":            true,
	"topology.kubernetes.io/zone":              true,
}

// inNamespace reports whether the label prefix ns is ns0 or a subdomain of it.
func inNamespace(ns, ns0 string) bool {
	return ns == ns0 || strings.HasSuffix(ns, "."+ns0)
}

// nodeRestrictionForbids explains why the NodeRestriction admission plugin
// would refuse a node identity setting label key k (prefix ns) on its own
// Node, or returns "". nodeagent labels with the node's own kubeconfig, so
// such a label would fail on every sync; better to say so at load time.
func nodeRestrictionForbids(k, ns string) string {
	const why = "; the NodeRestriction admission plugin forbids a node's own identity from setting it, so nodeagent could never apply it (use your own prefix, like homelab.example/)"
	if inNamespace(ns, "node-restriction.kubernetes.io") {
		return fmt.Sprintf("label key %q is in node-restriction.kubernetes.io/, which only administrators may set%s", k, why)
	}
	if !inNamespace(ns, "kubernetes.io") && !inNamespace(ns, "k8s.io") {
		return ""
	}
	if kubeletLabels[k] || inNamespace(ns, "kubelet.kubernetes.io") || inNamespace(ns, "node.kubernetes.io") {
		return ""
	}
	return fmt.Sprintf("label key %q is in the reserved kubernetes.io/k8s.io namespace%s", k, why)
}

var (
	sysctlSegmentRE = regexp.MustCompile(`^[A-Za-z0-9_*/-]+$`)
	tableNameRE     = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	dns1123RE       = dnsSubdomainRE
)

// checkSysctlKey reports whether k is a sysctl nodeagent may manage.
// Segments may contain '/', which sysctl(8) uses for a '.' inside an
// interface name (net.ipv4.conf.enp1s0/50.rp_filter).
func checkSysctlKey(k string) string {
	if !strings.HasPrefix(k, "net.") {
		return fmt.Sprintf("%q is outside net.*; nodeagent manages only network sysctls", k)
	}
	for seg := range strings.SplitSeq(k, ".") {
		if !sysctlSegmentRE.MatchString(seg) {
			return fmt.Sprintf("%q is not a sysctl key like net.ipv4.ip_forward", k)
		}
	}
	return ""
}

// clipValue shortens a value quoted in an error to 64 bytes.
func clipValue(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
