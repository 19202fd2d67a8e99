package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"mtu", "mtu", 0},
		{"mtuu", "mtu", 1},
		{"mut", "mtu", 1},
		{"tabel", "table", 1},
		{"fwmark", "fwMark", 1},
		{"ab", "ba", 1},
		{"abc", "ca", 3},
		{"kitten", "sitting", 3},
	}
	for _, tt := range tests {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

// TestSuggestSwappedLetters: two letters swapped are one typo, so a
// five-letter key gets its suggestion.
func TestSuggestSwappedLetters(t *testing.T) {
	tests := []struct {
		got  string
		want string
	}{
		{"tabel", "table"},
		{"prioirty", "priority"},
		{"aciton", "action"},
		{"mtuu", "mtu"},
		{"up", ""},
	}
	names := fieldNames(reflect.TypeFor[Rule]())
	names = append(names, "mtu")
	for _, tt := range tests {
		if got := suggest(tt.got, names); got != tt.want {
			t.Errorf("suggest(%q) = %q, want %q", tt.got, got, tt.want)
		}
	}
	_, err := Parse(testFile, []byte("routing:\n  rules:\n    - priority: 1000\n      from: 10.10.50.0/24\n      tabel: 150\n"))
	if err == nil || !strings.Contains(err.Error(), `nodeagent.yaml:5: routing.rules[0].tabel: unknown field (did you mean "table"?)`) {
		t.Errorf("tabel: got %v", err)
	}
}
