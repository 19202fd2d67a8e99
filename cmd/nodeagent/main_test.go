package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/agent"
	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestValidateExitCodes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("vlans:\n  - name: enp1s0.50\n    parent: enp1s0\n    id: 4095\n    mtuu: 1500\n"), 0o600)
	example := exampleWithFiles(t, dir)
	tests := []struct {
		args     []string
		code     int
		wantOut  string
		wantErrs []string
	}{
		{[]string{"validate", "-c", example}, 0, example + ": valid", nil},
		{[]string{"validate", "-c", bad}, 1, "", []string{bad + ":4: vlans[0].id: 4095 is outside 1-4094", bad + `:5: vlans[0].mtuu: unknown field`}},
		{[]string{"validate", "-c", filepath.Join(dir, "missing.yaml")}, 1, "", []string{"missing.yaml does not exist"}},
		{[]string{"regions", "--state-dir", filepath.Join(dir, "state")}, 1, "", []string{"no PIA server list is cached under " + filepath.Join(dir, "state", "pia")}},
		{[]string{"frobnicate"}, 2, "", []string{`unknown command "frobnicate"`}},
		{[]string{"apply"}, 2, "", []string{"apply needs --once"}},
		{[]string{"--help"}, 0, "nodeagent apply --once", nil},
		{[]string{"version"}, 0, "nodeagent dev", nil},
		{[]string{"--version"}, 0, "nodeagent dev", nil},
		{[]string{"help"}, 0, "nodeagent apply --once", nil},
		// A stray argument is refused, not ignored while the default
		// config is judged; the message says how to name the file.
		{[]string{"validate", bad}, 2, "", []string{"validate takes no arguments", "nodeagent validate -c " + bad}},
		{[]string{"plan", "-c", bad, "cases/02.yaml"}, 2, "", []string{`plan takes no arguments, got ["cases/02.yaml"]`}},
		{[]string{"validate", "-config", bad}, 2, "", []string{"-config: a long flag takes two dashes: --config (or -c)"}},
		{[]string{"apply", "-once", "-c", bad}, 2, "", []string{"-once: a long flag takes two dashes: --once"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tt.args, &out, &errb); code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("stdout %q lacks %q", out.String(), tt.wantOut)
			}
			for _, w := range tt.wantErrs {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr %q lacks %q", errb.String(), w)
				}
			}
		})
	}
}

// TestApplyOnceRefusesPIA: a PIA tunnel needs the daemon's provider to
// stay registered; apply --once refuses it before changing anything.
func TestApplyOnceRefusesPIA(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"apply", "--once", "-c", "../../examples/homelab.yaml"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "wireguard wg-pia: a PIA tunnel is registered and kept healthy by the daemon (nodeagent run)") || !strings.Contains(errb.String(), "nothing applied") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

// TestCLIInNamespace runs the real binary inside a namespace: apply --once,
// a no-op re-apply, a failure naming its object, and teardown.
func TestCLIInNamespace(t *testing.T) {
	node := testenv.NewNetNS(t)
	peer := testenv.NewNetNS(t)
	node.Veth(t, "enp1s0", peer, "eth0")
	bin := binary(t)
	cfg := filepath.Join(t.TempDir(), "nodeagent.yaml")
	// Never the host's /etc: the namespace is the test's, the file system is not.
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(t.TempDir(), "nodeagent.conf"))
	write := func(s string) { os.WriteFile(cfg, []byte(s), 0o600) }
	write("dad: {probes: 1, interval: 10ms, wait: 100ms}\nmacvlans:\n  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}\n")

	out := node.Exec(t, bin, "plan", "-c", cfg)
	if out != "+ link shim0 (macvlan bridge on enp1s0, up)\n+ address 10.10.50.3/24 on shim0\n" {
		t.Fatalf("plan:\n%s", out)
	}
	node.Exec(t, bin, "apply", "--once", "-c", cfg)
	if out := node.Exec(t, "ip", "-br", "addr", "show", "dev", "shim0"); !strings.Contains(out, "10.10.50.3/24") {
		t.Fatalf("shim0 after apply: %s", out)
	}
	if out := node.Exec(t, bin, "apply", "--once", "-c", cfg); !strings.Contains(out, "no changes") {
		t.Fatalf("second apply: %s", out)
	}
	// Two objects that cannot be converged: both are named, exit 1.
	write("macvlans:\n  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}\n  - {name: shim1, parent: nosuch0}\n  - {name: enp1s0, parent: lo}\n")
	out, err := node.TryExec(bin, "apply", "--once", "-c", cfg)
	if err == nil || !strings.Contains(out, "link shim1: pending: parent nosuch0 does not exist") ||
		!strings.Contains(out, "link enp1s0: exists and was not created by nodeagent") {
		t.Fatalf("want both failures named, got %v:\n%s", err, out)
	}
	node.Exec(t, bin, "teardown")
	if out, _ := node.TryExec("ip", "link", "show", "shim0"); !strings.Contains(out, "does not exist") {
		t.Fatalf("shim0 after teardown: %s", out)
	}
	if out := node.Exec(t, "ip", "link", "show", "enp1s0"); !strings.Contains(out, "enp1s0") {
		t.Fatalf("teardown removed the trunk: %s", out)
	}
}

