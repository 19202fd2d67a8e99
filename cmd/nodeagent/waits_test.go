package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
)

// TestApplyOnceFailsOnMistypedParent: apply --once has no later sync to
// wait for, so an object on a parent that does not exist, and that the
// config does not create, fails it (exit 1) with a suggestion, while what
// waits for a link the config makes is not reported.
func TestApplyOnceFailsOnMistypedParent(t *testing.T) {
	node, peer := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "enp1s0", peer, "eth0")
	bin := binary(t)
	t.Setenv("NODEAGENT_RT_TABLES", filepath.Join(t.TempDir(), "nodeagent.conf"))
	cfg := filepath.Join(t.TempDir(), "nodeagent.yaml")
	if err := os.WriteFile(cfg, []byte("dad: {disabled: true}\nmacvlans:\n  - {name: shim1, parent: enp1s9, addresses: [10.10.50.4/24]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := node.TryExec(bin, "apply", "--once", "-c", cfg)
	if err == nil || !strings.Contains(out, "link shim1 wait(s) for enp1s9, which does not exist and which the config does not create; did you mean enp1s0?") {
		t.Fatalf("apply --once on a mistyped parent: %v\n%s", err, out)
	}
}

// TestValidateRefusesAnEmptyFile: what `: > nodeagent.yaml` or a full disk
// leaves is not a valid config (it used to be, and the daemon applied it
// as "nothing"); comments alone, or {}, are.
func TestValidateRefusesAnEmptyFile(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]int{"": 1, " \n\n": 1, "# nothing yet\n": 0, "{}\n": 0} {
		cfg := filepath.Join(dir, "nodeagent.yaml")
		os.WriteFile(cfg, []byte(body), 0o600)
		var out, errb strings.Builder
		code := run([]string{"validate", "-c", cfg, "--state-dir", dir}, &out, &errb)
		if code != want || (want == 1 && !strings.Contains(errb.String(), cfg+":1: the file is empty")) {
			t.Errorf("validate of %q: exit %d (want %d)\n%s%s", body, code, want, out.String(), errb.String())
		}
	}
}
