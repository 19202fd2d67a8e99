package hazard

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Link is one of nodeagent's links as networkd's and udev's [Match] see
// it: what the kernel and udev say of it (facts.go reads them; Predict
// says what a link not made yet will have).
type Link struct {
	Name string
	// AltNames are its alternative names (networkd's Name= tests them
	// too; udev's OriginalName= does not).
	AltNames []string
	// Kind is IFLA_INFO_KIND: vlan, macvlan, wireguard.
	Kind string
	// IfType is its ARPHRD type (1 ether, 65534 none).
	IfType uint16
	// DevType is its udev device's DEVTYPE (vlan, wireguard; "" for a
	// macvlan).
	DevType string
	// MAC is its hardware address (a VLAN's is its parent's), nil for a
	// link without one (WireGuard).
	MAC net.HardwareAddr
	// PermMAC is its permanent address as networkd and udev read it:
	// IFLA_PERM_ADDRESS, or ethtool's answer for a link with an address,
	// which for a VLAN or macvlan is all zeros; nil without one.
	PermMAC net.HardwareAddr
	// Driver is what ethtool says drives it ("802.1Q VLAN Support",
	// "macvlan"), "" when it says nothing (WireGuard).
	Driver string
	// Props are its udev device's properties (the uevent's and udev's
	// database's); nil when not known.
	Props map[string]string
	// NameAssignType and AddrAssignType are the sysfs attributes udev
	// reads: a name given by the creator is 3 (NET_NAME_USER); an address
	// stolen from the parent 2, set by the creator 3, random 1.
	NameAssignType, AddrAssignType int
	// Parent is the link it sits on, "" for none.
	Parent string
	// Alias is its IFLA_IFALIAS.
	Alias string
}

// netMatch is a parsed [Match] section of a .network or .link file (the
// keys of shared/net-condition.c's NetMatch, and the conditions).
type netMatch struct {
	mac, permMAC     []hwAddr // nil: not set
	macSet, permSet  bool
	path, driver     []string
	iftype, kind     []string
	ifname, property []string
	wlan, ssid       []string
	bssid            []hwAddr
	bssidSet         bool
	conditions       []condition
	// used lists the keys that narrowed the match, for the hazard text.
	used []string
}

type hwAddr []byte

// matchKeys are the [Match] keys of .network (networkd-network-gperf.gperf)
// and .link files (link-config-gperf.gperf); the file kind picks Name= or
// OriginalName=. A key not listed is unknown there and ignored.
var conditionKeys = []string{"Host", "Virtualization", "KernelCommandLine", "KernelVersion", "Credential", "Architecture", "Firmware"}

// add parses one [Match] assignment as its systemd parser does.
// nameKey is Name (a .network) or OriginalName (a .link).
func (m *netMatch) add(a assignment, nameKey string, link bool) {
	v := a.value
	switch a.key {
	case "MACAddress", "PermanentMACAddress":
		set, flag := &m.mac, &m.macSet
		if a.key == "PermanentMACAddress" {
			set, flag = &m.permMAC, &m.permSet
		}
		if v == "" {
			*set, *flag = nil, false
			return
		}
		words, _ := extractWords(v, wordsPlain)
		for _, w := range words {
			if h, ok := parseHWAddr(w); ok {
				*set, *flag = append(*set, h), true
			}
		}
	case "Path", "Driver", "Type", "Kind", "WLANInterfaceType", "SSID":
		if link && (a.key == "WLANInterfaceType" || a.key == "SSID") {
			return
		}
		l := map[string]*[]string{"Path": &m.path, "Driver": &m.driver, "Type": &m.iftype, "Kind": &m.kind, "WLANInterfaceType": &m.wlan, "SSID": &m.ssid}[a.key]
		matchStrv(l, v, wordsMatch, nil)
	case "BSSID":
		if link {
			return
		}
		if v == "" {
			m.bssid, m.bssidSet = nil, false
			return
		}
		words, _ := extractWords(v, wordsPlain)
		for _, w := range words {
			if h, ok := parseHWAddr(w); ok && len(h) == 6 {
				m.bssid, m.bssidSet = append(m.bssid, h), true
			}
		}
	case nameKey:
		// Name= takes alternative names (128 bytes) in a .network;
		// OriginalName= only kernel names (16) in a .link.
		maxLen := 128
		if link {
			maxLen = 16
		}
		matchStrv(&m.ifname, v, wordsPlain, func(w string) bool { return ifnameValid(w, maxLen) })
	case "Property":
		matchStrv(&m.property, v, wordsProperty, envAssignmentValid)
	default:
		if slices.Contains(conditionKeys, a.key) {
			// config_parse_net_condition(): an empty value drops the
			// key's condition; otherwise it replaces it.
			m.conditions = slices.DeleteFunc(m.conditions, func(c condition) bool { return c.key == a.key })
			if v == "" {
				return
			}
			neg := strings.HasPrefix(v, "!")
			m.conditions = append(m.conditions, condition{key: a.key, param: strings.TrimPrefix(v, "!"), negate: neg})
		}
	}
}

