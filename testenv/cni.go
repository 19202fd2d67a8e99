package testenv

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// CNIDir is where Debian's containernetworking-plugins puts the plugins.
const CNIDir = "/usr/lib/cni"

// RequireCNI skips t when the macvlan and static CNI plugins are not
// installed (testenv/deps.sh installs them; the VM has them from the host).
func RequireCNI(t testing.TB) {
	t.Helper()
	for _, p := range []string{"macvlan", "static"} {
		if _, err := os.Stat(filepath.Join(CNIDir, p)); err != nil {
			t.Skipf("needs Debian's containernetworking-plugins (%s/%s: %v); testenv/deps.sh installs it", CNIDir, p, err)
		}
	}
}

// Pod is a pod's network namespace with one link attached by Debian's real
// macvlan CNI plugin, invoked as Multus invokes a NetworkAttachmentDefinition:
// CNI_COMMAND, CNI_NETNS and the rest in the environment, the NAD's config on
// stdin with the pod's addresses from its network annotation as runtimeConfig
// ips (static IPAM), run in the node's namespace.
type Pod struct {
	NS *NetNS
	// Name is the pod's name; IfName its link's (net1, as Multus names the
	// first extra network).
	Name, IfName string
	node         *NetNS
	conf         []byte
	id           string
	deleted      bool
}

// NAD is the macvlan NetworkAttachmentDefinition's config for master, as
// the seeds' 10-nad-vlan50.yaml has it: bridge mode, static IPAM, each
// pod's address from its annotation, the default routes via gw4 (and gw6
// when set).
func NAD(master, gw4, gw6 string) map[string]any {
	routes := []map[string]string{{"dst": "0.0.0.0/0", "gw": gw4}}
	if gw6 != "" {
		routes = append(routes, map[string]string{"dst": "::/0", "gw": gw6})
	}
	return map[string]any{
		"cniVersion":   "0.3.1",
		"name":         "vlan50",
		"type":         "macvlan",
		"master":       master,
		"mode":         "bridge",
		"capabilities": map[string]bool{"ips": true},
		"ipam":         map[string]any{"type": "static", "routes": routes},
	}
}

// AttachPod makes a namespace for pod name and attaches it to the NAD nad
// (NAD) in node's namespace with CNI ADD, its addresses ips
// (10.10.50.10/24, ...). CNI DEL runs when the test ends unless Del ran.
func AttachPod(t testing.TB, node *NetNS, nad map[string]any, name string, ips ...string) *Pod {
	t.Helper()
	RequireCNI(t)
	ns := NewNetNS(t)
	// The pod's own IPv6 link-local address settles at once, so what the
	// tests compare of the pod does not change by itself.
	for _, k := range []string{"all", "default"} {
		ns.Host.Do(func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/accept_dad", []byte("0"), 0o644)
		})
	}
	conf := map[string]any{}
	for k, v := range nad {
		conf[k] = v
	}
	conf["runtimeConfig"] = map[string]any{"ips": ips}
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	var id [16]byte
	rand.Read(id[:])
	p := &Pod{NS: ns, Name: name, IfName: "net1", node: node, conf: b, id: hex.EncodeToString(id[:])}
	out, err := p.cni("ADD")
	if err != nil {
		t.Fatalf("CNI ADD of pod %s: %v\n%s", name, err, out)
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != len(ips) {
		t.Fatalf("CNI ADD of pod %s: result %s (%v), want %d addresses", name, out, err, len(ips))
	}
	t.Cleanup(func() {
		if !p.deleted {
			p.cni("DEL")
		}
	})
	return p
}

// Del runs CNI DEL for the pod, as the kubelet does when the pod goes.
func (p *Pod) Del(t testing.TB) {
	t.Helper()
	if out, err := p.cni("DEL"); err != nil {
		t.Fatalf("CNI DEL of pod %s: %v\n%s", p.Name, err, out)
	}
	p.deleted = true
}

// cni runs the macvlan plugin with command in the node's namespace.
func (p *Pod) cni(command string) ([]byte, error) {
	cmd := exec.Command("ip", "netns", "exec", p.node.Name, filepath.Join(CNIDir, "macvlan"))
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=" + p.id,
		"CNI_NETNS=/run/netns/" + p.NS.Name,
		"CNI_IFNAME=" + p.IfName,
		"CNI_PATH=" + CNIDir,
		"CNI_ARGS=IgnoreUnknown=true;K8S_POD_NAMESPACE=downloads;K8S_POD_NAME=" + p.Name + ";K8S_POD_INFRA_CONTAINER_ID=" + p.id,
	}
	cmd.Stdin = bytes.NewReader(p.conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return append(stdout.Bytes(), stderr.Bytes()...), fmt.Errorf("%s: %w", command, err)
	}
	return stdout.Bytes(), nil
}

// State is the pod's links, addresses and routes (IPv4 and IPv6) as ip(8)
// prints them, for comparing before and after.
func (p *Pod) State(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"ip", "-d", "link", "show"}, {"ip", "addr", "show"},
		{"ip", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"},
	} {
		b.WriteString("$ " + strings.Join(args, " ") + "\n")
		b.WriteString(p.NS.Exec(t, args...))
	}
	return b.String()
}
