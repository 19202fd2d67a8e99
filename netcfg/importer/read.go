package importer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// ReadOptions say where Read looks.
type ReadOptions struct {
	// Etc is the directory that stands for /etc (default /etc).
	Etc string
	// ProcSys is the directory that stands for /proc/sys (default
	// /proc/sys); it is read from inside the handle's namespace.
	ProcSys string
	// Proc and Opt stand for /proc and /opt (defaults), where PIA's
	// manual-connections scripts are found: their processes, their
	// /opt/piavpn-manual.
	Proc, Opt string
}

// SysctlKeys are the sysctls Read looks at, in the config's syntax: the
// ones a node set up for routing and VPNs changes. Per link, rp_filter of
// every VLAN, macvlan and WireGuard link is read as well
// (net.ipv4.conf.NAME.rp_filter, '.' in NAME written '/').
var SysctlKeys = []string{
	"net.ipv4.ip_forward",
	"net.ipv6.conf.all.forwarding",
	"net.ipv4.conf.all.src_valid_mark",
	"net.ipv4.conf.all.rp_filter",
	"net.ipv4.conf.default.rp_filter",
}

// sysctlDefaults are the kernel's values of SysctlKeys; a key at its
// default is not imported. A link's rp_filter is imported when it differs
// from net.ipv4.conf.default.rp_filter, which a new link starts with.
var sysctlDefaults = map[string]string{
	"net.ipv4.ip_forward":              "0",
	"net.ipv6.conf.all.forwarding":     "0",
	"net.ipv4.conf.all.src_valid_mark": "0",
	"net.ipv4.conf.all.rp_filter":      "0",
	"net.ipv4.conf.default.rp_filter":  "0",
}

// Read fills a Snapshot from the namespace h is bound to and from the files
// under o.Etc. What it cannot read without root (WireGuard devices, whose
// keys only CAP_NET_ADMIN may read; root's wg-quick files) is named in
// Problems rather than failing the read; a netlink dump that fails is an
// error.
func Read(ctx context.Context, h *host.Host, o ReadOptions) (Snapshot, error) {
	if o.Etc == "" {
		o.Etc = "/etc"
	}
	if o.ProcSys == "" {
		o.ProcSys = sysctl.DefaultRoot
	}
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	if o.Opt == "" {
		o.Opt = "/opt"
	}
	var s Snapshot
	if err := readKernel(ctx, h, o, &s); err != nil {
		return s, err
	}
	ReadFiles(o.Etc, &s)
	readPIA(o.Proc, o.Opt, &s)
	return s, nil
}

func readKernel(ctx context.Context, h *host.Host, o ReadOptions, s *Snapshot) error {
	links, err := host.Retry(h.LinkList)
	if err != nil {
		return err
	}
	addrs, err := host.Retry(h.AddrList)
	if err != nil {
		return err
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Index] = l.Name
	}
	byIndex := map[int][]Addr{}
	for _, a := range addrs {
		byIndex[a.LinkIndex] = append(byIndex[a.LinkIndex], Addr{
			Prefix:  a.Prefix.String(),
			Scope:   scopeName(a.Scope),
			Dynamic: a.Flags&unix.IFA_F_PERMANENT == 0,
		})
	}
	for _, l := range links {
		k := Link{Name: l.Name, Kind: l.Kind, MTU: l.MTU, Up: l.Up, Alias: l.Alias, Group: l.Group, Addresses: byIndex[l.Index]}
		if l.ParentIndex != 0 && l.ParentIndex != l.Index {
			k.Parent = names[l.ParentIndex]
		}
		switch l.Kind {
		case "vlan":
			k.VLANID = l.VLANID
		case "macvlan":
			k.MacvlanMode = macvlanModes[l.MacvlanMode]
		}
		s.Links = append(s.Links, k)
	}
	slices.SortFunc(s.Links, func(a, b Link) int { return strings.Compare(a.Name, b.Name) })

	rules, err := host.Retry(h.RuleList)
	if err != nil {
		return err
	}
	for _, r := range rules {
		// The dump has every family's rules: the multicast routing
		// families' (RTNL_FAMILY_IPMR, IP6MR; Debian's kernel has them
		// built in) have defaults of their own at 0x7fff, which are not
		// the config's.
		if r.Family != unix.AF_INET && r.Family != unix.AF_INET6 {
			continue
		}
		s.Rules = append(s.Rules, ruleOf(r))
	}
	// nodeagent's own reader: it reads what vishvananda/netlink does not
	// (an IPv6 route's from, the attributes the config cannot say).
	routes, err := host.Retry(h.RouteListAll)
	if err != nil {
		return err
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		for _, r := range routes {
			if r.Family != fam || r.Table == unix.RT_TABLE_LOCAL {
				continue
			}
			s.Routes = append(s.Routes, routeOf(fam, r, names))
		}
	}

	var wgNames []string
	for _, l := range s.Links {
		// A tun link may be a userspace device (wireguard-go), which
		// wgctrl reads through its UAPI socket.
		if l.Kind == "wireguard" || l.Kind == "tun" {
			wgNames = append(wgNames, l.Name)
		}
	}
	if len(wgNames) > 0 {
		readWireGuard(h, wgNames, s)
	}
	readSysctls(ctx, h, o.ProcSys, s)
	return ctx.Err()
}

