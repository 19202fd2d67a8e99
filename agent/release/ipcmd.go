package release

import (
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// unitMakes is what one systemd unit's Exec lines make with ip(8), in
// this namespace: the objects that `ip ... add` fails on (EEXIST) while
// they exist, so that the unit cannot start again until they are gone.
// `ip ... replace`, and commands in another namespace (-n, -netns) or from
// a batch file, are not counted: they do not fail on what exists, or say
// nothing here.
type unitMakes struct {
	Links  []string
	Routes []routeKey
	Rules  []ruleKey
}

// routeKey is the kernel's identity of a route (what makes a second
// `ip route add` fail): its table, destination and metric. Table names
// are resolved with the rt_tables files; one that is not known is -1.
type routeKey struct {
	Table  int
	To     netip.Prefix
	Metric uint32
}

// ruleKey is what a rule added by `ip rule add` is recognised by: its
// family, priority (-1: the kernel chose it), source, destination and
// table (-1: none given).
type ruleKey struct {
	Family   int
	Priority int
	From, To netip.Prefix
	Table    int
}

// parseUnit reads a unit's text: every Exec*= line's ip commands (also
// inside sh -c '...', after ; && ||).
func parseUnit(text string, tables map[string]int) unitMakes {
	var m unitMakes
	for line := range strings.SplitSeq(text, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || !strings.HasPrefix(strings.TrimSpace(key), "Exec") {
			continue
		}
		for _, args := range ipCommands(val) {
			m.add(args, tables)
		}
	}
	return m
}

// ipCommands splits a command line into the argument lists of each ip
// invocation (the words after "ip"), quotes and shell separators dropped.
func ipCommands(cmd string) [][]string {
	cmd = strings.NewReplacer("'", " ", "\"", " ", ";", " ; ", "&&", " ; ", "||", " ; ", "|", " ; ").Replace(cmd)
	f := strings.Fields(cmd)
	var out [][]string
	for i := 0; i < len(f); i++ {
		if filepath.Base(strings.TrimLeft(f[i], "-+!@:|")) != "ip" {
			continue
		}
		j := i + 1
		for j < len(f) && f[j] != ";" {
			j++
		}
		out = append(out, f[i+1:j])
		i = j
	}
	return out
}

// abbrev reports whether word is a prefix of full at least min long: ip
// takes "r", "ro", "rou" for route, as its matches() does.
func abbrev(word, full string, min int) bool {
	return len(word) >= min && strings.HasPrefix(full, word)
}

// add records what the ip invocation args makes.
func (m *unitMakes) add(args []string, tables map[string]int) {
	family := 0
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		switch opt := strings.TrimLeft(args[i], "-"); {
		case opt == "4":
			family = unix.AF_INET
		case opt == "6":
			family = unix.AF_INET6
		case opt == "n" || opt == "netns" || opt == "b" || opt == "batch" || opt == "force":
			return // another namespace, or commands from a file
		case opt == "f" || opt == "family":
			i++
			if i < len(args) {
				switch args[i] {
				case "inet":
					family = unix.AF_INET
				case "inet6":
					family = unix.AF_INET6
				}
			}
		case opt == "l" || opt == "loops" || opt == "rc" || opt == "rcvbuf":
			i++
		}
	}
	if i+1 >= len(args) || !abbrev(args[i+1], "add", 1) {
		return
	}
	obj, rest := args[i], args[i+2:]
	switch {
	case obj == "l" || abbrev(obj, "link", 1):
		if name := linkName(rest); name != "" {
			m.Links = append(m.Links, name)
		}
	case obj == "r" || abbrev(obj, "route", 2):
		if k, ok := parseRoute(rest, family, tables); ok {
			m.Routes = append(m.Routes, k)
		}
	case abbrev(obj, "rule", 2):
		if k, ok := parseRule(rest, family, tables); ok {
			m.Rules = append(m.Rules, k)
		}
	}
}

// linkName is the name `ip link add` gives: after name or dev, else the
// first word that is not a keyword's value.
func linkName(args []string) string {
	name := ""
	for k := 0; k < len(args); k++ {
		switch args[k] {
		case "type":
			return name
		case "link", "txqueuelen", "txqlen", "address", "broadcast", "mtu", "index", "numtxqueues", "numrxqueues", "netns", "group":
			k++
		case "name", "dev":
			if k+1 < len(args) {
				name = args[k+1]
			}
			k++
		default:
			if name == "" {
				name = args[k]
			}
		}
	}
	return name
}

