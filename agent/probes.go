package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Probe is one check of the node's reachability: safe apply runs the
// probes that pass before a change again after it, and rolls the change
// back when one of them fails.
type Probe struct {
	// Name says what is probed, e.g. "apiServer 10.0.0.5:6443" or
	// "arp 192.168.2.20"; it appears in status.
	Name string
	Run  func(ctx context.Context) error
}

// probeTimeout bounds one run of one probe.
const probeTimeout = 2 * time.Second

// Probes returns the probes c asks for, run inside h's namespace: a TCP
// connect to the API server (checks.apiServer, else the kubeconfig's
// server), ARP for the main table's IPv4 default gateway, and ARP for every
// checks.arpReachable address.
func Probes(h *host.Host, c *config.Config) []Probe {
	var ps []Probe
	if api := apiServer(c); api != "" {
		ps = append(ps, Probe{Name: "apiServer " + api, Run: func(ctx context.Context) error { return tcpProbe(ctx, h, api) }})
	}
	if c.Checks.GatewayARPOn() {
		ps = append(ps, Probe{Name: "gateway", Run: func(ctx context.Context) error {
			gw, err := defaultGateway(h)
			if err != nil || !gw.IsValid() {
				return err // no IPv4 default route: nothing to probe
			}
			return arpProbe(ctx, h, gw)
		}})
	}
	for _, s := range c.Checks.ARPReachable {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		ps = append(ps, Probe{Name: "arp " + a.String(), Run: func(ctx context.Context) error { return arpProbe(ctx, h, a) }})
	}
	return ps
}

// ARPProbes returns only the checks.arpReachable probes, which every
// resync reports as the ARPReachable condition.
func ARPProbes(h *host.Host, c *config.Config) []Probe {
	var ps []Probe
	for _, p := range Probes(h, c) {
		if len(p.Name) > 4 && p.Name[:4] == "arp " {
			ps = append(ps, p)
		}
	}
	return ps
}

// apiServer returns host:port of the API server to probe, or "".
func apiServer(c *config.Config) string {
	if c.Checks.APIServer != "" {
		return c.Checks.APIServer
	}
	path := c.Kubernetes.Kubeconfig
	if path == "" && c.Kubernetes.Enabled() {
		path = kube.DefaultKubeconfig
	}
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := kube.ServerOf(b)
	// https://host:port[/path]
	if i := len("https://"); len(s) > i && s[:i] == "https://" {
		s = s[i:]
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			s = s[:i]
			break
		}
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		s = net.JoinHostPort(s, "443")
	}
	return s
}

func tcpProbe(ctx context.Context, h *host.Host, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var conn net.Conn
	err := h.Do(func() error {
		// The socket is made on this thread, inside the namespace; the
		// connect may finish on any thread.
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return fmt.Errorf("tcp connect %s: %w", addr, err)
	}
	return conn.Close()
}

// defaultGateway returns the gateway of the main table's IPv4 default
// route, or the zero Addr when there is none.
func defaultGateway(h *host.Host) (netip.Addr, error) {
	routes, err := h.NL().RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("default route: %w", err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil {
			if a, ok := netip.AddrFromSlice(r.Gw.To4()); ok {
				return a, nil
			}
		}
	}
	return netip.Addr{}, nil
}

// arpProbe resolves target by ARP on the link the kernel routes it by,
// from the source address the kernel would pick.
func arpProbe(ctx context.Context, h *host.Host, target netip.Addr) error {
	routes, err := h.NL().RouteGet(target.AsSlice())
	if err != nil || len(routes) == 0 {
		return fmt.Errorf("arp %s: no route: %w", target, err)
	}
	r := routes[0]
	l, err := h.NL().LinkByIndex(r.LinkIndex)
	if err != nil {
		return fmt.Errorf("arp %s: %w", target, err)
	}
	src, ok := netip.AddrFromSlice(r.Src.To4())
	if !ok {
		return fmt.Errorf("arp %s: no IPv4 source address on %s", target, l.Attrs().Name)
	}
	if r.Gw != nil {
		return fmt.Errorf("arp %s: routed via gateway %s, not on a link", target, r.Gw)
	}
	ifi := &net.Interface{Index: l.Attrs().Index, Name: l.Attrs().Name, HardwareAddr: l.Attrs().HardwareAddr, MTU: l.Attrs().MTU}
	conns, err := arp.Open(h, []*net.Interface{ifi})
	if err != nil {
		return err
	}
	defer conns[0].Close()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err = conns[0].Resolve(ctx, src, target, 3, 300*time.Millisecond)
	return err
}

// runProbes runs every probe and returns the error of each that failed.
func runProbes(ctx context.Context, ps []Probe) map[string]error {
	failed := map[string]error{}
	for _, p := range ps {
		if err := p.Run(ctx); err != nil {
			failed[p.Name] = err
		}
	}
	return failed
}

// recheck runs the probes that passed before a change until each passes
// again or the deadline comes, and returns the first that did not.
func recheck(ctx context.Context, ps []Probe, passed map[string]bool, deadline time.Duration) (string, error) {
	end := time.Now().Add(deadline)
	for _, p := range ps {
		if !passed[p.Name] {
			continue
		}
		for {
			err := p.Run(ctx)
			if err == nil {
				break
			}
			if time.Now().After(end) || ctx.Err() != nil {
				return p.Name, err
			}
			select {
			case <-ctx.Done():
				return p.Name, errors.Join(err, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return "", nil
}

// probesViaWireGuard reports whether the traffic of any probe c asks for
// would leave through one of devices (a WireGuard device): a change to
// that device's peers could then break the probe, so it must go through
// safe apply. Each target costs one route lookup (the gateway's two), not
// a dump. A target that cannot be told (an API server by host name, a
// failed lookup) counts as going through.
func probesViaWireGuard(h *host.Host, c *config.Config, devices []string) bool {
	var targets []netip.Addr
	if api := apiServer(c); api != "" {
		host, _, err := net.SplitHostPort(api)
		a, perr := netip.ParseAddr(host)
		if err != nil || perr != nil {
			return true
		}
		targets = append(targets, a)
	}
	for _, s := range c.Checks.ARPReachable {
		if a, err := netip.ParseAddr(s); err == nil {
			targets = append(targets, a)
		}
	}
	if c.Checks.GatewayARPOn() {
		// The default route's gateway, and the device the default route
		// itself leaves by (a full tunnel through WireGuard).
		routes, err := h.NL().RouteGet(net.IPv4(192, 0, 2, 1))
		switch {
		case err != nil && !errors.Is(err, unix.ENETUNREACH):
			return true
		case err == nil && len(routes) > 0:
			if viaDevice(h, routes[0].LinkIndex, devices) {
				return true
			}
			if gw, ok := netip.AddrFromSlice(routes[0].Gw.To4()); ok && gw.IsValid() {
				targets = append(targets, gw)
			}
		}
	}
	for _, t := range targets {
		routes, err := h.NL().RouteGet(t.AsSlice())
		if err != nil {
			if errors.Is(err, unix.ENETUNREACH) {
				continue // no route at all: no device's change moves it
			}
			return true
		}
		if len(routes) > 0 && viaDevice(h, routes[0].LinkIndex, devices) {
			return true
		}
	}
	return false
}

// viaDevice reports whether link index is one of devices (or cannot be
// told).
func viaDevice(h *host.Host, index int, devices []string) bool {
	l, err := h.NL().LinkByIndex(index)
	if err != nil {
		return true
	}
	return slices.Contains(devices, l.Attrs().Name)
}