// macvlanModes names the kernel's MACVLAN_MODE_* values (linux/if_link.h).
var macvlanModes = map[uint32]string{1: "private", 2: "vepa", 4: "bridge", 8: "passthru", 16: "source"}

func scopeName(s uint8) string {
	switch s {
	case unix.RT_SCOPE_UNIVERSE:
		return "global"
	case unix.RT_SCOPE_SITE:
		return "site"
	case unix.RT_SCOPE_LINK:
		return "link"
	case unix.RT_SCOPE_HOST:
		return "host"
	case unix.RT_SCOPE_NOWHERE:
		return "nowhere"
	}
	return fmt.Sprint(s)
}

var ruleActions = map[uint8]string{
	unix.FR_ACT_TO_TBL:      "table",
	unix.FR_ACT_GOTO:        "goto",
	unix.FR_ACT_NOP:         "nop",
	unix.FR_ACT_BLACKHOLE:   "blackhole",
	unix.FR_ACT_UNREACHABLE: "unreachable",
	unix.FR_ACT_PROHIBIT:    "prohibit",
}

func familyName(f int) string {
	if f == unix.AF_INET6 {
		return "inet6"
	}
	return "inet"
}

func prefixString(n *net.IPNet) string {
	if n == nil {
		return ""
	}
	ones, _ := n.Mask.Size()
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return n.String()
	}
	return netip.PrefixFrom(a.Unmap(), ones).String()
}

func ruleOf(r netlink.Rule) Rule {
	out := Rule{Priority: r.Priority, Family: familyName(r.Family), From: prefixString(r.Src), To: prefixString(r.Dst),
		IIF: r.IifName, OIF: r.OifName, Table: r.Table, Invert: r.Invert, Protocol: int(r.Protocol),
		Extra: host.RuleExtraSelectors(r)}
	out.Action = ruleActions[r.Type]
	if out.Action == "" {
		out.Action = fmt.Sprint(r.Type)
	}
	if r.Mark != 0 || r.Mask != nil {
		out.FwMark = fmt.Sprintf("0x%x", r.Mark)
		if r.Mask != nil && *r.Mask != 0xffffffff {
			out.FwMark += fmt.Sprintf("/0x%x", *r.Mask)
		}
	}
	if r.SuppressPrefixlen >= 0 {
		n := r.SuppressPrefixlen
		out.SuppressPrefixLength = &n
	}
	return out
}

var routeTypes = map[int]string{
	unix.RTN_UNICAST: "unicast", unix.RTN_LOCAL: "local", unix.RTN_BROADCAST: "broadcast",
	unix.RTN_ANYCAST: "anycast", unix.RTN_MULTICAST: "multicast", unix.RTN_BLACKHOLE: "blackhole",
	unix.RTN_UNREACHABLE: "unreachable", unix.RTN_PROHIBIT: "prohibit", unix.RTN_THROW: "throw",
	unix.RTN_NAT: "nat",
}

func routeOf(fam int, r host.Route, names map[int]string) Route {
	out := Route{Table: r.Table, Metric: r.Priority, Scope: scopeName(uint8(r.Scope)), Protocol: int(r.Protocol),
		OnLink: r.Flags&unix.RTNH_F_ONLINK != 0, Multipath: r.MultiPath != nil, Dev: names[r.LinkIndex],
		Extra: r.Extra}
	out.Type = routeTypes[r.Type]
	if out.Type == "" {
		out.Type = fmt.Sprint(r.Type)
	}
	switch {
	case r.Dst != nil:
		out.To = prefixString(r.Dst)
	case fam == unix.AF_INET6:
		out.To = "::/0"
	default:
		out.To = "0.0.0.0/0"
	}
	if r.From.IsValid() {
		out.From = r.From.String()
	}
	if a, ok := netip.AddrFromSlice(r.Gw); ok && r.Gw != nil {
		out.Via = a.Unmap().String()
	}
	if a, ok := netip.AddrFromSlice(r.Src); ok && r.Src != nil {
		out.Src = a.Unmap().String()
	}
	return out
}