// matchStrv is config_parse_match_strv() and its Name= and Property=
// siblings: an empty value resets the list; a leading '!' negates every
// word of the line; a word the key's check refuses is dropped; a syntax
// error keeps the words before it.
func matchStrv(l *[]string, v string, mode int, valid func(string) bool) {
	if v == "" {
		*l = nil
		return
	}
	invert := strings.HasPrefix(v, "!")
	v = strings.TrimPrefix(v, "!")
	words, _ := extractWords(v, mode)
	for _, w := range words {
		if valid != nil && !valid(w) {
			continue
		}
		if invert {
			w = "!" + w
		}
		*l = append(*l, w)
	}
}

// empty is net_match_is_empty().
func (m *netMatch) empty() bool {
	return !m.macSet && !m.permSet && len(m.path) == 0 && len(m.driver) == 0 && len(m.iftype) == 0 &&
		len(m.kind) == 0 && len(m.ifname) == 0 && len(m.property) == 0 && len(m.wlan) == 0 && len(m.ssid) == 0 && !m.bssidSet
}

// testStrv is net_condition_test_strv(): any negative pattern that
// matches rejects; with a positive pattern one must match. s nil is a
// property the link lacks.
func testStrv(patterns []string, s *string) bool {
	if len(patterns) == 0 {
		return true
	}
	matched, positive := false, false
	for _, p := range patterns {
		q, invert := strings.CutPrefix(p, "!")
		if !invert {
			positive = true
		}
		if s != nil && fnmatch(q, *s, false) {
			if invert {
				return false
			}
			matched = true
		}
	}
	return !positive || matched
}

func ptr(s string) *string { return &s }

// typeString is net_get_type_string(): the udev device's DEVTYPE when it
// has one, else the ARPHRD type's name in lower case.
func (l Link) typeString(udev bool) *string {
	if udev && l.DevType != "" {
		return ptr(l.DevType)
	}
	if n, ok := arphrdNames[l.IfType]; ok {
		return ptr(n)
	}
	return nil
}

// arphrdNames are the ARPHRD types nodeagent's links can have, named as
// systemd's arphrd_to_name() does.
var arphrdNames = map[uint16]string{1: "ether", 65534: "none", 772: "loopback", 776: "sit", 778: "gre", 768: "tunnel", 769: "tunnel6"}

// test is net_match_config() for l; udev says whether l's udev device is
// known (networkd without udevd has none: no DEVTYPE, no properties);
// altNames whether Name= tests alternative names (networkd) or not (udev).
func (m *netMatch) test(l Link, udev, altNames bool) bool {
	if m.macSet && (len(l.MAC) == 0 || !hwIn(m.mac, l.MAC)) {
		return false
	}
	if m.permSet && (len(l.PermMAC) == 0 || !hwIn(m.permMAC, l.PermMAC)) {
		return false
	}
	var props map[string]string
	if udev {
		props = l.Props
	}
	var path *string
	if v, ok := props["ID_PATH"]; ok {
		path = &v
	}
	if !testStrv(m.path, path) {
		return false
	}
	var driver *string
	if l.Driver != "" {
		driver = &l.Driver
	}
	if !testStrv(m.driver, driver) {
		return false
	}
	if !testStrv(m.iftype, l.typeString(udev)) {
		return false
	}
	if !testStrv(m.kind, ptrOrNil(l.Kind)) {
		return false
	}
	if !testStrv(m.ifname, &l.Name) {
		ok := false
		if altNames {
			for _, n := range l.AltNames {
				if testStrv(m.ifname, &n) {
					ok = true
					break
				}
			}
		}
		if !ok {
			return false
		}
	}
	for _, p := range m.property {
		neg := strings.HasPrefix(p, "!")
		k, val, _ := strings.Cut(strings.TrimPrefix(p, "!"), "=")
		dv, has := props[k]
		v := udev && props != nil && has && fnmatch(val, dv, false)
		if v == neg {
			return false
		}
	}
	// Our links are not wireless: WLANInterfaceType= and SSID= test a
	// NULL string, BSSID= an absent address.
	if !testStrv(m.wlan, nil) || !testStrv(m.ssid, nil) || m.bssidSet {
		return false
	}
	return true
}

func ptrOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func hwIn(set []hwAddr, a net.HardwareAddr) bool {
	for _, h := range set {
		if bytes.Equal(h, a) {
			return true
		}
	}
	return false
}

// describe is the [Match] as the hazard names it: the keys set.
func (m *netMatch) describe() string {
	if len(m.used) == 0 {
		return "its [Match]"
	}
	return strings.Join(m.used, ", ")
}

// parseHWAddr is parse_hw_addr_full(s, 0): xx:xx:.., xx-xx-.. or
// xxxx.xxxx.xxxx with one or two (four for dots) hex digits per field, 4,
// 6, 16 or 20 bytes, or an IPv4 or IPv6 address (for tunnels).
func parseHWAddr(s string) (hwAddr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		b := a.AsSlice()
		return b, true
	}
	sepAt := strings.IndexFunc(s, func(r rune) bool { return !strings.ContainsRune("0123456789abcdefABCDEF", r) })
	if sepAt < 0 {
		return nil, false
	}
	sep := s[sepAt]
	field := 1
	switch sep {
	case '.':
		field = 2
	case ':', '-':
	default:
		return nil, false
	}
	parts := strings.Split(s, string(sep))
	var out []byte
	for _, p := range parts {
		if p == "" || len(p) > 2*field {
			return nil, false
		}
		var v uint16
		for _, c := range p {
			d := strings.IndexRune("0123456789abcdef", toLowerASCII(c))
			if d < 0 {
				return nil, false
			}
			v = v<<4 | uint16(d)
		}
		if field == 2 {
			out = append(out, byte(v>>8), byte(v))
		} else {
			out = append(out, byte(v))
		}
		if len(out) > 20 {
			return nil, false
		}
	}
	switch len(out) {
	case 4, 6, 16, 20:
		return out, true
	}
	return nil, false
}

func toLowerASCII(c rune) rune {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// ifnameValid is ifname_valid_full(): not empty, shorter than maxLen, not
// "." or "..", not "all" or "default", not all digits, printable ASCII
// without ':', '/' or '%'. Globs are names here.
func ifnameValid(s string, maxLen int) bool {
	if s == "" || len(s) >= maxLen || s == "." || s == ".." || s == "all" || s == "default" {
		return false
	}
	numeric := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 127 || c <= 32 || c == ':' || c == '/' || c == '%' {
			return false
		}
		numeric = numeric && c >= '0' && c <= '9'
	}
	return !numeric
}

// envAssignmentValid is env_assignment_is_valid() for Property=: a valid
// variable name, '=', a value.
func envAssignmentValid(s string) bool {
	k, _, ok := strings.Cut(s, "=")
	if !ok || k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, c := range k {
		if !(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
			return false
		}
	}
	return true
}

// parseMatch reads the [Match] sections of a parsed file (several
// sections merge; later lines add to or reset earlier ones).
func parseMatch(as []assignment, nameKey string, link bool) *netMatch {
	m := &netMatch{}
	for _, a := range as {
		if a.section != "Match" {
			continue
		}
		m.add(a, nameKey, link)
	}
	m.used = m.keys(nameKey)
	return m
}

// keys lists the narrowing keys set, as "Key=v1 v2".
func (m *netMatch) keys(nameKey string) []string {
	var out []string
	addL := func(k string, l []string) {
		if len(l) > 0 {
			out = append(out, k+"="+strings.Join(l, " "))
		}
	}
	addH := func(k string, set bool, l []hwAddr) {
		if set {
			var s []string
			for _, h := range l {
				s = append(s, net.HardwareAddr(h).String())
			}
			out = append(out, k+"="+strings.Join(s, " "))
		}
	}
	addL(nameKey, m.ifname)
	addH("MACAddress", m.macSet, m.mac)
	addH("PermanentMACAddress", m.permSet, m.permMAC)
	addL("Type", m.iftype)
	addL("Kind", m.kind)
	addL("Driver", m.driver)
	addL("Path", m.path)
	addL("Property", m.property)
	for _, c := range m.conditions {
		neg := ""
		if c.negate {
			neg = "!"
		}
		out = append(out, fmt.Sprintf("%s=%s%s", c.key, neg, c.param))
	}
	return out
}
