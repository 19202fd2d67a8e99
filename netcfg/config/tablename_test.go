package config

import (
	"strings"
	"testing"
)

// TestRuleTableByName: a rule's table may be written as the name of a
// table in routing.tables (as the example's comment promises), or main,
// default or local; the rule gets that table's id.
func TestRuleTableByName(t *testing.T) {
	src := `routing:
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: vlan50-egress}
    - {priority: 1001, from: 10.10.51.0/24, table: main}
    - {priority: 1002, from: 10.10.52.0/24, table: "150"}
    - {priority: 1003, from: 10.10.53.0/24, table: 150}
  tables:
    - {id: 150, name: vlan50-egress, routes: [{to: default, dev: lo}]}
`
	c, err := Parse(testFile, []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, r := range c.Routing.Rules {
		got = append(got, r.Table)
	}
	if want := []int{150, 254, 150, 150}; !equalInts(got, want) {
		t.Errorf("tables %v, want %v", got, want)
	}
	if l := c.Lines["routing.rules[0].table"]; l != 3 {
		t.Errorf("line of routing.rules[0].table: %d, want 3", l)
	}

	tests := []struct {
		name, src, want string
	}{
		{"unknown name", "routing:\n  tables:\n    - {id: 150, name: vlan50-egress}\n  rules:\n    - {priority: 1000, table: vlan50-egres}\n",
			`nodeagent.yaml:5: routing.rules[0].table: no table is named "vlan50-egres"; use the id or name of a table in routing.tables, or main, default or local (did you mean "vlan50-egress"?)`},
		{"no tables", "routing:\n  rules:\n    - {priority: 1000, table: egress}\n",
			`nodeagent.yaml:3: routing.rules[0].table: no table is named "egress"`},
		{"a list is no table", "routing:\n  rules:\n    - {priority: 1000, table: [150]}\n",
			`nodeagent.yaml:3: routing.rules[0].table: expected an integer, got a list`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(testFile, []byte(tt.src))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want %q", err, tt.want)
			}
			if err != nil && strings.Count(err.Error(), "\n") > 0 {
				t.Errorf("one mistake, several errors:\n%v", err)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRuleFwMarkSpelling: a rule's mark is fwMark, as a WireGuard
// device's is; fwmark, the old spelling, still reads the same, and both
// at once are a duplicate.
func TestRuleFwMarkSpelling(t *testing.T) {
	for _, key := range []string{"fwMark", "fwmark"} {
		c, err := Parse(testFile, []byte("routing:\n  rules:\n    - {priority: 1, "+key+": 0x10/0xff, table: main}\n"))
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if got := c.Routing.Rules[0].FwMark; got != "0x10/0xff" {
			t.Errorf("%s: FwMark %q", key, got)
		}
		if l := c.Lines["routing.rules[0].fwMark"]; l != 3 {
			t.Errorf("%s: line of routing.rules[0].fwMark: %d, want 3", key, l)
		}
	}
	_, err := Parse(testFile, []byte("routing:\n  rules:\n    - priority: 1\n      fwMark: 0x10\n      fwmark: 0x20\n      table: main\n"))
	if err == nil || !strings.Contains(err.Error(), "nodeagent.yaml:5: routing.rules[0].fwMark: duplicate key: fwmark is the old spelling of fwMark, which is set on line 4") {
		t.Errorf("both spellings: got %v", err)
	}
}