var routeTypes = map[string]bool{"unicast": true, "unreachable": true, "blackhole": true, "prohibit": true,
	"local": true, "broadcast": true, "throw": true, "nat": true, "anycast": true, "multicast": true}

// parseRoute reads `ip route add [TYPE] PREFIX [options]` into its key.
func parseRoute(args []string, family int, tables map[string]int) (routeKey, bool) {
	k := routeKey{Table: unix.RT_TABLE_MAIN}
	var to string
	metric := int64(-1)
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := ""
		if i+1 < len(args) {
			val = args[i+1]
		}
		switch {
		case routeTypes[a] && to == "":
		case a == "table":
			k.Table = tableID(val, tables)
			i++
		case a == "metric" || a == "preference" || a == "priority":
			n, err := strconv.ParseUint(val, 0, 32)
			if err != nil {
				return k, false
			}
			metric = int64(n)
			i++
		case a == "to" && to == "":
			to = val
			i++
		case a == "via" && (val == "inet" || val == "inet6"):
			i += 2
		case optionTakesValue(a):
			i++
		case to == "" && !optionFlag(a):
			to = a
		}
	}
	p, ok := parseDest(to, family)
	if !ok {
		return k, false
	}
	k.To = p
	switch {
	case metric >= 0:
		k.Metric = uint32(metric)
	case p.Addr().Is6():
		k.Metric = 1024 // the kernel's default for IPv6
	}
	return k, true
}

// routeOptions are ip route's keywords that take a value.
var routeOptions = map[string]bool{"via": true, "dev": true, "oif": true, "src": true, "proto": true, "protocol": true,
	"scope": true, "mtu": true, "advmss": true, "rtt": true, "rttvar": true, "reordering": true, "window": true,
	"cwnd": true, "initcwnd": true, "initrwnd": true, "ssthresh": true, "realms": true, "rto_min": true,
	"features": true, "quickack": true, "congctl": true, "tos": true, "dsfield": true, "nexthop": true,
	"expires": true, "fastopen_no_cookie": true, "hoplimit": true, "pref": true, "nhid": true, "encap": true}

func optionTakesValue(a string) bool { return routeOptions[a] }

// optionFlag: keywords of ip route without a value.
func optionFlag(a string) bool { return a == "onlink" || a == "pervasive" || a == "lock" }

// parseDest reads a destination: default, all, any, or an address with or
// without a prefix length (a host route without one).
func parseDest(s string, family int) (netip.Prefix, bool) {
	switch s {
	case "default", "all", "any":
		if family == unix.AF_INET6 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0), true
		}
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0), true
	case "":
		return netip.Prefix{}, false
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	return netip.Prefix{}, false
}

// parseRule reads `ip rule add [not] SELECTOR... ACTION` into its key.
func parseRule(args []string, family int, tables map[string]int) (ruleKey, bool) {
	k := ruleKey{Family: family, Priority: -1, Table: -1}
	if k.Family == 0 {
		k.Family = unix.AF_INET
	}
	for i := 0; i < len(args); i++ {
		val := ""
		if i+1 < len(args) {
			val = args[i+1]
		}
		switch args[i] {
		case "from", "to":
			if val != "all" {
				p, ok := parseDest(val, 0)
				if !ok {
					return k, false
				}
				if args[i] == "from" {
					k.From = p
				} else {
					k.To = p
				}
				if p.Addr().Is6() {
					k.Family = unix.AF_INET6
				}
			}
			i++
		case "priority", "preference", "pref", "order":
			n, err := strconv.Atoi(val)
			if err != nil {
				return k, false
			}
			k.Priority = n
			i++
		case "table", "lookup":
			k.Table = tableID(val, tables)
			i++
		case "not", "l3mdev", "unreachable", "blackhole", "prohibit", "nop":
		default:
			// fwmark, iif, oif, tos, and the rest: the key above is
			// what matches it.
			i++
		}
	}
	return k, true
}

// tableID is a table's number from its id or name (the rt_tables files'
// names, and ip's own main, local, default); -2 for a name not known.
func tableID(s string, names map[string]int) int {
	if n, err := strconv.ParseUint(s, 0, 32); err == nil {
		return int(n)
	}
	switch s {
	case "main":
		return unix.RT_TABLE_MAIN
	case "local":
		return unix.RT_TABLE_LOCAL
	case "default":
		return unix.RT_TABLE_DEFAULT
	}
	if n, ok := names[s]; ok {
		return n
	}
	return -2
}
