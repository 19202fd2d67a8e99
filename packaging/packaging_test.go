// Package packaging holds the .deb's build files; its tests check what
// ships in it: the default config, the unit, and (as root, in a VM running
// real systemd) the package itself.
package packaging

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/lint"
)

// TestDefaultConfigIsInert checks the packaged /etc/nodeagent/nodeagent.yaml:
// it validates, and plan on this host says "no changes", so installing and
// starting the package changes nothing until the operator edits it.
func TestDefaultConfigIsInert(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nodeagent")
	}
	bin := filepath.Join(t.TempDir(), "nodeagent")
	build := exec.Command("go", "build", "-o", bin, "../cmd/nodeagent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"validate"}, {"plan"}} {
		cmd := exec.Command(bin, append(args, "-c", "etc/nodeagent.yaml")...)
		cmd.Env = append(os.Environ(), "NODEAGENT_RT_TABLES="+filepath.Join(t.TempDir(), "rt.conf"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("nodeagent %s: %v\n%s%s", args[0], err, stdout.String(), stderr.String())
		}
		want := map[string]string{"validate": "etc/nodeagent.yaml: valid\n", "plan": "no changes\n"}[args[0]]
		if stdout.String() != want {
			t.Errorf("nodeagent %s on the default config printed %q, want %q (stderr %q)", args[0], stdout.String(), want, stderr.String())
		}
	}
}

// TestUnitHardening keeps the hardening of systemd/nodeagent.service that
// the VM test proves workable from being dropped by accident.
func TestUnitHardening(t *testing.T) {
	b, err := os.ReadFile("../systemd/nodeagent.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, want := range []string{
		"Type=notify", "WatchdogSec=", "Restart=on-failure", "ExecReload=/usr/bin/nodeagentctl reload",
		"RuntimeDirectory=nodeagent", "RuntimeDirectoryMode=0750", "StateDirectory=nodeagent", "StateDirectoryMode=0700",
		"After=network-pre.target", "Before=network-online.target",
		"CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW\n", "NoNewPrivileges=yes", "ProtectSystem=strict",
		"ProtectHome=yes", "PrivateTmp=yes", "ProtectKernelModules=yes",
		"RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6 AF_PACKET\n",
		"SystemCallFilter=@system-service", "LockPersonality=yes", "MemoryDenyWriteExecute=yes",
		"ReadWritePaths=/etc/iproute2/rt_tables.d", " -/etc/nodeagent/peers.d\n",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("systemd/nodeagent.service lacks %q", want)
		}
	}
}

// TestDefaultConfigSketch: the commented sketch in the shipped config,
// uncommented, validates and draws no warning (the pods' gateway on the
// shim, not on the VLAN).
func TestDefaultConfigSketch(t *testing.T) {
	b, err := os.ReadFile("etc/nodeagent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sketch []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		in = in || strings.HasPrefix(l, "# node:")
		if in {
			sketch = append(sketch, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
		}
	}
	c, err := config.ParseWith("sketch.yaml", []byte(strings.Join(sketch, "\n")), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatalf("the sketch does not validate: %v\n%s", err, strings.Join(sketch, "\n"))
	}
	if len(c.VLANs) == 0 || len(c.Macvlans) == 0 {
		t.Fatalf("the sketch lost its VLAN or shim: %+v %+v", c.VLANs, c.Macvlans)
	}
	for _, w := range lint.Check(c) {
		t.Errorf("the sketch warns: %v", w)
	}
}
