package piastub

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
)

// Lab is the PIA gateway scenario against a stub: LAN is a host on the
// VLAN (a veth standing in for enp1s0.50 where the kernel has no 8021q),
// Node is where nodeagent runs, WAN is the node's uplink router with the
// stub and its internet behind it. Counters in WAN see every packet from
// the VLAN that leaves other than through the tunnel; counters at the far
// side see who it thinks it talks to.
type Lab struct {
	LAN, Node, WAN *testenv.NetNS
	Stub           *Stub
	// Dev is the PIA device's name (unique: userspace devices' sockets
	// are global).
	Dev string
	// Dir holds the config, the credentials and the stub's PEMs;
	// StateDir is the daemon's state directory.
	Dir, StateDir string
	Config        string
	Files         Files
	Cred          string
	// Extra is appended to the config WriteConfig writes; PIA is added
	// to the device's pia section (indented by six spaces).
	Extra, PIA string
	// VLAN is the node's VLAN 50 link in a trunk lab (NewTrunkLab), made
	// by nodeagent: enp1s0.50, or vlan50 standing in for it; "" in a lab
	// whose VLAN is a veth of the test's own.
	VLAN string
	// OldLayout puts the pods' gateway on the VLAN link and routes their
	// subnet out of it, as the example once did (a trunk lab only): pods
	// on the node itself get no replies.
	OldLayout bool
}

// Shim is the host shim's name in a trunk lab.
const Shim = "vlan50-shim"

// NewLab builds the gateway scenario and writes a config whose PIA device
// uses region.
func NewLab(t testing.TB, o Options, region string) *Lab {
	t.Helper()
	return newLab(t, o, region, false)
}

// NewTrunkLab is the seeds' own layering: LAN is at the far end of the
// node's trunk enp1s0 and a host on VLAN 50 there (10.10.50.20); nodeagent
// makes VLAN 50 on the trunk (enp1s0.50 where the kernel has 8021q; else a
// macvlan in vepa mode, which, like a VLAN link, never reaches its own
// macvlan children) and the host shim with the pods' gateway. Pods attach
// to l.VLAN (testenv.AttachPod with l.NAD()).
func NewTrunkLab(t testing.TB, o Options, region string) *Lab {
	t.Helper()
	return newLab(t, o, region, true)
}

func newLab(t testing.TB, o Options, region string, trunk bool) *Lab {
	l := &Lab{LAN: testenv.NewNetNS(t), Node: testenv.NewNetNS(t), WAN: testenv.NewNetNS(t)}
	l.Stub = Start(t, o)
	l.Stub.ConnectTo(t, l.WAN)
	lanDev := "eth0"
	switch {
	case !trunk:
		l.Node.Veth(t, "vlan50", l.LAN, "eth0")
		run(t, l.Node, "ip addr add 10.10.50.1/24 dev vlan50", "ip addr add fd00:50::1/64 dev vlan50 nodad")
	case testenv.HasModule("8021q"):
		l.VLAN = "enp1s0.50"
		l.Node.Veth(t, "enp1s0", l.LAN, "eth0")
		run(t, l.LAN, "ip link add link eth0 name eth0.50 type vlan id 50", "ip link set eth0.50 up")
		lanDev = "eth0.50"
	default:
		l.VLAN = "vlan50"
		l.Node.Veth(t, "enp1s0", l.LAN, "eth0")
	}
	l.Node.Veth(t, "uplink", l.WAN, "eth0")
	run(t, l.LAN, "ip addr add 10.10.50.20/24 dev "+lanDev, "ip addr add fd00:50::20/64 dev "+lanDev+" nodad",
		"ip route add default via 10.10.50.1", "ip -6 route add default via fd00:50::1")
	run(t, l.Node, "ip addr add 192.0.2.1/24 dev uplink", "ip addr add 2001:db8:1::1/64 dev uplink nodad",
		"ip route add default via 192.0.2.2", "ip -6 route add default via 2001:db8:1::2")
	run(t, l.WAN, "ip addr add 192.0.2.2/24 dev eth0", "ip addr add 2001:db8:1::2/64 dev eth0 nodad",
		"ip route add 10.10.50.0/24 via 192.0.2.1", "ip -6 route add fd00:50::/64 via 2001:db8:1::1",
		"ip route add 203.0.113.0/24 via 100.64.0.2",
		"nft add table inet leak",
		"nft add chain inet leak pre { type filter hook prerouting priority -400 ; }",
		`nft add rule inet leak pre ip saddr 10.10.50.0/24 counter comment "vlan4"`,
		`nft add rule inet leak pre ip6 saddr fd00:50::/64 counter comment "vlan6"`,
		`nft add rule inet leak pre ip daddr `+Far.String()+` meta l4proto icmp counter comment "plain"`,
		`nft add rule inet leak pre udp dport 53 counter comment "dns-udp"`,
		`nft add rule inet leak pre tcp dport 53 counter comment "dns-tcp"`)
	Sysctl(t, l.WAN, "net/ipv4/ip_forward", "1")
	Sysctl(t, l.WAN, "net/ipv6/conf/all/forwarding", "1")
	run(t, l.Stub.Inet, "ip route add default via "+Exit.String(),
		"nft add table inet far",
		"nft add chain inet far in { type filter hook input priority 0 ; }",
		`nft add rule inet far in ip saddr `+Exit.String()+` counter comment "exit"`,
		`nft add rule inet far in ip saddr != `+Exit.String()+` counter comment "other"`,
		`nft add rule inet far in meta nfproto ipv6 counter comment "other6"`)

	l.Dir = t.TempDir()
	os.Chmod(l.Dir, 0o755)
	l.StateDir = filepath.Join(l.Dir, "state")
	l.Files = l.Stub.WriteFiles(l.Dir)
	l.Cred = filepath.Join(l.Dir, "pia.cred")
	l.Stub.Creds(l.Cred)
	var b [3]byte
	rand.Read(b[:])
	l.Dev = "wgpia" + hex.EncodeToString(b[:])
	l.Config = filepath.Join(l.Dir, "nodeagent.yaml")
	l.WriteConfig(t, region)
	return l
}

