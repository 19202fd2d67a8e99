package packaging

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestDependsOnWhatTheREADMERuns: the README's steps make the keys with
// wg (wg genkey | wg pubkey), so the package that ships wg is a Depends of
// the .deb, not a Recommends that apt may leave out
// (--no-install-recommends, or APT::Install-Recommends "false"). Which
// package ships /usr/bin/wg is dpkg's answer where wg is installed.
func TestDependsOnWhatTheREADMERuns(t *testing.T) {
	b, err := os.ReadFile("nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Depends    []string `yaml:"depends"`
		Recommends []string `yaml:"recommends"`
	}
	if err := yaml.Unmarshal(b, &pkg); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The commands of the README's fenced shell blocks.
	var shell strings.Builder
	for _, m := range regexp.MustCompile("(?ms)^```(?:sh|bash|console)\n(.*?)^```").FindAllSubmatch(readme, -1) {
		shell.Write(m[1])
	}
	if !regexp.MustCompile(`(^|[\s|;&('])wg (genkey|pubkey|genpsk|show|showconf|set)\b`).MatchString(shell.String()) {
		t.Fatal("the README's shell blocks run no wg command: this test (and the Depends) should be revisited")
	}
	want := "wireguard-tools"
	if out, err := exec.Command("dpkg-query", "-S", "/usr/bin/wg").Output(); err == nil {
		// "wireguard-tools: /usr/bin/wg"
		want, _, _ = strings.Cut(strings.TrimSpace(string(out)), ":")
	} else {
		t.Logf("dpkg does not know /usr/bin/wg here (%v); taking its Debian package to be %s", err, want)
	}
	if !slices.Contains(pkg.Depends, want) {
		t.Errorf("nfpm.yaml: depends %v lacks %s, which ships the wg the README runs", pkg.Depends, want)
	}
	if slices.Contains(pkg.Recommends, want) {
		t.Errorf("nfpm.yaml: %s is a Recommends; it is a Depends only", want)
	}
}