// TestReleaseCLI runs the real binary's release inside a namespace: a
// macvlan made by hand and adopted, and a shim nodeagent made; --dry-run
// prints both and changes nothing; release hands the adopted link back
// (there, no alias) and deletes the shim; the release flags are refused on
// other commands.
func TestReleaseCLI(t *testing.T) {
	node := testenv.NewNetNS(t)
	peer := testenv.NewNetNS(t)
	node.Veth(t, "enp1s0", peer, "eth0")
	bin := binary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "nodeagent.yaml")
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
	node.Exec(t, "ip", "link", "add", "link", "enp1s0", "name", "old0", "type", "macvlan", "mode", "bridge")
	os.WriteFile(cfg, []byte("dad: {disabled: true}\nmacvlans:\n  - {name: old0, parent: enp1s0, adopt: true}\n  - {name: shim0, parent: enp1s0, addresses: [10.10.50.3/24]}\n"), 0o600)
	node.Exec(t, bin, "apply", "--once", "-c", cfg, "--state-dir", dir)
	flags := []string{"--lock", filepath.Join(dir, "lock"), "--state-dir", dir, "--etc", filepath.Join(dir, "etc"), "--socket", filepath.Join(dir, "s.sock")}
	out := node.Exec(t, append([]string{bin, "release", "--dry-run", "-c", cfg}, flags...)...)
	plan := "~ link old0 (macvlan on enp1s0) hand back: unmark it; it stays as it is: nothing under /etc makes it now\n- link shim0 (macvlan on enp1s0)\n"
	if !strings.HasPrefix(out, plan+"dry run: nothing changed\n") {
		t.Fatalf("release --dry-run:\n%s\nwant it to begin:\n%s", out, plan)
	}
	if a := node.Exec(t, "cat", "/sys/class/net/old0/ifalias"); strings.TrimSpace(a) != "nodeagent" {
		t.Fatalf("the dry run unmarked old0: %q", a)
	}
	out = node.Exec(t, append([]string{bin, "release", "-c", cfg}, flags...)...)
	if !strings.HasPrefix(out, plan) || !strings.Contains(out, "\nnote: old0 (macvlan) is handed back as it is, and nothing under /etc makes it") {
		t.Errorf("release:\n%s", out)
	}
	if a := node.Exec(t, "cat", "/sys/class/net/old0/ifalias"); strings.TrimSpace(a) != "" {
		t.Errorf("old0 after release: alias %q", a)
	}
	if out, _ := node.TryExec("ip", "link", "show", "shim0"); !strings.Contains(out, "does not exist") {
		t.Errorf("shim0 after release: %s", out)
	}
	for _, args := range [][]string{{"plan", "--dry-run"}, {"teardown", "--in-place"}, {"validate", "--etc", dir}} {
		var o, e bytes.Buffer
		if code := run(append(args, "-c", cfg), &o, &e); code != 2 || !strings.Contains(e.String(), "is for release only") {
			t.Errorf("nodeagent %s: exit %d, %s", strings.Join(args, " "), code, e.String())
		}
	}
}

// TestManPageCoversUsage keeps docs/nodeagent.8 in step with --help: every
// command and flag the usage names is in the man page.
func TestManPageCoversUsage(t *testing.T) {
	man, err := os.ReadFile("../../docs/nodeagent.8")
	if err != nil {
		t.Fatal(err)
	}
	page := strings.ReplaceAll(string(man), `\-`, "-")
	for _, word := range []string{"run", "validate", "plan", "regions", "apply --once", "teardown", "release", "--dry-run", "--in-place", "--etc", "version", "--config", "--once", "--help", "NODEAGENT_CONFIG", DefaultConfig, "--rt-tables", "NODEAGENT_RT_TABLES",
		"--socket", "NODEAGENT_SOCKET", api.DefaultSocket, "--metrics", "NODEAGENT_METRICS", "--resync", "--log-level", "NODEAGENT_LOG_LEVEL",
		"--lock", "NODEAGENT_LOCK", agent.DefaultLock, "--offline"} {
		if !strings.Contains(fmt.Sprintf(usage, DefaultConfig, agent.DefaultLock, api.DefaultSocket), word) {
			t.Errorf("usage lacks %q", word)
		}
		if !strings.Contains(page, word) {
			t.Errorf("man page lacks %q, which --help names", word)
		}
	}
}

