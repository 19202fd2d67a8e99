package packaging

import (
	"os"
	"strings"
	"testing"
)

// TestLicense: the project is Apache-2.0, and says so in LICENSE, in the
// package's DEP-5 copyright file (pointing at Debian's copy of the text)
// and in the package's metadata.
func TestLicense(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if l := read("../LICENSE"); !strings.Contains(l, "Apache License\n                           Version 2.0, January 2004") ||
		!strings.Contains(l, "END OF TERMS AND CONDITIONS") {
		t.Error("LICENSE is not the Apache License 2.0 text")
	}
	c := read("copyright")
	for _, want := range []string{
		"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n",
		"\nFiles: *\n", "\nLicense: Apache-2.0\n", "/usr/share/common-licenses/Apache-2.0",
	} {
		if !strings.Contains(c, want) {
			t.Errorf("packaging/copyright lacks %q", want)
		}
	}
	if strings.Contains(c, "unspecified") {
		t.Error("packaging/copyright still says the license is unspecified")
	}
	if !strings.Contains(read("nfpm.yaml"), "\nlicense: Apache-2.0\n") {
		t.Error("packaging/nfpm.yaml does not name Apache-2.0")
	}
}

// TestPurgeKeepsOperatorFiles: postrm never removes /etc/nodeagent whole
// (it holds the operator's private keys and peer files); the package VM
// test proves what a purge keeps.
func TestPurgeKeepsOperatorFiles(t *testing.T) {
	b, err := os.ReadFile("scripts/postrm")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "rm" && strings.Contains(line, "/etc/nodeagent") &&
			!strings.Contains(line, "nodeagent.yaml.dpkg-") {
			t.Errorf("postrm removes operator files: %s", strings.TrimSpace(line))
		}
	}
}
