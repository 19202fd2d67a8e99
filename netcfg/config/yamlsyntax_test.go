package config

import (
	"os"
	"strings"
	"testing"
)

// TestYAMLSyntaxErrorLine: a YAML syntax error is reported at the line of
// the token that caused it, as PyYAML reports it, not where the enclosing
// block began or at the comment above it.
func TestYAMLSyntaxErrorLine(t *testing.T) {
	example, err := os.ReadFile("../../examples/homelab.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The example with one list item indented a space too far: the
	// comments above it must not take the blame.
	item := "  - name: wg0\n"
	at := strings.Index(string(example), item)
	if at < 0 {
		t.Fatalf("the example has no %q", item)
	}
	itemLine := strings.Count(string(example[:at]), "\n") + 1
	shifted := string(example[:at]) + " " + string(example[at:])

	tests := []struct {
		name string
		src  string
		line int
		msg  string
	}{
		{"item indented one space too far in the example", shifted, itemLine, "did not find expected '-' indicator"},
		{"key indented one space too few, below comments",
			"vlans:\n  # the download VLAN\n  # (a second comment)\n  - name: a\n    parent: b\n   id: 3\n", 6, "did not find expected '-' indicator"},
		{"key indented one space too few after a blank line",
			"node:\n  name: a\n  # c\n\n dad: {}\n", 5, "did not find expected key"},
		{"key indented too far", "vlans:\n  - name: a\n    parent: b\n      id: 3\n", 4, "mapping values are not allowed"},
		{"tab indenting a list item's key", "vlans:\n  - name: a\n\tparent: b\n", 3, "tab"},
		{"tab after spaces in a list item", "vlans:\n  - name: a\n    # comment\n    parent: b\n\t  id: 3\n", 5, "tab"},
		{"tab after blank lines", "vlans:\n  - name: a\n    parent: b\n\n\n\n\t id: 3\n", 7, "tab"},
		{"tab at the top level after blank lines", "node:\n  name: a\n\n\n\n\n\tdad: {}\n", 7, "tab"},
		{"tab starting a line", "dad: {}\n# comment\n\tnode: {}\n", 3, "a tab indents this line; YAML indents with spaces only"},
		{"a mapping inside a list", "vlans:\n  - name: a\n  parent: b\n", 3, "did not find expected '-' indicator"},
		{"a value after a value", "node: name: a\n", 1, "mapping values are not allowed"},
		{"unclosed flow list", "vlans: [a, b\ndad: {}\n", 1, "did not find expected ',' or ']'"},
		{"unknown anchor", "dad: {}\nvlans: *nope\n", 2, "unknown anchor"},
		{"error in a second document", "dad: {}\n---\nnode:\n  name: a\n   x: 1\n", 5, "mapping values are not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(testFile, []byte(tt.src))
			var list ErrorList
			if !asList(err, &list) || len(list) != 1 {
				t.Fatalf("want one error, got %v", err)
			}
			e := list[0]
			if e.Line != tt.line || !strings.HasPrefix(e.Msg, "invalid YAML: ") || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("got %q (line %d), want line %d and %q", e.Error(), e.Line, tt.line, tt.msg)
			}
		})
	}
}

func asList(err error, l *ErrorList) bool {
	el, ok := err.(ErrorList)
	*l = el
	return ok
}