// WriteConfig (re)writes the lab's config with the PIA device in region.
func (l *Lab) WriteConfig(t testing.TB, region string) {
	t.Helper()
	yaml := fmt.Sprintf(`%[10]s
sysctls:
  net.ipv4.ip_forward: "1"
  net.ipv6.conf.all.forwarding: "1"
wireguard:
  - name: %[1]s
    mtu: 1420
    pia:
      region: %[2]s
      credentialsFile: %[3]s
      serverList: %[4]s
      tokenURL: %[5]s
      caFile: %[6]s
      serverListKeyFile: %[7]s
      webCAFile: %[8]s
%[9]s
routing:
  tables:
    - id: 150
      name: vlan50-egress
      killSwitch: true
      routes:
        - {to: default, dev: %[1]s}
        - {to: 10.10.50.0/24, dev: %[11]s}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
    - {priority: 1001, from: "fd00:50::/64", table: 150}
firewall:
  masquerade:
    - {from: 10.10.50.0/24, out: %[1]s}
  killSwitch:
    - {from: 10.10.50.0/24, allowOut: [%[1]s]}
  mssClamp: [%[1]s]
`, l.Dev, region, l.Cred, l.Files.ServerList, l.Files.TokenURL, l.Files.CAFile, l.Files.ServerListKeyFile, l.Files.WebCAFile, l.PIA, l.links(), l.podsDev()) + l.Extra
	if err := os.WriteFile(l.Config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
}

// links are the trunk lab's VLAN 50 and shim, for the config.
func (l *Lab) links() string {
	if l.VLAN == "" {
		return ""
	}
	vlan, shim := "", "[10.10.50.1/24, \"fd00:50::1/64\"]"
	if l.OldLayout {
		vlan, shim = ", addresses: [10.10.50.1/24, \"fd00:50::1/64\"]", "[10.10.50.3/32]"
	}
	s := "dad: {probes: 1, interval: 50ms, wait: 200ms}\n"
	if l.VLAN == "enp1s0.50" {
		s += "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50" + vlan + "}\nmacvlans:\n"
	} else {
		s += "macvlans:\n  - {name: vlan50, parent: enp1s0, mode: vepa" + vlan + "}   # stands in for enp1s0.50\n"
	}
	return s + "  - {name: " + Shim + ", parent: " + l.VLAN + ", addresses: " + shim + "}\n"
}

// podsDev is the link table 150 reaches the VLAN's hosts by: the shim in
// a trunk lab (the VLAN link in its old layout).
func (l *Lab) podsDev() string {
	switch {
	case l.VLAN == "":
		return "vlan50"
	case l.OldLayout:
		return l.VLAN
	}
	return Shim
}

// NAD is the trunk lab's NetworkAttachmentDefinition for pods on VLAN 50.
func (l *Lab) NAD() map[string]any { return testenv.NAD(l.VLAN, "10.10.50.1", "fd00:50::1") }

// PingFar sends one echo from the VLAN host to the far side and reports
// whether it came back.
func (l *Lab) PingFar() bool {
	_, err := l.LAN.TryExec("ping", "-c", "1", "-W", "1", Far.String())
	return err == nil
}

// Count reads the counter of the rule with comment c in inet table/chain
// of ns.
func Count(t testing.TB, ns *testenv.NetNS, table, chain, c string) int {
	t.Helper()
	out := ns.Exec(t, "nft", "list", "chain", "inet", table, chain)
	re := regexp.MustCompile(`packets (\d+) bytes \d+ comment "` + regexp.QuoteMeta(c) + `"`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no counter %q in %s:\n%s", c, ns.Name, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Leaks counts VLAN packets seen in the WAN namespace: from its IPv4
// and IPv6 prefixes, and plaintext echo requests to the far side (a leak
// masqueraded to the node's own address).
func (l *Lab) Leaks(t testing.TB) (v4, v6, plain int) {
	return Count(t, l.WAN, "leak", "pre", "vlan4"), Count(t, l.WAN, "leak", "pre", "vlan6"), Count(t, l.WAN, "leak", "pre", "plain")
}

// NoLeaks fails the test if any VLAN packet reached the WAN outside the
// tunnel.
func (l *Lab) NoLeaks(t testing.TB, when string) {
	t.Helper()
	if v4, v6, plain := l.Leaks(t); v4+v6+plain > 0 {
		t.Errorf("%s: VLAN packets reached the WAN namespace outside the tunnel: v4 %d, v6 %d, plaintext to the far side %d", when, v4, v6, plain)
	}
}

// DNSLeaks counts plaintext DNS (UDP and TCP port 53) seen in the WAN
// namespace, from anyone.
func (l *Lab) DNSLeaks(t testing.TB) int {
	return Count(t, l.WAN, "leak", "pre", "dns-udp") + Count(t, l.WAN, "leak", "pre", "dns-tcp")
}

// FarSaw counts packets the far side received from the stub's exit
// address and from anything else.
func (l *Lab) FarSaw(t testing.TB) (exit, other int) {
	return Count(t, l.Stub.Inet, "far", "in", "exit"), Count(t, l.Stub.Inet, "far", "in", "other") + Count(t, l.Stub.Inet, "far", "in", "other6")
}