// TestApplyOnceWireGuard runs the real binary on a WireGuard config: a
// world-readable key is refused before anything changes; where the kernel
// has WireGuard (the VM tier) apply --once creates the device and its peer,
// and a second apply logs zero netlink and zero WireGuard writes; where it
// has none, apply --once refuses the whole config, because the userspace
// implementation needs the long-running daemon to host it.
func TestApplyOnceWireGuard(t *testing.T) {
	node := testenv.NewNetNS(t)
	bin := binary(t)
	dir := t.TempDir()
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(dir, "nodeagent.conf"))
	k, _ := wgtypes.GeneratePrivateKey()
	peer, _ := wgtypes.GeneratePrivateKey()
	key := filepath.Join(dir, "wg0.key")
	os.WriteFile(key, []byte(k.String()+"\n"), 0o644)
	cfg := filepath.Join(dir, "nodeagent.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("wireguard:\n  - name: wg0\n    privateKeyFile: %s\n    listenPort: 51820\n    addresses: [10.90.0.1/24]\n    peers:\n      - {name: laptop, publicKey: %s, allowedIPs: [10.90.0.2/32]}\n", key, peer.PublicKey())), 0o600)
	var outputs []string
	defer func() {
		for _, o := range outputs {
			if strings.Contains(o, k.String()) {
				t.Errorf("the private key appears in nodeagent's output:\n%s", o)
			}
		}
	}()
	try := func(args ...string) (string, error) {
		out, err := node.TryExec(append([]string{bin}, args...)...)
		outputs = append(outputs, out)
		return out, err
	}
	out, err := try("apply", "--once", "-c", cfg)
	if err == nil || !strings.Contains(out, key+" is readable by group or others (mode 0644); chmod 600 it") {
		t.Fatalf("world-readable key: want refusal, got %v:\n%s", err, out)
	}
	if out, err := node.TryExec("ip", "link", "show", "wg0"); err == nil {
		t.Fatalf("wg0 exists after a refused apply:\n%s", out)
	}
	os.Chmod(key, 0o600)

	if !testenv.HasModule("wireguard") {
		out, err := try("apply", "--once", "-c", cfg)
		if err == nil || !strings.Contains(out, "wireguard wg0: the kernel has no WireGuard") || !strings.Contains(out, "nothing applied") {
			t.Fatalf("no kernel WireGuard: want the whole apply refused, got %v:\n%s", err, out)
		}
		if out, err := node.TryExec("ip", "link", "show", "wg0"); err == nil {
			t.Fatalf("wg0 exists after a refused apply:\n%s", out)
		}
		t.Log("kernel has no wireguard: the kernel path of this test runs in the VM tier")
		return
	}
	out, err = try("plan", "-c", cfg)
	if err != nil || !strings.Contains(out, "+ wireguard wg0 (kernel, public key "+k.PublicKey().String()) {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	if out, err := try("apply", "--once", "-c", cfg); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	show := node.Exec(t, "wg", "show", "wg0")
	if !strings.Contains(show, "peer: "+peer.PublicKey().String()) || !strings.Contains(show, "listening port: 51820") {
		t.Fatalf("wg show wg0:\n%s", show)
	}
	out, err = try("apply", "--once", "-c", cfg)
	if err != nil || !strings.Contains(out, "no changes") || !strings.Contains(out, "netlinkWrites=0 wireguardWrites=0") {
		t.Fatalf("second apply: want no changes and zero writes, got %v:\n%s", err, out)
	}
	// A start-up's staging device that a daemon which died left behind.
	if _, err := node.Host.LinkCreate(host.LinkSpec{Name: "nastg0dead0001", Kind: "wireguard", Group: host.StagingGroup}); err != nil {
		t.Fatal(err)
	}
	if out, err := try("teardown"); err != nil || !strings.Contains(out, "- wireguard wg0 (kernel)") {
		t.Fatalf("teardown: %v\n%s", err, out)
	}
	if out, err := node.TryExec("ip", "link", "show", "wg0"); err == nil {
		t.Fatalf("wg0 after teardown:\n%s", out)
	}
	if out, err := node.TryExec("ip", "link", "show", "nastg0dead0001"); err == nil {
		t.Fatalf("the leftover staging device after teardown:\n%s", out)
	}
}
