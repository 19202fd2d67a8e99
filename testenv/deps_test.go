package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// depsWanted runs deps.sh for what with a dpkg-query that finds nothing
// installed and an id that is not root, so it only names the packages it
// would install.
func depsWanted(t *testing.T, what string) []string {
	t.Helper()
	bin := t.TempDir()
	for name, body := range map[string]string{"dpkg-query": "exit 1", "id": "echo 1000"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "deps.sh", what)
	cmd.Env = append(os.Environ(), "PATH="+bin+":/usr/bin:/bin")
	out, _ := cmd.CombinedOutput()
	_, list, ok := strings.Cut(strings.TrimSpace(string(out)), "root to install them: ")
	if !ok {
		t.Fatalf("deps.sh %s:\n%s", what, out)
	}
	return strings.Fields(list)
}

// make demo installs what the demo runs and nothing else: not the
// prometheus package, whose server Debian would start now and at every
// boot, nor tcpdump. The tests get both.
func TestDemoDepsOnlyWhatItRuns(t *testing.T) {
	demo, test := strings.Join(depsWanted(t, "demo"), " "), strings.Join(depsWanted(t, "test"), " ")
	for _, p := range []string{"prometheus", "tcpdump", "qemu-system-x86"} {
		if strings.Contains(demo, p) {
			t.Errorf("make demo installs %s: %s", p, demo)
		}
	}
	for _, p := range []string{"iproute2", "nftables", "wireguard-tools", "iputils-ping", "containernetworking-plugins"} {
		if !strings.Contains(demo, p) {
			t.Errorf("make demo lacks %s: %s", p, demo)
		}
	}
	for _, p := range []string{"prometheus", "tcpdump", "containernetworking-plugins", "etcd-server"} {
		if !strings.Contains(test, p) {
			t.Errorf("make test lacks %s: %s", p, test)
		}
	}
}
