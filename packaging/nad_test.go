package packaging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv"
	"gopkg.in/yaml.v3"
)

// nadFile is the download pods' NetworkAttachmentDefinition, which the
// README's walkthrough applies.
const nadFile = "examples/kubernetes/download-pods-nad.yaml"

// clusterCIDRs are what the NAD leaves to the pod's eth0: k3s's default
// pod and Service CIDRs.
var clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16"), netip.MustParsePrefix("10.43.0.0/16")}

// nadConfig is the CNI config of the shipped NetworkAttachmentDefinition.
type nadConfig struct {
	CNIVersion   string          `json:"cniVersion"`
	Name         string          `json:"name"`
	Type         string          `json:"type"`
	Master       string          `json:"master"`
	Mode         string          `json:"mode"`
	Capabilities map[string]bool `json:"capabilities"`
	IPAM         struct {
		Type   string `json:"type"`
		Routes []struct {
			Dst string `json:"dst"`
			GW  string `json:"gw"`
		} `json:"routes"`
		DNS struct {
			Nameservers []string `json:"nameservers"`
		} `json:"dns"`
	} `json:"ipam"`
}

// readNAD returns the shipped NAD's name, namespace and its config, both
// as the struct and as the raw JSON object the plugin gets.
func readNAD(t *testing.T) (meta map[string]string, c nadConfig, raw map[string]any) {
	t.Helper()
	var nad struct {
		APIVersion string            `yaml:"apiVersion"`
		Kind       string            `yaml:"kind"`
		Metadata   map[string]string `yaml:"metadata"`
		Spec       struct {
			Config string `yaml:"config"`
		} `yaml:"spec"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(mustRead(t, nadFile)))
	dec.KnownFields(true)
	if err := dec.Decode(&nad); err != nil {
		t.Fatalf("%s: %v", nadFile, err)
	}
	if nad.APIVersion != "k8s.cni.cncf.io/v1" || nad.Kind != "NetworkAttachmentDefinition" {
		t.Fatalf("%s: %s %s, want a k8s.cni.cncf.io/v1 NetworkAttachmentDefinition", nadFile, nad.APIVersion, nad.Kind)
	}
	jd := json.NewDecoder(strings.NewReader(nad.Spec.Config))
	jd.DisallowUnknownFields()
	if err := jd.Decode(&c); err != nil {
		t.Fatalf("%s: spec.config: %v", nadFile, err)
	}
	if err := json.Unmarshal([]byte(nad.Spec.Config), &raw); err != nil {
		t.Fatal(err)
	}
	return nad.Metadata, c, raw
}

// homelab is examples/homelab.yaml, parsed as the daemon parses it.
func homelab(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.ParseWith("homelab.yaml", mustRead(t, "../examples/homelab.yaml"), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDownloadPodsNAD: the shipped NetworkAttachmentDefinition is the one
// examples/homelab.yaml's pods need. macvlan bridge on the config's VLAN 50,
// static IPAM, every route through the shim's address (the pods' gateway),
// and the routes together with the cluster's CIDRs cover the IPv4 space
// exactly once: nothing but the cluster's CIDRs is left to eth0, and those
// never go to the shim.
func TestDownloadPodsNAD(t *testing.T) {
	meta, nad, _ := readNAD(t)
	ex := homelab(t)
	if len(ex.Macvlans) != 1 || len(ex.Macvlans[0].Addresses) != 1 {
		t.Fatalf("the example's shim: %+v", ex.Macvlans)
	}
	shim := ex.Macvlans[0]
	gw, err := netip.ParsePrefix(shim.Addresses[0])
	if err != nil {
		t.Fatal(err)
	}
	if meta["name"] != "vlan50" || meta["namespace"] != "downloads" {
		t.Errorf("metadata %v, want vlan50 in downloads (the README's pod annotation names it)", meta)
	}
	if nad.Type != "macvlan" || nad.Mode != "bridge" || nad.Master != shim.Parent || nad.IPAM.Type != "static" || !nad.Capabilities["ips"] {
		t.Errorf("%s: %+v; want macvlan bridge on %s (the shim's parent), static IPAM taking the pod's ips", nadFile, nad, shim.Parent)
	}
	if got := nad.IPAM.DNS.Nameservers; len(got) != 1 || got[0] != gw.Addr().String() {
		t.Errorf("dns nameservers %v, want [%s] (the shim, whose DNS the config sends into the tunnel)", got, gw.Addr())
	}
	// The pods' subnet is the one the config kill-switches and sends DNS
	// into the tunnel for.
	subnet := gw.Masked().String()
	var ks, dns bool
	for _, k := range ex.Firewall.KillSwitch {
		ks = ks || k.From == subnet
	}
	for _, w := range ex.WireGuard {
		if w.PIA != nil {
			for _, f := range w.PIA.DNS.For {
				dns = dns || f == subnet
			}
		}
	}
	if !ks || !dns {
		t.Errorf("the example does not kill-switch (%v) or send DNS into the tunnel (%v) for the pods' %s", ks, dns, subnet)
	}

	var routes []netip.Prefix
	for _, r := range nad.IPAM.Routes {
		p, err := netip.ParsePrefix(r.Dst)
		if err != nil || p != p.Masked() || !p.Addr().Is4() {
			t.Errorf("route dst %q is not an IPv4 prefix", r.Dst)
			continue
		}
		if r.GW != gw.Addr().String() {
			t.Errorf("route %s via %q, want via the shim's %s", r.Dst, r.GW, gw.Addr())
		}
		routes = append(routes, p)
	}
	if err := partition(append(append([]netip.Prefix(nil), routes...), clusterCIDRs...)); err != nil {
		t.Errorf("the routes and the cluster's CIDRs %v: %v", clusterCIDRs, err)
	}
}

// partition says why ps is not a partition of the IPv4 space: two overlap,
// or together they leave addresses out.
func partition(ps []netip.Prefix) error {
	total := new(big.Int)
	for i, a := range ps {
		for _, b := range ps[i+1:] {
			if a.Overlaps(b) {
				return fmt.Errorf("%s and %s overlap", a, b)
			}
		}
		total.Add(total, new(big.Int).Lsh(big.NewInt(1), uint(32-a.Bits())))
	}
	if all := new(big.Int).Lsh(big.NewInt(1), 32); total.Cmp(all) != 0 {
		return fmt.Errorf("they cover %s addresses of %s", total, all)
	}
	return nil
}

// TestDownloadPodsNADRoutes attaches a pod with the shipped definition
// through Debian's macvlan and static CNI plugins, as Multus invokes them,
// beside an eth0 holding a default route as the cluster's CNI leaves it:
// the kernel then sends the internet (and the node's LAN) by net1 through
// the shim's address, and only the cluster's CIDRs by eth0.
func TestDownloadPodsNADRoutes(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCNI(t)
	_, nad, raw := readNAD(t)
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", peer, "wire0")
	// The VLAN's stand-in, named as the NAD's master (this kernel may have
	// no 8021q): a vepa macvlan, which like a VLAN link never reaches its
	// own macvlan children.
	node.Exec(t, "ip", "link", "add", "link", "trunk0", "name", nad.Master, "type", "macvlan", "mode", "vepa")
	node.Exec(t, "ip", "link", "set", "trunk0", "up")
	node.Exec(t, "ip", "link", "set", nad.Master, "up")
	pod := testenv.AttachPod(t, node, raw, "qbittorrent", "10.10.50.10/24")
	// eth0 as Flannel leaves it: the pod's cluster address and the default
	// route through the node's bridge.
	cni := testenv.NewNetNS(t)
	pod.NS.Veth(t, "eth0", cni, "veth0")
	pod.NS.Exec(t, "ip", "addr", "add", "10.42.0.5/24", "dev", "eth0")
	pod.NS.Exec(t, "ip", "link", "set", "eth0", "up")
	pod.NS.Exec(t, "ip", "route", "add", "default", "via", "10.42.0.1", "dev", "eth0")
	gw := nad.IPAM.Routes[0].GW
	for dst, want := range map[string]string{
		"1.1.1.1":         "via " + gw + " dev net1",
		"212.102.35.1":    "via " + gw + " dev net1", // a PIA server
		"10.0.0.243":      "via " + gw + " dev net1", // PIA's resolver inside the tunnel
		"192.168.2.30":    "via " + gw + " dev net1", // the LAN: through the node, never around it
		"10.10.50.1":      "dev net1",
		"10.43.0.10":      "via 10.42.0.1 dev eth0", // cluster DNS, Services
		"10.42.3.7":       "via 10.42.0.1 dev eth0", // another node's pod
		"10.42.0.9":       "dev eth0",
		"255.255.255.254": "via " + gw + " dev net1",
	} {
		out := pod.NS.Exec(t, "ip", "-4", "route", "get", dst)
		if !strings.Contains(out, dst+" "+want+" ") {
			t.Errorf("ip route get %s in the pod: %q, want %q", dst, strings.TrimSpace(out), want)
		}
	}
}
