package config

import (
	"os"
	"strings"
	"testing"
)

// TestRootCauseFirst: a mistake that the PIA routing check follows from
// (a misspelt key in the routing, a misspelt section) is the only error
// reported: the check's consequences, which sit above it in the file,
// are held back until it is fixed, so the first line printed is the one
// to fix.
func TestRootCauseFirst(t *testing.T) {
	example, err := os.ReadFile("../../examples/homelab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"misspelt killSwitch", "      killSwitch: true\n", "      killswitch: true\n", `routing.tables[0].killswitch: unknown field (did you mean "killSwitch"?)`},
		{"misspelt routing", "\nrouting:\n", "\nroutng:\n", `routng: unknown field (did you mean "routing"?)`},
		{"killSwitch not a bool", "      killSwitch: true\n", "      killSwitch: yes\n", `routing.tables[0].killSwitch: expected true or false, got "yes"`},
		{"rule to an undeclared table", "      table: 150 ", "      table: 151 ", `routing.rules[0].table`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.Count(string(example), tt.old) != 1 {
				t.Fatalf("the example does not hold %q once", tt.old)
			}
			src := strings.Replace(string(example), tt.old, tt.new, 1)
			_, err := ParseWith(testFile, []byte(src), Options{SkipFileChecks: true})
			if err == nil {
				t.Fatal("no error")
			}
			lines := strings.Split(err.Error(), "\n")
			if !strings.Contains(lines[0], tt.want) {
				t.Errorf("first error %q, want %q", lines[0], tt.want)
			}
			for _, l := range lines {
				if strings.Contains(l, "routed through the tunnel") {
					t.Errorf("a consequence is reported beside its cause: %s", l)
				}
			}
		})
	}
	// Without a root cause the check still speaks.
	src := strings.Replace(string(example), "      killSwitch: true\n", "      killSwitch: false\n", 1)
	if _, err := ParseWith(testFile, []byte(src), Options{SkipFileChecks: true}); err == nil || !strings.Contains(err.Error(), "portForward.to: 10.10.50.10 is not in a subnet routed through the tunnel") {
		t.Errorf("a table without its kill switch: want the routing check's error, got %v", err)
	}
}
