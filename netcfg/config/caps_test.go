package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestConfigErrorsAreCapped: a main config that expands to a million
// errors is reported in at most MaxConfigErrors lines and a count.
func TestConfigErrorsAreCapped(t *testing.T) {
	cfg := billionErrors()
	_, err := Parse("nodeagent.yaml", []byte(cfg))
	list, _ := err.(ErrorList)
	if len(list) != MaxConfigErrors+1 || !strings.Contains(list[len(list)-1].Msg, "more error(s)") {
		t.Errorf("%d-byte config: %d errors (want %d), last %v", len(cfg), len(list), MaxConfigErrors+1, list[len(list)-1])
	}
	t.Logf("%d-byte config: %d error lines, last %q", len(cfg), len(list), list[len(list)-1])
}

// billionErrors is a small config whose aliases expand to about a million
// unknown fields: a mapping of 330 of them, aliased by 3030 VLANs.
func billionErrors() string {
	var b strings.Builder
	b.WriteString("x: &a {")
	for i := range 330 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "u%d: 1", i)
	}
	b.WriteString("}\nvlans: [")
	for i := range 3030 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("*a")
	}
	b.WriteString("]\n")
	return b.String()
}
