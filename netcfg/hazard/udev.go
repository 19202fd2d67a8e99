package hazard

import (
	"bytes"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
)

// linkConfig is one .link file udevd loaded (udev/net/link-config.c).
type linkConfig struct {
	file       string
	match      *netMatch
	name       string   // Name=
	namePolicy []string // NamePolicy=, nil when not set
	alias      string   // Alias=
	macPolicy  string   // MACAddressPolicy=: "none", "persistent", "random"
	mac        hwAddr   // MACAddress=
}

// UdevEffect is what udevd's net_setup_link does to a link when it
// appears (an "add" event), by the .link file that applies to it.
type UdevEffect struct {
	// File is the .link file that applies, "" for none.
	File string
	// NewName is the name it gives the link, "" to keep it.
	NewName string
	// Alias is the alias it sets, "" for none.
	Alias string
	// MAC is the address it sets, nil for none.
	MAC net.HardwareAddr
	// Match names the keys that caught the link.
	Match string
}

// UdevVerdict is what udevd does to l when l appears: the .link file
// that applies (the first in file-name order whose [Match] matches;
// loopback links take none) and what it changes. It is what `udevadm
// test-builtin net_setup_link` reports for the link (ID_NET_LINK_FILE,
// ID_NET_NAME).
func UdevVerdict(p Paths, s System, l Link) UdevEffect {
	for _, c := range p.loadLinkConfigs(s) {
		if !c.match.test(l, true, false) {
			continue
		}
		e := UdevEffect{File: c.file, Match: c.match.describe()}
		if n := c.newName(l, s); n != l.Name {
			e.NewName = n
		}
		if c.alias != "" && c.alias != l.Alias {
			e.Alias = c.alias
		}
		if m := c.newMAC(l); m != nil {
			e.MAC = m
		}
		return e
	}
	return UdevEffect{}
}

// Udev reports the hazards udevd's .link files hold for links: one that
// would rename a link of nodeagent's, or set its alias (nodeagent's
// ownership mark) or its address, when the link appears.
func Udev(p Paths, s System, links []Link) []Hazard {
	if !s.Udev {
		return nil
	}
	var out []Hazard
	for _, l := range links {
		e := UdevVerdict(p, s, l)
		var what []string
		var kinds []string
		if e.NewName != "" {
			what = append(what, fmt.Sprintf("renames it to %s when it appears (udev cannot while the link is up, so this races nodeagent bringing it up; nodeagent renames a renamed link of its own back, once per appearance)", e.NewName))
			kinds = append(kinds, "link")
		}
		if e.Alias != "" {
			what = append(what, fmt.Sprintf("sets its alias to %q, overwriting nodeagent's ownership mark", e.Alias))
			kinds = append(kinds, "link")
		}
		if e.MAC != nil {
			what = append(what, fmt.Sprintf("sets its address to %s", e.MAC))
			kinds = append(kinds, "link", "address")
		}
		if len(what) == 0 {
			continue
		}
		out = append(out, Hazard{Source: e.File, Manager: "udev", Link: l.Name,
			What: fmt.Sprintf("its [Match] (%s) catches nodeagent's link %s and %s", e.Match, l.Name, strings.Join(what, "; ")),
			Fix: fmt.Sprintf("narrow its [Match] so that it leaves %s alone (OriginalName=!%s on a line of its own), or give nodeagent's links a file of their own that sorts before it, such as /etc/systemd/network/00-nodeagent.link with [Match] OriginalName=%s and [Link] NamePolicy=keep; then udevadm control --reload",
				l.Name, l.Name, l.Name),
			Kinds: slices.Compact(kinds)})
	}
	return out
}

