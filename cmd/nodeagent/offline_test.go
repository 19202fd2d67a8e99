package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// lineOf is the 1-based number of the first line of text holding s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("no line holds %q", s)
	return 0
}

// TestValidateOffline is issue 45's acceptance item 5: validate --offline
// passes the shipped example as it is in the repository on any machine,
// reading none of the files it names (they are not on a CI runner, nor
// under /etc/nodeagent here); a typo'd field, a value out of range and a
// reference to a table the config does not have each fail offline at
// their line; --offline belongs to validate alone.
func TestValidateOffline(t *testing.T) {
	const example = "../../examples/homelab.yaml"
	text, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	validate := func(args ...string) (code int, stdout, stderr string) {
		var out, errb bytes.Buffer
		code = run(append([]string{"validate"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}

	// The example as shipped.
	if code, out, errs := validate("--offline", "-c", example); code != 0 || !strings.Contains(out, example+": valid (offline") || errs != "" {
		t.Fatalf("validate --offline of the example: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}

	// The example with every file it names moved to a directory that
	// does not exist: validate reads them and fails at each line,
	// --offline reads none of them and passes.
	dir := t.TempDir()
	gone := filepath.Join(dir, "gone")
	moved := strings.NewReplacer("/etc/nodeagent/", gone+"/", "/var/lib/rancher/", gone+"/", "/usr/local/sbin/", gone+"/").Replace(string(text))
	cfg := filepath.Join(dir, "homelab.yaml")
	os.WriteFile(cfg, []byte(moved), 0o644)
	code, _, errs := validate("-c", cfg, "--state-dir", filepath.Join(dir, "state"))
	// Each file at the line of the key that names it (a comment above
	// may name the same path).
	for f, key := range map[string]string{"keys/wg0.key": "privateKeyFile: ", "pia.cred": "credentialsFile: ", "qbittorrent-port": "onChange: ["} {
		want := fmt.Sprintf("%s:%d: ", cfg, lineOf(t, moved, key+gone+"/"+f))
		if code != 1 || !strings.Contains(errs, want) || !strings.Contains(errs, gone+"/"+f+" does not exist") {
			t.Errorf("validate (online) of the example without its files: exit %d, want 1 and %q naming %s:\n%s", code, want, f, errs)
		}
	}
	if code, out, errs := validate("--offline", "-c", cfg, "--state-dir", filepath.Join(dir, "state")); code != 0 || !strings.Contains(out, cfg+": valid (offline") {
		t.Errorf("validate --offline of the example without its files: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}

	// Mistakes the config alone shows, each at its line.
	for _, c := range []struct{ name, from, to, field, msg string }{
		{"a typo'd field", "listenPort: 51820", "listenPortt: 51820", "wireguard[1].listenPortt", `unknown field (did you mean "listenPort"?)`},
		{"a VLAN id out of range", "id: 50 ", "id: 4095 ", "vlans[0].id", "4095 is outside 1-4094"},
		{"a rule's table the config does not have", "table: 150           #", "table: 151           #", "routing.rules[0].table", "151"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(string(text), c.from) {
				t.Fatalf("the example has no %q", c.from)
			}
			bad := strings.Replace(string(text), c.from, c.to, 1)
			file := filepath.Join(dir, "bad.yaml")
			os.WriteFile(file, []byte(bad), 0o644)
			want := fmt.Sprintf("%s:%d: %s: ", file, lineOf(t, bad, c.to), c.field)
			code, out, errs := validate("--offline", "-c", file)
			if code != 1 || !strings.Contains(errs, want) || !strings.Contains(errs, c.msg) || strings.Contains(out, "valid") {
				t.Errorf("exit %d\nstdout: %s\nstderr: %s\nwant exit 1 and %q ... %q", code, out, errs, want, c.msg)
			}
		})
	}

	var out, errb bytes.Buffer
	if code := run([]string{"plan", "--offline", "-c", example}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--offline is for validate") {
		t.Errorf("plan --offline: exit %d, stderr %q", code, errb.String())
	}
}

// TestValidateOfflineWithoutEtc: validate --offline of the shipped example
// in a mount namespace whose /etc and /var/lib are empty: a machine with
// no /etc/nodeagent, no k3s and no state, as a CI runner is.
func TestValidateOfflineWithoutEtc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it mounts empty directories over /etc and /var/lib in a mount namespace of its own")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	bin := binary(t)
	example, err := filepath.Abs("../../examples/homelab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs none /etc && mount -t tmpfs none /var/lib && test ! -e /etc/nodeagent && exec "$0" validate --offline -c "$1"`,
		bin, example).CombinedOutput()
	if err != nil || !strings.Contains(string(out), example+": valid (offline") {
		t.Fatalf("validate --offline with /etc and /var/lib empty: %v\n%s", err, out)
	}
	// The same namespace, without --offline: the files are missing.
	out, err = exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs none /etc && mount -t tmpfs none /var/lib && exec "$0" validate -c "$1"`,
		bin, example).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "/etc/nodeagent/pia.cred does not exist") {
		t.Errorf("validate with /etc and /var/lib empty: %v\n%s", err, out)
	}
}