// wgReadTimeout bounds the reading of the WireGuard devices: a userspace
// device whose process is wedged accepts on its UAPI socket and never
// answers, and wgctrl's read has no deadline of its own.
var wgReadTimeout = 10 * time.Second

// readWireGuard reads the named devices with wgctrl inside h's namespace:
// kernel devices, and tun links that answer as userspace devices. It
// gives up after wgReadTimeout, saying so (the read is left behind: the
// import is a command that ends).
func readWireGuard(h *host.Host, names []string, s *Snapshot) {
	kinds := map[string]string{}
	for _, l := range s.Links {
		kinds[l.Name] = l.Kind
	}
	type result struct {
		devs     []WGDevice
		problems []string
		err      error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = h.Do(func() error {
			c, err := wgctrl.New()
			if err != nil {
				return err
			}
			defer c.Close()
			for _, n := range names {
				d, err := c.Device(n)
				if err != nil {
					if errors.Is(err, os.ErrPermission) && kinds[n] == "wireguard" {
						return err
					}
					if kinds[n] == "tun" {
						continue // not WireGuard, or not ours to read
					}
					r.problems = append(r.problems, fmt.Sprintf("WireGuard device %s: %v", n, err))
					continue
				}
				r.devs = append(r.devs, deviceOf(d))
			}
			return nil
		})
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(wgReadTimeout):
		s.Problems = append(s.Problems, fmt.Sprintf("WireGuard devices: no answer within %s (a userspace device whose process does not answer?); none imported", wgReadTimeout))
		return
	}
	s.WireGuard = append(s.WireGuard, r.devs...)
	s.Problems = append(s.Problems, r.problems...)
	if errors.Is(r.err, os.ErrPermission) {
		s.Problems = append(s.Problems, "WireGuard devices (keys and peers) cannot be read without root (CAP_NET_ADMIN); run nodeagent import as root")
	} else if r.err != nil {
		s.Problems = append(s.Problems, fmt.Sprintf("WireGuard devices: %v", r.err))
	}
}

func deviceOf(d *wgtypes.Device) WGDevice {
	out := WGDevice{Name: d.Name, ListenPort: d.ListenPort, FwMark: d.FirewallMark}
	if d.PrivateKey != (wgtypes.Key{}) {
		out.PrivateKey = d.PrivateKey.String()
	}
	for _, p := range d.Peers {
		wp := WGPeer{PublicKey: p.PublicKey.String(), PersistentKeepalive: int(p.PersistentKeepaliveInterval.Seconds())}
		if p.PresharedKey != (wgtypes.Key{}) {
			wp.PresharedKey = p.PresharedKey.String()
		}
		if p.Endpoint != nil {
			wp.Endpoint = p.Endpoint.String()
		}
		for _, a := range p.AllowedIPs {
			wp.AllowedIPs = append(wp.AllowedIPs, prefixString(&a))
		}
		out.Peers = append(out.Peers, wp)
	}
	return out
}

// readSysctls reads SysctlKeys and the rp_filter of every VLAN, macvlan
// and WireGuard link with the sysctl subsystem's own Observe: the same
// key syntax, files and namespace (a /proc/sys/net file shows the
// namespace of the thread that opens it) as the daemon's.
func readSysctls(ctx context.Context, h *host.Host, procSys string, s *Snapshot) {
	want := map[string]string{}
	for _, k := range SysctlKeys {
		want[k] = ""
	}
	for _, l := range s.Links {
		if l.Kind == "vlan" || l.Kind == "macvlan" || l.Kind == "wireguard" {
			want["net.ipv4.conf."+strings.ReplaceAll(l.Name, ".", "/")+".rp_filter"] = ""
		}
	}
	o, err := sysctl.Observe(ctx, h.Snapshot(), sysctl.Desired{Root: procSys, Values: want})
	if err != nil {
		s.Problems = append(s.Problems, fmt.Sprintf("sysctls: %v", err))
		return
	}
	vals := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		switch ok := o.Keys[k]; {
		case !ok.Exists:
		case ok.Unreadable != "":
			s.Problems = append(s.Problems, fmt.Sprintf("sysctl %s: %s", k, ok.Unreadable))
		default:
			vals[k] = strings.Join(strings.Fields(ok.Raw), " ")
		}
	}
	if len(vals) > 0 {
		s.Sysctls = vals
	}
}