// loadLinkConfigs is link_config_load(): every .link file of the search
// path in file-name order, each with its drop-ins (NAME.link.d/*.conf),
// read as root; left out as link_load_one() leaves out: empty or
// /dev/null, refused by the parser, an empty [Match] without conditions,
// conditions that do not hold.
func (p Paths) loadLinkConfigs(s System) []linkConfig {
	dirs := networkDirs(s.Version)
	var out []linkConfig
	for _, f := range p.listConf(dirs, "", ".link") {
		dropIns := p.dropIns(dirs, "", filepath.Base(f)+".d")
		as, st := parseMany(append([]string{f}, dropIns...), asRoot)
		if st != fileOK {
			continue
		}
		m := parseMatch(as, "OriginalName", true)
		if m.empty() && len(m.conditions) == 0 {
			continue
		}
		if !conditionsHold(m.conditions, s, p, "run/credentials/systemd-udevd.service") {
			continue
		}
		c := linkConfig{file: f, match: m, macPolicy: "none"}
		for _, a := range as {
			if a.section != "Link" {
				continue
			}
			v := a.value
			switch a.key {
			case "Name":
				if v == "" {
					c.name = ""
				} else if ifnameValid(v, 16) {
					c.name = v
				}
			case "NamePolicy":
				words, _ := extractWords(v, wordsPlain)
				var pol []string
				for _, w := range words {
					if slices.Contains([]string{"kernel", "keep", "database", "onboard", "slot", "path", "mac"}, w) && !slices.Contains(pol, w) {
						pol = append(pol, w)
					}
				}
				if pol == nil {
					pol = []string{}
				}
				c.namePolicy = pol
			case "Alias":
				switch {
				case v == "":
					c.alias = ""
				case isASCII(v) && len(v) < 256:
					c.alias = v
				}
			case "MACAddressPolicy":
				switch v {
				case "":
					c.macPolicy = "none"
				case "persistent", "random", "none":
					c.macPolicy = v
				}
			case "MACAddress":
				if v == "" {
					c.mac = nil
				} else if h, ok := parseHWAddr(v); ok {
					c.mac = h
				}
			}
		}
		out = append(out, c)
	}
	return out
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// newName is link_generate_new_name() for an add event: a name the
// creator gave (NET_NAME_USER) is renamed only under a naming scheme
// that allows re-renames (v240 and later; net.naming_scheme= on the
// kernel command line picks an older one). With net.ifnames=0 the name
// policies are off. Otherwise the first policy that yields a valid name
// wins; "keep" keeps a creator's name, "kernel" a predictable kernel
// name; then Name=; else the name stays.
func (c linkConfig) newName(l Link, s System) string {
	userNamed := l.NameAssignType == netNameUser || l.NameAssignType == 4
	if userNamed && !allowRerenames(s.KernelCmdline) {
		return l.Name
	}
	if namePolicyOn(s.KernelCmdline) {
		for _, pol := range c.namePolicy {
			var n string
			switch pol {
			case "kernel":
				if l.NameAssignType == 2 {
					return l.Name
				}
				continue
			case "keep":
				if userNamed {
					return l.Name
				}
				continue
			case "database":
				n = l.Props["ID_NET_NAME_FROM_DATABASE"]
			case "onboard":
				n = l.Props["ID_NET_NAME_ONBOARD"]
			case "slot":
				n = l.Props["ID_NET_NAME_SLOT"]
			case "path":
				n = l.Props["ID_NET_NAME_PATH"]
			case "mac":
				n = l.Props["ID_NET_NAME_MAC"]
			}
			if ifnameValid(n, 16) {
				return n
			}
		}
	}
	if c.name != "" {
		return c.name
	}
	return l.Name
}

// allowRerenames reports whether udev's naming scheme allows renaming a
// link its creator named: every scheme from v240 on, the default.
func allowRerenames(cmdline string) bool {
	words, _ := extractWords(cmdline, wordsMatch)
	for _, w := range words {
		if v, ok := strings.CutPrefix(w, "net.naming_scheme="); ok {
			return v != "v238" && v != "v239" && v != "0"
		}
	}
	return true
}

// namePolicyOn is enable_name_policy(): net.ifnames=0 on the kernel
// command line turns NamePolicy= off.
func namePolicyOn(cmdline string) bool {
	words, _ := extractWords(cmdline, wordsMatch)
	on := true
	for _, w := range words {
		if v, ok := strings.CutPrefix(w, "net.ifnames="); ok {
			if b, ok := parseBoolean(v); ok {
				on = b
			}
		} else if w == "net.ifnames" {
			on = true
		}
	}
	return on
}

// newMAC is link_generate_new_hw_addr(): MACAddress= under the policy
// "none" (the default) sets that address on any link that has one; the
// policies "persistent" and "random" change only an Ethernet link whose
// address is the hardware's or random (never a VLAN's stolen address or
// one its creator set), to a derived or random one.
func (c linkConfig) newMAC(l Link) net.HardwareAddr {
	if len(l.MAC) == 0 {
		return nil
	}
	if c.macPolicy == "none" {
		if len(c.mac) == len(l.MAC) && !bytes.Equal(c.mac, l.MAC) && !allZeroOrFF(c.mac) {
			return net.HardwareAddr(c.mac)
		}
		return nil
	}
	if l.IfType != 1 {
		return nil
	}
	switch l.AddrAssignType {
	case netAddrRandom, netAddrPerm:
	default:
		return nil
	}
	if (c.macPolicy == "random") == (l.AddrAssignType == netAddrRandom) {
		return nil
	}
	// A derived or random address: which one does not matter here.
	return net.HardwareAddr{0x02, 0, 0, 0, 0, 0}
}

func allZeroOrFF(b []byte) bool {
	return bytes.Equal(b, make([]byte, len(b))) || bytes.Equal(b, bytes.Repeat([]byte{0xff}, len(b)))
}
